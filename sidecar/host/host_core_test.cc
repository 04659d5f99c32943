#include "sidecar/host/host_core.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/status.h"
#include "sidecar/host/fake_chain_client.h"
#include "sidecar/host/host_core_fixture.h"

namespace ts::sidecar {
namespace {

using testing::FakeChainClient;
using testing::FakeClock;
using ::testing::HasSubstr;
using testing::KeyOf;
using testing::MakeEvent;

constexpr char kChainId[] = "fake-chain-1";

tendermint::abci::Event Proposed(uint64_t id, const std::string& profile = "cpu-small") {
  return MakeEvent("trainshard.shard_proposed", {{"shard_id", std::to_string(id)},
                                                 {"proposal_id", std::to_string(id)},
                                                 {"creator", "gonka1creator"},
                                                 {"hardware_profile", profile},
                                                 {"max_nodes", "3"},
                                                 {"escrow", "300000"}});
}

struct OpenedArgs {
  std::string profile = "cpu-small";
  uint32_t max_nodes = 3;
  uint64_t escrow = 300000;
  uint64_t min_host_weight = 10;
  int64_t reservation_deadline_height = 1000;
};

tendermint::abci::Event Opened(uint64_t id, OpenedArgs a = {}) {
  return MakeEvent("trainshard.shard_opened",
                   {{"shard_id", std::to_string(id)},
                    {"creator", "gonka1creator"},
                    {"hardware_profile", a.profile},
                    {"min_nodes", "1"},
                    {"max_nodes", std::to_string(a.max_nodes)},
                    {"min_host_weight", std::to_string(a.min_host_weight)},
                    {"escrow", std::to_string(a.escrow)},
                    {"reservation_deadline_height", std::to_string(a.reservation_deadline_height)},
                    {"deadline_height", "5000"}});
}

tendermint::abci::Event Added(uint64_t id, const std::string& host, uint64_t weight,
                              uint32_t members) {
  return MakeEvent("trainshard.reservation_added", {{"shard_id", std::to_string(id)},
                                                    {"host", host},
                                                    {"frozen_weight", std::to_string(weight)},
                                                    {"endpoint", "127.0.0.1:7000"},
                                                    {"members", std::to_string(members)}});
}

tendermint::abci::Event Running(uint64_t id, uint32_t members, uint64_t total) {
  return MakeEvent("trainshard.shard_running", {{"shard_id", std::to_string(id)},
                                                {"members", std::to_string(members)},
                                                {"total_weight", std::to_string(total)}});
}

pb::Reservation ReservationOf(const std::string& tx_bytes) {
  auto decoded = bridge::DecodeTx(tx_bytes);
  TS_CHECK(decoded.ok());
  pb::MsgReserveTrainshard msg;
  TS_CHECK(decoded->body.messages_size() == 1 && decoded->body.messages(0).UnpackTo(&msg));
  return msg.reservation();
}

uint64_t SequenceOf(const std::string& tx_bytes) {
  auto decoded = bridge::DecodeTx(tx_bytes);
  TS_CHECK(decoded.ok());
  return decoded->auth_info.signer_infos(0).sequence();
}

uint64_t GasLimitOf(const std::string& tx_bytes) {
  auto decoded = bridge::DecodeTx(tx_bytes);
  TS_CHECK(decoded.ok());
  return decoded->auth_info.fee().gas_limit();
}

class HostCoreTest : public testing::HostCoreFixture {
 protected:
  HostCoreTest() : HostCoreFixture(kChainId) {}
  void SetUp() override {
    HostCoreFixture::SetUp();
    chain_.SetWeight(address_, 100);
  }

  std::vector<std::string> Actions() {
    std::vector<std::string> out;
    for (const auto& e : Events()) out.push_back(e.action());
    return out;
  }
  int CountActions(const std::string& action) {
    int n = 0;
    for (const auto& a : Actions()) n += a == action;
    return n;
  }
  int64_t Cursor() { return *core_->store().CursorHeight(); }

