// Fees and gas: the minimum gas price, the fee paid in the ante step, the gas meter, Simulate,
// and the SDK's codes for their refusals.
#include "chain-bridge/module/chain_test_util.h"
#include "chain-bridge/module/gas.h"
#include "chain-bridge/module/tx_errors.h"

namespace ts::bridge::chain_test {
namespace {

constexpr char kMinGasPrice[] = "0.01";

uint32_t Code(SdkCode code) { return static_cast<uint32_t>(code); }

// A chain whose genesis asks 0.01 ngonka per unit of gas.
class FeeTest : public ChainTest {
 protected:
  void SetUp() override {
    genesis_ = MakeGenesis(kChainId);
    genesis_.mutable_params()->set_min_gas_price(kMinGasPrice);
    auto app = App::InitChain(genesis_);
    ASSERT_TRUE(app.ok()) << app.status();
    app_ = *std::move(app);
    CheckInvariants();
  }

  std::string Paid(const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs,
                   TxFee fee, uint64_t sequence_offset = 0) {
    auto account = app_->Account(Addr(key));
    EXPECT_TRUE(account.ok()) << account.status();
    return BuildSignedTx(key, kChainId, account->first, account->second + sequence_offset, msgs,
                         fee);
  }

  // The tx must be refused by CheckTx and by FinalizeBlock with the SDK's `code`, changing
  // nothing at all (a refusal of the ante step keeps neither fee nor sequence).
  void ExpectAnteRefusal(const std::string& tx, SdkCode code, const std::string& fragment) {
    ExpectRefusedTx(tx, "", Sdk(code), fragment, /*bumps_sequence=*/false);
  }