  // A RUNNING shard with this host (weight 100) and `other_` (weight 80) as members, escrow
  // 300000, reached without any tx from this host (auto_reserve off).
  void MakeRunningShard(uint64_t id, int64_t height, bool self_member = true) {
    chain_.AddEvent(height, Opened(id));
    uint32_t members = 0;
    if (self_member) chain_.AddEvent(height, Added(id, address_, 100, ++members));
    chain_.AddEvent(height, Added(id, other_, 80, ++members));
    chain_.AddEvent(height, Running(id, members, self_member ? 180 : 80));
  }
  pb::Settlement Draft(uint64_t id) {
    pb::Settlement d;
    d.set_chain_id(kChainId);
    d.set_shard_id(id);
    d.set_final_checkpoint_root(std::string(32, '\xab'));
    d.mutable_evaluation()->set_metric("eval_loss");
    d.mutable_evaluation()->set_value_micro(2500000);
    auto* p1 = d.add_payouts();
    p1->set_host(address_);
    p1->set_amount("100000");
    auto* p2 = d.add_payouts();
    p2->set_host(other_);
    p2->set_amount("80000");
    d.set_refund("120000");
    d.set_rounds_completed(10);
    d.set_rounds_planned(10);
    return d;
  }
};

TEST_F(HostCoreTest, ReservesOnceWhenAShardOpens) {
  chain_.AddEvent(1, Proposed(1));
  chain_.AddEvent(2, MakeEvent("bank.transfer", {{"from", "a"}, {"to", "b"}, {"amount", "1"}}));
  chain_.AddEvent(2, Opened(1));
  Open();
  Step();

  EXPECT_EQ(Cursor(), 2);
  EXPECT_THAT(Actions(), ::testing::ElementsAre("record", "record", "reserve"));
  auto events = Events();
  EXPECT_EQ(events[2].height(), 2);
  EXPECT_EQ(events[2].index(), 1u);
  EXPECT_EQ(events[2].event().type(), "trainshard.shard_opened");

  auto sent = chain_.broadcasts();
  ASSERT_EQ(sent.size(), 1u);
  pb::Reservation r = ReservationOf(sent[0]);
  EXPECT_EQ(r.shard_id(), 1u);
  EXPECT_EQ(r.host(), address_);
  EXPECT_EQ(r.endpoint(), "127.0.0.1:7001");
  EXPECT_EQ(r.tls_cert_sha256(), common::Sha256(address_));  // the documented placeholder
  EXPECT_EQ(r.valid_until_height(), 2 + 50);
  EXPECT_EQ(SequenceOf(sent[0]), 0u);
  pb::Reservation statement = r;
  statement.clear_signature();
  auto signer = common::RecoverStatementSigner("reservation", kChainId, 1,
                                               DeterministicBytes(statement), r.signature());
  ASSERT_TRUE(signer.ok()) << signer.status();
  EXPECT_EQ(*signer, address_);

  auto pending = Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].txhash(), bridge::TxHash(sent[0]));
  EXPECT_EQ(pending[0].purpose(), "reserve:1");
  EXPECT_EQ(pending[0].attempts(), 1u);
  pb::HostShardRecord rec = Shard(1);
  EXPECT_EQ(rec.status(), pb::SHARD_STATUS_OPEN);
  EXPECT_TRUE(rec.reservation_sent());
  EXPECT_FALSE(rec.reserved());
  EXPECT_EQ(rec.escrow(), "300000");

  // The chain includes it; the host sees the tx and the event, and sends nothing more.
  chain_.MakeBlock(3);
  chain_.AddEvent(3, Added(1, address_, 100, 1));
  Step();
  EXPECT_TRUE(Pending().empty());
  rec = Shard(1);
  EXPECT_TRUE(rec.reserved());
  EXPECT_EQ(rec.frozen_weight(), 100u);
  ASSERT_EQ(rec.members_size(), 1);
  EXPECT_EQ(rec.members(0).host(), address_);
  clock_.Advance(60000);
  Step();
  EXPECT_EQ(chain_.broadcasts().size(), 1u);
  EXPECT_EQ(CountActions("reserve"), 1);
  EXPECT_EQ(core_->Snapshot().events_processed, 4u);
}

TEST_F(HostCoreTest, PolicySkipsRecordTheReason) {
  options_.policy.hardware_profiles = {"cpu-small"};
  options_.policy.max_shards = 1;
  options_.policy.min_escrow_per_node = 1000;
  chain_.AddEvent(1, Opened(1, {.profile = "h100-80g"}));
  chain_.AddEvent(2, Opened(2, {.max_nodes = 3, .escrow = 2999}));
  chain_.AddEvent(3, Opened(3, {.min_host_weight = 101}));
  chain_.AddEvent(4, Opened(4));
  chain_.AddEvent(5, Opened(5));
  Open();
  Step();
  auto actions = Actions();
  ASSERT_EQ(actions.size(), 5u);
  EXPECT_THAT(actions[0], HasSubstr("skip:hardware_profile h100-80g"));
  EXPECT_THAT(actions[1], HasSubstr("skip:escrow per node 999 is below"));
  EXPECT_THAT(actions[2], HasSubstr("skip:own weight 100 is below min_host_weight 101"));
  EXPECT_EQ(actions[3], "reserve");
  EXPECT_THAT(actions[4], HasSubstr("skip:policy.max_shards 1 reached"));
  EXPECT_THAT(Shard(1).skip_reason(), HasSubstr("hardware_profile"));
  EXPECT_THAT(Shard(5).skip_reason(), HasSubstr("max_shards"));
  EXPECT_EQ(chain_.broadcasts().size(), 1u);

  options_.policy.auto_reserve = false;
  Reopen();
  chain_.AddEvent(6, Opened(6));
  Step();
  EXPECT_EQ(Actions().back(), "skip:auto_reserve is off");
  // The restart re-sent the pending tx; nothing new was signed.
  std::set<std::string> distinct;
  for (const auto& b : chain_.broadcasts()) distinct.insert(b);
  EXPECT_EQ(distinct.size(), 1u);
}

TEST_F(HostCoreTest, EmptyProfileListMeansAnyAndUnknownAccountSkips) {
  chain_.SetAccount("gonka1someoneelse", 1, 0);
  chain_.AddEvent(1, Opened(1, {.profile = "anything-goes"}));
  Open();
  Step();
  EXPECT_THAT(Actions()[0], HasSubstr("is not on chain"));
  EXPECT_TRUE(chain_.broadcasts().empty());
}

TEST_F(HostCoreTest, MalformedEventsAreIgnoredNeverFatal) {
  auto no_escrow = Opened(1);
  no_escrow.mutable_attributes()->erase(no_escrow.attributes().begin() + 6);
  chain_.AddEvent(1, no_escrow);
  chain_.AddEvent(1, MakeEvent("trainshard.reservation_added", {{"shard_id", "1"},
                                                                {"host", "h"},
                                                                {"frozen_weight", "x"},
                                                                {"endpoint", ""},
                                                                {"members", "1"}}));
  chain_.AddEvent(1, MakeEvent("trainshard.shard_running", {{"shard_id", "abc"}}));
  chain_.AddEvent(1, MakeEvent("something.else", {}));
  chain_.AddEvent(1, MakeEvent("", {}));
  Open();
  Step();
  auto actions = Actions();
  ASSERT_EQ(actions.size(), 5u);
  EXPECT_THAT(actions[0], HasSubstr("ignore:trainshard.shard_opened: attribute escrow missing"));
  EXPECT_THAT(actions[1],
              HasSubstr("ignore:trainshard.reservation_added: attribute frozen_weight"));
  EXPECT_THAT(actions[2], HasSubstr("ignore:trainshard.shard_running: attribute shard_id"));
  EXPECT_EQ(actions[3], "record");
  EXPECT_EQ(actions[4], "record");
  EXPECT_EQ(Cursor(), 1);
  EXPECT_TRUE(chain_.broadcasts().empty());
}

TEST_F(HostCoreTest, ChainFailureMidHeightWritesNothingAndRestartActsOnce) {
  chain_.AddEvent(1, Proposed(1));
  chain_.AddEvent(2, Opened(1));
  chain_.AddEvent(2, Opened(2));
  chain_.FailWeights(true);  // the policy check of height 2 cannot complete
  Open();
  absl::Status s = core_->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(Cursor(), 1);
  EXPECT_EQ(Events().size(), 1u);
  EXPECT_TRUE(Pending().empty());
  EXPECT_TRUE(chain_.broadcasts().empty());
  EXPECT_EQ(Shard(1).status(), pb::SHARD_STATUS_PROPOSED);

  chain_.FailWeights(false);
  Reopen();
  Step();
  EXPECT_EQ(Cursor(), 2);
  EXPECT_EQ(CountActions("reserve"), 2);
  ASSERT_EQ(Pending().size(), 2u);
  // Two reservations in one height take consecutive sequences.
  auto sent = chain_.broadcasts();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(SequenceOf(sent[0]) + 1, SequenceOf(sent[1]));
  EXPECT_EQ(chain_.mempool_hashes().size(), 2u);

  // A restart finds everything decided: nothing is decided again, only re-sent if due.
  Reopen();
  clock_.Advance(10000);
  chain_.DropMempool();
  Step();
  EXPECT_EQ(Events().size(), 3u);
  EXPECT_EQ(CountActions("reserve"), 2);
  std::set<std::string> distinct;
  for (const auto& b : chain_.broadcasts()) distinct.insert(b);
  EXPECT_EQ(distinct.size(), 2u) << "a restart made a new decision";
  EXPECT_EQ(chain_.mempool_hashes().size(), 2u);
}

TEST_F(HostCoreTest, CrashAfterTheBatchBeforeTheBroadcastSendsTheStoredTx) {
  chain_.AddEvent(1, Opened(1));
  chain_.FailBroadcast(true);  // as if the process died right after the batch
  Open();
  Step();
  auto pending = Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_TRUE(chain_.mempool_hashes().empty());
  core_.reset();

  chain_.FailBroadcast(false);
  Open();
  Step();
  EXPECT_EQ(chain_.mempool_hashes(), std::vector<std::string>{pending[0].txhash()});
  EXPECT_EQ(CountActions("reserve"), 1);
}