  uint64_t Collected() const { return app_->Balance(app_->FeeCollectorAddress()); }
};

TEST_F(FeeTest, AFeeAtTheMinimumGasPriceIsPaidToTheFeeCollector) {
  const uint64_t before = app_->Balance(Addr(creator_));
  const TxFee fee{150'000, 1'500};  // 150,000 gas at 0.01
  std::string tx = Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, fee);
  TxResponse checked = app_->CheckTx(tx);
  ASSERT_EQ(checked.code(), kOk) << checked.raw_log();
  BlockOutcome outcome = Block({tx});
  const TxResponse& delivered = outcome.results.tx_results(0);
  ASSERT_EQ(delivered.code(), kOk) << delivered.raw_log();
  EXPECT_EQ(app_->Balance(Addr(creator_)), before - 7 - 1'500);
  EXPECT_EQ(Collected(), 1'500u);
  EXPECT_EQ(delivered.gas_wanted(), 150'000);
  EXPECT_GT(delivered.gas_used(), 0);
  EXPECT_LE(delivered.gas_used(), delivered.gas_wanted());
  EXPECT_EQ(checked.gas_used(), delivered.gas_used());
  // The fee's own events come first, then the tx events, then the message's.
  auto fee_transfer = EventsOf(delivered.events(), "transfer");
  ASSERT_EQ(fee_transfer.size(), 2u);
  EXPECT_EQ(fee_transfer[0]["recipient"], app_->FeeCollectorAddress());
  EXPECT_EQ(fee_transfer[0]["amount"], "1500ngonka");
  EXPECT_EQ(fee_transfer[0].count("msg_index"), 0u);
  EXPECT_EQ(fee_transfer[1]["recipient"], Addr(hosts_[0]));
  auto tx_events = EventsOf(delivered.events(), "tx");
  ASSERT_EQ(tx_events.size(), 3u);
  EXPECT_EQ(tx_events[0]["fee"], "1500ngonka");
  EXPECT_EQ(tx_events[0]["fee_payer"], Addr(creator_));
  // The fee collector is a module account: nobody sends to it.
  ExpectRefused(creator_, {SendMsg(creator_, app_->FeeCollectorAddress(), "1")},
                Sdk(SdkCode::kUnauthorized), "is a module account");
}

TEST_F(FeeTest, AFeeBelowTheMinimumIsRefusedAndChangesNothing) {
  ExpectAnteRefusal(Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {150'000, 1'499}),
                    SdkCode::kInsufficientFee,
                    "insufficient fees; got: 1499ngonka required: 1500ngonka");
  ExpectAnteRefusal(Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {150'000, 0}),
                    SdkCode::kInsufficientFee, "insufficient fee");
  // The price rounds up: 150,001 gas at 0.01 is 1,500.01 ngonka, so 1,501.
  ExpectAnteRefusal(Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {150'001, 1'500}),
                    SdkCode::kInsufficientFee, "required: 1501ngonka");
  EXPECT_EQ(Collected(), 0u);
}

TEST_F(FeeTest, AFeeAboveTheBalanceIsRefusedWithTheSdkCode) {
  // The outsider holds 1,000 ngonka.
  ExpectAnteRefusal(Paid(outsider_, {SendMsg(outsider_, Addr(hosts_[0]), "1")}, {150'000, 5'000}),
                    SdkCode::kInsufficientFunds, "fee: spendable balance");
  // What the fee leaves is all the messages may spend.
  std::string tx = Paid(outsider_, {SendMsg(outsider_, Addr(hosts_[0]), "900")}, {100'000, 1'000});
  TxResponse checked = app_->CheckTx(tx);
  EXPECT_EQ(checked.code(), Code(SdkCode::kInsufficientFunds)) << checked.raw_log();
  EXPECT_EQ(checked.codespace(), "sdk");
}

TEST_F(FeeTest, BadFeesAreRefusedNamingTheField) {
  auto tx_with = [&](const std::function<void(cosmos::tx::v1beta1::AuthInfo*)>& mutate) {
    auto decoded =
        DecodeTx(Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {150'000, 1'500}));
    EXPECT_TRUE(decoded.ok());
    mutate(&decoded->auth_info);
    decoded->raw.set_auth_info_bytes(DeterministicBytes(decoded->auth_info));
    return DeterministicBytes(decoded->raw);
  };
  ExpectAnteRefusal(
      tx_with([](auto* auth) { auth->mutable_fee()->mutable_amount(0)->set_denom("uatom"); }),
      SdkCode::kInvalidCoins, "tx.auth_info.fee.amount[0].denom: 'uatom'");
  ExpectAnteRefusal(
      tx_with([](auto* auth) { *auth->mutable_fee()->add_amount() = auth->fee().amount(0); }),
      SdkCode::kInvalidCoins, "2 coins, want at most one");
  ExpectAnteRefusal(
      tx_with([](auto* auth) { auth->mutable_fee()->mutable_amount(0)->set_amount("-5"); }),
      SdkCode::kInvalidCoins, "tx.auth_info.fee.amount[0].amount");
  ExpectAnteRefusal(tx_with([&](auto* auth) { auth->mutable_fee()->set_granter(Addr(hosts_[0])); }),
                    SdkCode::kInvalidRequest, "fee grants are not supported");
  ExpectAnteRefusal(tx_with([&](auto* auth) { auth->mutable_fee()->set_payer(Addr(hosts_[0])); }),
                    SdkCode::kInvalidRequest, "only the signer may pay");
  ExpectAnteRefusal(
      Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {kMaxTxGas + 1, 2'000'000}),
      SdkCode::kInvalidGasLimit, "exceeds the cap of 100000000");
}

TEST_F(FeeTest, OutOfGasInTheAnteStepKeepsNothingAndInAMessageKeepsTheFee) {
  // 1,000 gas does not cover the tx's bytes (10 per byte): refused whole.
  ExpectAnteRefusal(Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {1'000, 10}),
                    SdkCode::kOutOfGas, "out of gas in location: txSize; gasWanted: 1000");

  // Enough for the ante step, not for the message: the fee and the sequence are kept.
  std::string probe =
      BuildSimulateTx(creator_.public_key(), 0, {SendMsg(creator_, Addr(hosts_[0]), "7")});
  TxResponse simulated = app_->Simulate(probe);
  ASSERT_EQ(simulated.code(), kOk) << simulated.raw_log();
  const uint64_t short_limit = static_cast<uint64_t>(simulated.gas_used()) - 500;
  const uint64_t fee = RequiredFee(*ParseGasPrice("p", kMinGasPrice), short_limit);
  const uint64_t before = app_->Balance(Addr(creator_));
  std::string tx = Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {short_limit, fee});
  EXPECT_EQ(app_->CheckTx(tx).code(), Code(SdkCode::kOutOfGas));
  BlockOutcome outcome = Block({tx});
  const TxResponse& delivered = outcome.results.tx_results(0);
  EXPECT_EQ(delivered.code(), Code(SdkCode::kOutOfGas)) << delivered.raw_log();
  EXPECT_EQ(delivered.codespace(), "sdk");
  EXPECT_GT(delivered.gas_used(), delivered.gas_wanted());
  EXPECT_EQ(app_->Balance(Addr(creator_)), before - fee);
  EXPECT_EQ(app_->Balance(Addr(hosts_[0])), 1000u);
  EXPECT_EQ(Collected(), fee);
  EXPECT_EQ(app_->Account(Addr(creator_))->second, 1u);
  EXPECT_EQ(EventsOf(delivered.events(), "message").size(), 0u);
  EXPECT_EQ(EventsOf(delivered.events(), "tx").size(), 3u);
}

TEST_F(FeeTest, SimulateMeasuresWithoutSignatureOrFeeAndChangesNothing) {
  const auto state_before = app_->state();
  std::vector<google::protobuf::Any> msgs = {SendMsg(creator_, Addr(hosts_[0]), "7")};
  TxResponse simulated = app_->Simulate(BuildSimulateTx(creator_.public_key(), 0, msgs));
  ASSERT_EQ(simulated.code(), kOk) << simulated.raw_log();
  EXPECT_EQ(app_->state(), state_before);
  EXPECT_EQ(EventsOf(simulated.events(), "transfer").size(), 1u);
  // The signed tx with the client's margin (as BuildPaidTx asks) is enough, and uses about
  // what the simulation said: only its signature and fee bytes differ.
  const uint64_t used = static_cast<uint64_t>(simulated.gas_used());
  const uint64_t limit = used * 13 / 10 + 5000;
  std::string tx =
      Paid(creator_, msgs, {limit, RequiredFee(*ParseGasPrice("p", kMinGasPrice), limit)});
  BlockOutcome outcome = Block({tx});
  const TxResponse& delivered = outcome.results.tx_results(0);
  ASSERT_EQ(delivered.code(), kOk) << delivered.raw_log();
  EXPECT_GE(static_cast<uint64_t>(delivered.gas_used()), used);
  EXPECT_LE(static_cast<uint64_t>(delivered.gas_used()), used + 2'000);
  // A simulation of a tx that would fail says why; one of a stale sequence too.
  TxResponse poor = app_->Simulate(
      BuildSimulateTx(outsider_.public_key(), 0, {SendMsg(outsider_, Addr(hosts_[0]), "5000")}));
  EXPECT_EQ(poor.code(), Code(SdkCode::kInsufficientFunds)) << poor.raw_log();
  TxResponse stale = app_->Simulate(BuildSimulateTx(creator_.public_key(), 0, msgs));
  EXPECT_EQ(stale.code(), Code(SdkCode::kWrongSequence)) << stale.raw_log();
  // An empty signature is for simulations only.
  ExpectAnteRefusal(BuildSimulateTx(creator_.public_key(), 1, msgs), SdkCode::kTxDecode,
                    "tx.signatures[0]: 0 bytes");
}

TEST_F(FeeTest, GasIsDeterministic) {
  // The same txs on two chains from the same genesis use the same gas, tx by tx.
  std::vector<std::string> txs = {
      Paid(creator_, {SendMsg(creator_, Addr(hosts_[0]), "7")}, {150'000, 1'500}),
      Paid(creator_, {ProposalMsg(creator_, {DefaultSpec()})}, {1'000'000, 10'000}, 1)};
  BlockOutcome first = Block(txs);
  auto other = App::InitChain(genesis_);
  ASSERT_TRUE(other.ok());
  tendermint::types::Header header;
  header.set_chain_id(kChainId);
  header.set_height(1);
  auto second = (*other)->FinalizeBlock(header, txs);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(first.results.tx_results_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(first.results.tx_results(i).code(), kOk) << first.results.tx_results(i).raw_log();
    EXPECT_GT(first.results.tx_results(i).gas_used(), 0);
    EXPECT_EQ(first.results.tx_results(i).gas_used(), second->results.tx_results(i).gas_used());
  }
  EXPECT_EQ(first.results.app_hash(), second->results.app_hash());
}

// The default chain (a price of 0): the hosts' reservations need gas, not funds.
using ReservationGasTest = ChainTest;

TEST_F(ReservationGasTest, TheOneThatFillsAShardNeedsNoMoreGasThanItsSimulationSaid) {
  // A host simulates its reservation while the shard is empty; two others land first, so its
  // own fills the shard and starts it. The limit a client asks from the simulation suffices.
  pb::ShardSpec spec = DefaultSpec();
  spec.set_run_spec(std::string(4096, 'r'));  // a run spec on chain makes the record heavy
  spec.set_run_spec_hash(common::Sha256(spec.run_spec()));
  const uint64_t shard_id = OpenShard(spec);
  const common::PrivateKey& last = hosts_[2];
  std::vector<google::protobuf::Any> msgs = {ReserveMsg(SignedReservation(last, shard_id))};
  auto account = app_->Account(Addr(last));
  ASSERT_TRUE(account.ok()) << account.status();
  TxResponse simulated = app_->Simulate(BuildSimulateTx(last.public_key(), account->second, msgs));
  ASSERT_EQ(simulated.code(), kOk) << simulated.raw_log();
  const uint64_t used = static_cast<uint64_t>(simulated.gas_used());
  const uint64_t limit = used * 13 / 10 + 5000;
  std::vector<std::string> txs;
  for (int i = 0; i < 2; ++i) {
    const auto& host = hosts_[static_cast<size_t>(i)];
    auto signer = app_->Account(Addr(host));
    ASSERT_TRUE(signer.ok()) << signer.status();
    txs.push_back(BuildSignedTx(host, kChainId, signer->first, signer->second,
                                {ReserveMsg(SignedReservation(host, shard_id))}, {limit, 0}));
  }
  txs.push_back(BuildSignedTx(last, kChainId, account->first, account->second, msgs, {limit, 0}));
  BlockOutcome outcome = Block(txs);
  ASSERT_EQ(outcome.results.tx_results_size(), 3);
  for (const auto& result : outcome.results.tx_results()) {
    EXPECT_EQ(result.code(), kOk) << result.raw_log();
  }
  EXPECT_EQ(app_->GetShard(shard_id)->status(), pb::SHARD_STATUS_RUNNING);
  EXPECT_LE(static_cast<uint64_t>(outcome.results.tx_results(2).gas_used()), used + 5'000);
}

TEST(GasPriceTest, ParsesDecimalsAndRoundsTheFeeUp) {
  EXPECT_TRUE(ParseGasPrice("p", "")->zero());
  EXPECT_TRUE(ParseGasPrice("p", "0")->zero());
  EXPECT_TRUE(ParseGasPrice("p", "0.000")->zero());
  EXPECT_EQ(RequiredFee(*ParseGasPrice("p", "0.0025"), 1000), 3u);  // 2.5 rounds up
  EXPECT_EQ(RequiredFee(*ParseGasPrice("p", "0.0025"), 800), 2u);
  EXPECT_EQ(RequiredFee(*ParseGasPrice("p", "1"), 200000), 200000u);
  EXPECT_EQ(RequiredFee(*ParseGasPrice("p", "0.000000000000000001"), 1), 1u);
  EXPECT_EQ(RequiredFee(*ParseGasPrice("p", "999999999.999999999999999999"), kMaxTxGas),
            100'000'000'000'000'000u);
  for (const char* bad : {"-1", "1e3", ".5", "5.", "1234567890", "0.0000000000000000001", "0x1",
                          "1.2.3", " 1", "1 "}) {
    auto price = ParseGasPrice("params.min_gas_price", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(price.status())) << bad;
    EXPECT_THAT(std::string(price.status().message()), HasSubstr("params.min_gas_price")) << bad;
  }
}

TEST_F(FeeTest, ABadMinimumGasPriceIsRefusedAtGenesis) {
  pb::Genesis genesis = MakeGenesis(kChainId);
  genesis.mutable_params()->set_min_gas_price("0.0.1");
  auto app = App::InitChain(genesis);
  EXPECT_TRUE(absl::IsInvalidArgument(app.status()));
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("params.min_gas_price: '0.0.1'"));
}

}  // namespace
}  // namespace ts::bridge::chain_test