TEST_F(HostCoreTest, PendingTxIsRebroadcastAtMostEveryIntervalUntilIncluded) {
  chain_.AddEvent(1, Opened(1));
  chain_.FailBroadcast(true);
  Open();
  Step();  // the broadcast right after the batch fails; the height is done
  EXPECT_EQ(chain_.broadcasts().size(), 1u);
  Step();  // not due yet
  clock_.Advance(options_.rebroadcast_interval_ms - 1);
  Step();
  EXPECT_EQ(chain_.broadcasts().size(), 1u);
  clock_.Advance(1);
  EXPECT_EQ(core_->Step().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(chain_.broadcasts().size(), 2u);
  EXPECT_EQ(Pending()[0].attempts(), 2u);

  chain_.FailBroadcast(false);
  clock_.Advance(options_.rebroadcast_interval_ms);
  Step();
  ASSERT_EQ(chain_.mempool_hashes().size(), 1u);
  // A node restart loses the mempool: the same bytes go again.
  chain_.DropMempool();
  clock_.Advance(options_.rebroadcast_interval_ms);
  Step();
  auto sent = chain_.broadcasts();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(sent[3], sent[0]);
  chain_.MakeBlock(2);
  Step();
  EXPECT_TRUE(Pending().empty());
  EXPECT_TRUE(Shard(1).reserved());
}

TEST_F(HostCoreTest, SequenceMismatchReSignsTheSameReservation) {
  chain_.AddEvent(1, Opened(1));
  chain_.FailBroadcast(true);
  Open();
  Step();
  auto first = Pending();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(SequenceOf(first[0].tx_bytes()), 0u);

  // Another tx of this account took sequence 0 meanwhile.
  chain_.ConsumeSequence();
  chain_.FailBroadcast(false);
  clock_.Advance(options_.rebroadcast_interval_ms);
  Step();  // refused for the sequence: re-signed, the row replaced
  auto second = Pending();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NE(second[0].txhash(), first[0].txhash());
  EXPECT_EQ(SequenceOf(second[0].tx_bytes()), 1u);
  EXPECT_EQ(ReservationOf(second[0].tx_bytes()).SerializeAsString(),
            ReservationOf(first[0].tx_bytes()).SerializeAsString());
  EXPECT_EQ(second[0].purpose(), "reserve:1");
  Step();  // the new tx is due at once
  EXPECT_EQ(chain_.mempool_hashes(), std::vector<std::string>{second[0].txhash()});
  chain_.MakeBlock(2);
  Step();
  EXPECT_TRUE(Pending().empty());
  EXPECT_TRUE(Shard(1).reserved());
  EXPECT_EQ(CountActions("reserve"), 1);
}

TEST_F(HostCoreTest, OutOfGasReSignsAboveWhatTheTxUsed) {
  // The state moved between the simulation and the check (another host's reservation filled
  // the shard but one): refused out of gas at the broadcast, then again in a block.
  chain_.AddEvent(1, Opened(1));
  chain_.ScriptBroadcast(11, "sdk", "out of gas in location: WriteFlat", /*gas_used=*/160'000);
  Open();
  Step();
  auto first = Pending();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(GasLimitOf(first[0].tx_bytes()), 160'000u * 13 / 10 + bridge::kGasMargin);
  EXPECT_EQ(SequenceOf(first[0].tx_bytes()), 0u);
  EXPECT_TRUE(Shard(1).reservation_sent());
  Step();  // the new tx is due at once
  ASSERT_EQ(chain_.mempool_hashes(), std::vector<std::string>{first[0].txhash()});
  chain_.MakeBlock(2, 11, "out of gas in location: WriteFlat", "sdk", /*gas_used=*/300'000);
  Step();  // its sequence is spent: re-signed with the next one and more gas
  auto second = Pending();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(SequenceOf(second[0].tx_bytes()), 1u);
  EXPECT_EQ(GasLimitOf(second[0].tx_bytes()), 300'000u * 13 / 10 + bridge::kGasMargin);
  EXPECT_EQ(ReservationOf(second[0].tx_bytes()).SerializeAsString(),
            ReservationOf(first[0].tx_bytes()).SerializeAsString());
  Step();
  chain_.MakeBlock(3);
  Step();
  EXPECT_TRUE(Pending().empty());
  EXPECT_TRUE(Shard(1).reserved());
  EXPECT_EQ(CountActions("reserve"), 1);
}

TEST_F(HostCoreTest, RefusedAlreadyReservedAndFailedInBlock) {
  chain_.AddEvent(1, Opened(1));
  chain_.AddEvent(2, Opened(2));
  chain_.AddEvent(3, Opened(3));
  chain_.ScriptBroadcast(9, "trainshard", "shard 1 is RUNNING, not open");
  Open();
  ASSERT_TRUE(core_->Follow(1).ok());
  EXPECT_TRUE(Pending().empty());
  EXPECT_FALSE(Shard(1).reservation_sent());
  EXPECT_THAT(Shard(1).skip_reason(), HasSubstr("shard 1 is RUNNING, not open"));

  chain_.ScriptBroadcast(6, "trainshard", "host already holds a place in shard 2");
  ASSERT_TRUE(core_->Follow(1).ok());
  EXPECT_TRUE(Pending().empty());
  EXPECT_TRUE(Shard(2).reserved());

  ASSERT_TRUE(core_->Follow(1).ok());
  ASSERT_EQ(Pending().size(), 1u);
  chain_.MakeBlock(4, /*delivered_code=*/8, "shard 3 is full: max_nodes 3");
  Step();
  EXPECT_TRUE(Pending().empty());
  EXPECT_FALSE(Shard(3).reserved());
  EXPECT_FALSE(Shard(3).reservation_sent());
  EXPECT_THAT(Shard(3).skip_reason(), HasSubstr("is full"));
}

TEST_F(HostCoreTest, ExpiredReservationIsRenewedWhileTheShardIsOpen) {
  chain_.AddEvent(2, Opened(1));
  chain_.FailBroadcast(true);
  Open();
  Step();
  ASSERT_EQ(ReservationOf(Pending()[0].tx_bytes()).valid_until_height(), 52);
  chain_.FailBroadcast(false);
  chain_.SetLatestHeight(100);
  chain_.ScriptBroadcast(9, "trainshard",
                         "reservation.valid_until_height: 52 is before height 100");
  clock_.Advance(options_.rebroadcast_interval_ms);
  Step();
  auto pending = Pending();
  ASSERT_EQ(pending.size(), 1u);
  pb::Reservation renewed = ReservationOf(pending[0].tx_bytes());
  EXPECT_EQ(renewed.valid_until_height(), 150);
  pb::Reservation statement = renewed;
  statement.clear_signature();
  EXPECT_EQ(*common::RecoverStatementSigner("reservation", kChainId, 1,
                                            DeterministicBytes(statement), renewed.signature()),
            address_);
  EXPECT_TRUE(Shard(1).reservation_sent());
}

TEST_F(HostCoreTest, PendingTxIsAbandonedAfterBoundedAttempts) {
  options_.max_broadcast_attempts = 3;
  chain_.AddEvent(1, Opened(1));
  chain_.FailBroadcast(true);
  Open();
  for (int i = 0; i < 5; ++i) {
    (void)core_->Step();
    clock_.Advance(options_.rebroadcast_interval_ms);
  }
  EXPECT_EQ(chain_.broadcasts().size(), 3u);
  EXPECT_TRUE(Pending().empty());
  EXPECT_FALSE(Shard(1).reservation_sent());
  EXPECT_THAT(Shard(1).skip_reason(), HasSubstr("abandoned after 3 broadcasts"));
}

TEST_F(HostCoreTest, CatchingUpDoesNotReserveClosedShards) {
  chain_.AddEvent(2, Opened(1, {.reservation_deadline_height = 100}));
  chain_.AddEvent(3, Opened(2, {.reservation_deadline_height = 1000}));
  chain_.SetLatestHeight(500);
  Open();
  Step();
  EXPECT_THAT(Actions()[0], HasSubstr("skip:reservation window closed at height 100"));
  EXPECT_EQ(Actions()[1], "reserve");
  // Made valid from the chain's head, not from the old height.
  EXPECT_EQ(ReservationOf(chain_.broadcasts()[0]).valid_until_height(), 550);
}

TEST_F(HostCoreTest, ManualReserve) {
  options_.policy.auto_reserve = false;
  chain_.AddEvent(1, Opened(1));
  chain_.AddEvent(1, Proposed(2));
  Open();
  Step();
  EXPECT_TRUE(chain_.broadcasts().empty());
  EXPECT_EQ(core_->Reserve(99).status().code(), absl::StatusCode::kNotFound);
  auto proposed = core_->Reserve(2);
  EXPECT_EQ(proposed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(proposed.status().message()), HasSubstr("not OPEN"));
  auto txhash = core_->Reserve(1);
  ASSERT_TRUE(txhash.ok()) << txhash.status();
  ASSERT_EQ(chain_.broadcasts().size(), 1u);
  EXPECT_EQ(*txhash, bridge::TxHash(chain_.broadcasts()[0]));
  EXPECT_EQ(ReservationOf(chain_.broadcasts()[0]).valid_until_height(), 51);
  auto again = core_->Reserve(1);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Pending().size(), 1u);
  chain_.MakeBlock(2);
  Step();
  auto reserved = core_->Reserve(1);
  EXPECT_EQ(reserved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reserved.status().message()), HasSubstr("already reserved"));
}

// The run check sees the spec the chain holds for the shard (its run spec document); a shard
// whose run this host cannot train is skipped with the check's reason, before any weight is
// frozen, and a manual reservation of it is refused with the same reason.
TEST_F(HostCoreTest, ASpecTheHostCannotRunIsSkippedAndRefusedWithItsReason) {
  options_.run_check = [](const pb::ShardSpec& spec) {
    return spec.run_spec() == "too big" ? std::string("run spec: model needs more memory")
                                        : std::string();
  };
  for (uint64_t id : {1, 2, 3}) {
    pb::Shard shard;
    shard.set_id(id);
    shard.set_status(pb::SHARD_STATUS_OPEN);
    shard.mutable_spec()->set_run_spec(id == 2 ? "fits" : "too big");
    chain_.SetShard(shard);
  }
  chain_.AddEvent(1, Opened(1));
  chain_.AddEvent(1, Opened(2));
  chain_.AddEvent(1, Opened(4));  // the chain does not know it (any more)
  Open();
  Step();
  auto actions = Actions();
  ASSERT_EQ(actions.size(), 3u);
  EXPECT_EQ(actions[0], "skip:run spec: model needs more memory");
  EXPECT_EQ(actions[1], "reserve");
  EXPECT_EQ(actions[2], "skip:shard 4 not on chain");
  EXPECT_EQ(Shard(1).skip_reason(), "run spec: model needs more memory");
  EXPECT_EQ(chain_.broadcasts().size(), 1u);

  chain_.AddEvent(2, Opened(3, {.min_host_weight = 1000}));  // skipped by policy, not by the check
  Step();
  auto refused = core_->Reserve(3);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "shard 3: run spec: model needs more memory");
  EXPECT_EQ(chain_.broadcasts().size(), 1u);

  // The chain is down while a shard opens: the height is not decided, and is decided once it is
  // back.
  chain_.SetShard([] {
    pb::Shard shard;
    shard.set_id(5);
    shard.set_status(pb::SHARD_STATUS_OPEN);
    return shard;
  }());
  chain_.AddEvent(3, Opened(5));
  chain_.SetUnavailable(true);
  EXPECT_FALSE(core_->Step().ok());
  EXPECT_EQ(Cursor(), 2);
  chain_.SetUnavailable(false);
  Step();
  EXPECT_EQ(Cursor(), 3);
  EXPECT_EQ(Actions().back(), "reserve");
}

TEST_F(HostCoreTest, SignsASettlementThatMatchesItsRecordsOnce) {
  options_.policy.auto_reserve = false;
  MakeRunningShard(1, 1);
  Open();
  Step();
  ASSERT_EQ(Shard(1).status(), pb::SHARD_STATUS_RUNNING);
  pb::Settlement draft = Draft(1);
  auto sig = core_->SignSettlement(draft);
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_EQ(sig->host(), address_);
  EXPECT_EQ(*common::RecoverStatementSigner("settlement", kChainId, 1, DeterministicBytes(draft),
                                            sig->signature()),
            address_);
  auto stored = core_->store().GetSettlementDraft(1);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(DeterministicBytes(stored->settlement()), DeterministicBytes(draft));
  EXPECT_EQ(stored->signature().signature(), sig->signature());
  EXPECT_TRUE(Shard(1).settlement_signed());
  EXPECT_EQ(Shard(1).settlement_root(), draft.final_checkpoint_root());

  auto same = core_->SignSettlement(draft);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->signature(), sig->signature());

  pb::Settlement other = draft;
  other.set_final_checkpoint_root(std::string(32, '\xcd'));
  auto refused = core_->SignSettlement(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("different settlement"));
  pb::Settlement shifted = draft;
  shifted.mutable_payouts(0)->set_amount("100001");
  shifted.set_refund("119999");
  EXPECT_EQ(core_->SignSettlement(shifted).status().code(), absl::StatusCode::kFailedPrecondition);

  // After a restart, and even once the shard is settled, the host remembers what it signed.
  chain_.AddEvent(2, MakeEvent("trainshard.shard_settled", {{"shard_id", "1"},
                                                            {"final_checkpoint_root", "ab"},
                                                            {"signed_weight", "180"},
                                                            {"total_weight", "180"},
                                                            {"refund", "120000"}}));
  Reopen();
  Step();
  EXPECT_EQ(Shard(1).status(), pb::SHARD_STATUS_SETTLED);
  auto after = core_->SignSettlement(draft);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->signature(), sig->signature());
  EXPECT_EQ(core_->SignSettlement(other).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(HostCoreTest, SignSettlementRefusesWhatItsRecordsContradict) {
  options_.policy.auto_reserve = false;
  MakeRunningShard(2, 1);
  chain_.AddEvent(2, Opened(3));                  // OPEN, not running
  MakeRunningShard(4, 3, /*self_member=*/false);  // running without this host
  Open();
  Step();

  auto expect = [&](pb::Settlement d, absl::StatusCode code, const std::string& fragment) {
    auto s = core_->SignSettlement(d);
    ASSERT_FALSE(s.ok()) << fragment;
    EXPECT_EQ(s.status().code(), code) << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(fragment));
  };
  pb::Settlement d = Draft(2);
  d.set_chain_id("another-chain");
  expect(d, absl::StatusCode::kFailedPrecondition, "settlement.chain_id: \"another-chain\"");
  d = Draft(2);
  d.set_final_checkpoint_root(std::string(31, 'x'));
  expect(d, absl::StatusCode::kInvalidArgument, "31 bytes, expected 32");
  d = Draft(2);
  d.mutable_payouts(1)->set_host(common::AddressFromPublicKey(KeyOf(0x33).public_key()));
  expect(d, absl::StatusCode::kFailedPrecondition, "was not seen reserving shard 2");
  d = Draft(2);
  d.mutable_payouts(1)->set_host(address_);
  expect(d, absl::StatusCode::kFailedPrecondition, "is paid twice");
  d = Draft(2);
  d.set_refund("119999");
  expect(d, absl::StatusCode::kFailedPrecondition,
         "payouts + refund = 299999 but the escrow this host recorded is 300000");
  d = Draft(2);
  d.set_refund("1.5");
  expect(d, absl::StatusCode::kInvalidArgument, "settlement.refund");
  d = Draft(2);
  d.mutable_payouts(0)->set_amount("18446744073709551615");
  expect(d, absl::StatusCode::kInvalidArgument, "overflows");
  expect(Draft(99), absl::StatusCode::kNotFound, "shard 99 is unknown");
  expect(Draft(3), absl::StatusCode::kFailedPrecondition, "SHARD_STATUS_OPEN");
  expect(Draft(4), absl::StatusCode::kFailedPrecondition, "is not a member");

  // None of the refusals stored anything: the right draft is still signed.
  EXPECT_EQ(core_->store().GetSettlementDraft(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_->SignSettlement(Draft(2)).ok());
}

TEST_F(HostCoreTest, RecordsOfAnotherKeyOrChainAreRefused) {
  chain_.AddEvent(1, Proposed(1));
  Open();
  Step();
  core_.reset();
  auto other = HostCore::Open(dir_ + "/state", KeyOf(0x22), options_, &chain_, &clock_);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.status().message()), HasSubstr(address_));

  Open();
  chain_.SetChainId("another-chain");
  absl::Status s = core_->Step();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("another-chain"));
}

TEST_F(HostCoreTest, FollowsAtMostMaxHeightsPerStep) {
  options_.max_heights_per_step = 3;
  chain_.SetLatestHeight(10);
  Open();
  Step();
  EXPECT_EQ(Cursor(), 3);
  Step();
  EXPECT_EQ(Cursor(), 6);
  EXPECT_EQ(core_->ProcessHeight(8).code(), absl::StatusCode::kFailedPrecondition);
}

// A full disk under the records: the follower stands still (nothing decided, nothing sent) and
// says why in the snapshot; once space is back it catches up without a restart, deciding every
// height once.
TEST_F(HostCoreTest, FullDiskStopsTheFollowerUntilTheRecordsRecover) {
  auto fault = std::make_shared<state::DiskFullFault>();
  options_.disk_full_fault = fault;
  for (int64_t h = 1; h <= 3; ++h) {
    chain_.AddEvent(h, MakeEvent("bank.transfer", {{"amount", std::to_string(h)}}));
  }
  Open();
  Step();
  ASSERT_EQ(Cursor(), 3);
  EXPECT_TRUE(core_->Snapshot().records_error.empty());

  fault->Set(true);
  chain_.AddEvent(5, Opened(1));
  chain_.SetLatestHeight(30);
  const int64_t failed_at_ms = clock_.NowUnixMs();
  absl::Status failed = core_->Step();
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_THAT(std::string(failed.message()), HasSubstr("No space left on device"));
  EXPECT_EQ(Cursor(), 3);
  EXPECT_TRUE(chain_.broadcasts().empty());
  HostStatusSnapshot down = core_->Snapshot();
  EXPECT_EQ(down.cursor_height, 3);
  EXPECT_EQ(down.chain_height, 30);
  EXPECT_THAT(down.last_error, HasSubstr("No space left on device"));
  EXPECT_EQ(down.last_error_since_unix_ms, failed_at_ms);
  EXPECT_THAT(down.records_error, HasSubstr("No space left on device"));
  EXPECT_EQ(down.records_path, dir_ + "/state");
  EXPECT_EQ(down.records_error_since_unix_ms, failed_at_ms);
  EXPECT_EQ(down.records_recoveries, 0u);

  // Still full a while later: the same error, the same "since".
  clock_.Advance(10000);
  EXPECT_EQ(core_->Step().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Cursor(), 3);
  EXPECT_EQ(core_->Snapshot().last_error_since_unix_ms, failed_at_ms);
  EXPECT_EQ(core_->Snapshot().records_error_since_unix_ms, failed_at_ms);

  // Space is back: the same core follows again and catches up with the chain.
  fault->Set(false);
  clock_.Advance(1000);
  Step();
  Step();
  ASSERT_EQ(Cursor(), 30);
  HostStatusSnapshot up = core_->Snapshot();
  EXPECT_TRUE(up.last_error.empty()) << up.last_error;
  EXPECT_EQ(up.last_error_since_unix_ms, 0);
  EXPECT_TRUE(up.records_error.empty()) << up.records_error;
  EXPECT_EQ(up.records_error_since_unix_ms, 0);
  EXPECT_EQ(up.records_recoveries, 1u);
  EXPECT_EQ(CountActions("reserve"), 1);
  EXPECT_EQ(chain_.broadcasts().size(), 1u);
  EXPECT_TRUE(Shard(1).reservation_sent());
}

// The scripted chain of the SIGKILL test: a shard opens every third height, with other events
// around it, so kills land inside and between decisions.
constexpr int64_t kKillChainHeights = 90;
void ScriptKillChain(FakeChainClient* chain, const std::string& address) {
  chain->SetAccount(address, 7, 0);
  chain->SetWeight(address, 100);
  for (int64_t h = 1; h <= kKillChainHeights; ++h) {
    chain->AddEvent(h, MakeEvent("bank.transfer", {{"amount", std::to_string(h)}}));
    if (h % 3 == 0) chain->AddEvent(h, Opened(static_cast<uint64_t>(h / 3)));
  }
}

TEST_F(HostCoreTest, SigkillAtRandomPointsNeverMissesOrRepeatsADecision) {
  options_.policy.max_shards = 1000;
  std::mt19937 rng(20240611);
  const std::string db = dir_ + "/state";
  bool finished = false;
  int kills = 0;
  auto run_child = [&](const std::string& path) {
    pid_t pid = fork();
    if (pid == 0) {
      FakeChainClient chain(kChainId);
      ScriptKillChain(&chain, address_);
      FakeClock clock;
      auto core = HostCore::Open(path, key_, options_, &chain, &clock);
      if (!core.ok()) _exit(3);
      for (int i = 0; i < 1000; ++i) {
        if (!(*core)->Step().ok()) _exit(4);
        if (*(*core)->store().CursorHeight() == kKillChainHeights) _exit(0);
      }
      _exit(5);
    }
    return pid;
  };
  // A whole run from an empty store, timed, so the kills land inside a run on any machine.
  auto probe_start = std::chrono::steady_clock::now();
  pid_t probe = run_child(dir_ + "/probe");
  ASSERT_GE(probe, 0);
  int probe_status = 0;
  ASSERT_EQ(waitpid(probe, &probe_status, 0), probe);
  ASSERT_TRUE(WIFEXITED(probe_status) && WEXITSTATUS(probe_status) == 0);
  const int whole_run_us = static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(
                                                std::chrono::steady_clock::now() - probe_start)
                                                .count());
  for (int round = 0; round < 40 && !finished; ++round) {
    pid_t pid = run_child(db);
    ASSERT_GE(pid, 0);
    // The last rounds run to the end; the others die somewhere in the middle. Each killed round
    // resumes from the last one's records, so a kill lands early in what is left of the run.
    if (round < 30) {
      usleep(std::uniform_int_distribution<int>(whole_run_us / 20, whole_run_us / 3)(rng));
      kill(pid, SIGKILL);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) {
      ++kills;
    } else {
      ASSERT_TRUE(WIFEXITED(status));
      ASSERT_EQ(WEXITSTATUS(status), 0) << "child failed in round " << round;
      if (round >= 30) finished = true;
    }

    // After every stop: the records hold whole heights, each event once, each shard decided
    // once, and exactly one pending reservation per decision.
    auto store = HostStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    int64_t cursor = *(*store)->CursorHeight();
    auto events = *(*store)->ListEvents(0, 100000);
    size_t expected_events = 0;
    for (int64_t h = 1; h <= cursor; ++h) expected_events += h % 3 == 0 ? 2 : 1;
    ASSERT_EQ(events.size(), expected_events) << "cursor " << cursor;
    std::set<std::string> reserved_shards;
    for (size_t i = 0; i < events.size(); ++i) {
      ASSERT_LE(events[i].height(), cursor);
      if (events[i].action() == "reserve") {
        ASSERT_TRUE(reserved_shards.insert(events[i].event().attributes(0).value()).second)
            << "shard reserved twice";
      }
    }
    ASSERT_EQ(static_cast<int64_t>(reserved_shards.size()), cursor / 3);
    std::set<std::string> pending_shards;
    auto pending = (*store)->ListPendingTxs();
    ASSERT_TRUE(pending.ok());
    for (const auto& tx : *pending) {
      ASSERT_TRUE(pending_shards.insert(tx.purpose()).second) << "two txs for " << tx.purpose();
    }
    ASSERT_EQ(pending_shards.size(), reserved_shards.size());
  }
  EXPECT_TRUE(finished);
  EXPECT_GE(kills, 10);
}

}  // namespace
}  // namespace ts::sidecar
