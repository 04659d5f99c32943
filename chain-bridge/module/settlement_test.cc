// The settlement on chain (docs/chain-module.md "MsgSettleTrainshard"): what pays, and every way
// a settlement is refused — signatures, weight, replays, payout rules, partial settlements,
// member keys.
#include "chain-bridge/module/app.h"

#include "chain-bridge/module/chain_test_util.h"

namespace ts::bridge::chain_test {
namespace {

TEST_F(ChainTest, SettlementWithJustOverTwoThirdsPays) {
  // Members of weight 100, 100, 100 and 50 (total 350): 100 + 100 + 50 = 250 signs, and
  // 3 * 250 = 750 > 700.
  pb::ShardSpec four = DefaultSpec();
  four.set_max_nodes(4);
  four.set_min_host_weight(1);
  uint64_t shard4 = OpenShard(four);
  std::vector<std::string> txs;
  for (int i = 0; i < 4; ++i) {
    const auto& host = hosts_[static_cast<size_t>(i == 3 ? 4 : i)];
    txs.push_back(SignTx(host, {ReserveMsg(SignedReservation(host, shard4))}));
  }
  Block(txs);
  ASSERT_EQ(app_->GetShard(shard4)->status(), pb::SHARD_STATUS_RUNNING);
  ASSERT_EQ(app_->GetShard(shard4)->total_weight(), 350u);
  pb::Settlement s = MakeSettlement(shard4);
  TxResponse settled =
      Deliver(hosts_[4], {SettleMsg(hosts_[4], s,
                                    {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                                     SignSettlement(hosts_[4], s)})});
  EXPECT_EQ(EventsOf(settled.events(), "trainshard.shard_settled")[0]["signed_weight"], "250");
  EXPECT_EQ(app_->GetShard(shard4)->status(), pb::SHARD_STATUS_SETTLED);
}

// ---------------------------------------------------------------------------------------------
// Settlement refusals: each with its code and message, and no state change beyond the sequence

class SettlementRefusals : public ChainTest {
 protected:
  void SetUp() override {
    ChainTest::SetUp();
    // Two shards from one proposal, both run by hosts 1..3.
    uint64_t proposal = PassProposal({DefaultSpec(), DefaultSpec()});
    ASSERT_EQ(app_->GetProposal(proposal)->status(), pb::PROPOSAL_STATUS_PASSED);
    ReserveThree(1);
    ReserveThree(2);
    ASSERT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_RUNNING);
    ASSERT_EQ(app_->GetShard(2)->status(), pb::SHARD_STATUS_RUNNING);
    s_ = MakeSettlement(1);
  }

  std::vector<pb::SettlementSignature> AllThree(const pb::Settlement& s) {
    return {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
            SignSettlement(hosts_[2], s)};
  }

  // Settling s_ with `first` in host 1's place beside hosts 2 and 3's real signatures is
  // refused with `code` and an error containing `fragment`.
  void ExpectFirstSignatureRefused(const pb::SettlementSignature& first, uint32_t code,
                                   const std::string& fragment) {
    ExpectRefused(
        creator_,
        {SettleMsg(creator_, s_,
                   {first, SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
        code, fragment);
  }

  pb::Settlement s_;
};

TEST_F(SettlementRefusals, ForgedSignature) {
  // An outsider's key signs, claiming to be host 1.
  ExpectFirstSignatureRefused(SignSettlement(outsider_, s_, Addr(hosts_[0])), kUnauthenticated,
                              "signature of " + Addr(hosts_[0]) + " does not verify");
  // A corrupted byte in a real signature.
  auto corrupted = SignSettlement(hosts_[0], s_);
  std::string bytes = corrupted.signature();
  bytes[10] ^= 0x01;
  corrupted.set_signature(bytes);
  ExpectFirstSignatureRefused(corrupted, kUnauthenticated, "does not verify");
  // A truncated signature.
  auto shortened = SignSettlement(hosts_[0], s_);
  shortened.set_signature(shortened.signature().substr(0, 64));
  ExpectFirstSignatureRefused(shortened, kInvalidArgument, "64 bytes, want 65");
}

TEST_F(SettlementRefusals, SignerOutsideTheShard) {
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_), SignSettlement(hosts_[3], s_)})},
      kPermissionDenied, "signer " + Addr(hosts_[3]) + " is not a member of shard 1");
}

TEST_F(SettlementRefusals, SameHostCountedTwice) {
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(hosts_[0], s_), SignSettlement(hosts_[0], s_),
                            SignSettlement(hosts_[1], s_)})},
                kInvalidArgument, "host " + Addr(hosts_[0]) + " counted twice");
}

TEST_F(SettlementRefusals, SignedWeightNotMoreThanTwoThirds) {
  ExpectRefused(creator_, {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_)})},
                kFailedPrecondition, "signed weight 100 is not more than 2/3 of 300");
  // Exactly 2/3 is not enough.
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_), SignSettlement(hosts_[1], s_)})},
      kFailedPrecondition, "signed weight 200 is not more than 2/3 of 300");
  ExpectRefused(creator_, {SettleMsg(creator_, s_, {})}, kFailedPrecondition,
                "signed weight 0 is not more than 2/3 of 300");
}

TEST_F(SettlementRefusals, ReplayedToAnotherShard) {
  // Signed for shard 1, submitted as shard 2 (same members, same escrow).
  auto sigs = AllThree(s_);
  pb::Settlement replayed = s_;
  replayed.set_shard_id(2);
  ExpectRefused(creator_, {SettleMsg(creator_, replayed, sigs)}, kUnauthenticated,
                "does not verify");
  // Signatures over shard 2's sign bytes but of a statement naming shard 1 do not carry over.
  std::vector<pb::SettlementSignature> cross = {SignSettlement(hosts_[0], s_, "", "", 2),
                                                SignSettlement(hosts_[1], s_, "", "", 2),
                                                SignSettlement(hosts_[2], s_, "", "", 2)};
  ExpectRefused(creator_, {SettleMsg(creator_, replayed, cross)}, kUnauthenticated,
                "does not verify");
}

TEST_F(SettlementRefusals, ReplayedFromAnotherChain) {
  // The statement names chain B: refused on the field itself.
  pb::Settlement other = MakeSettlement(1, "trainshard-other-2");
  ExpectRefused(creator_, {SettleMsg(creator_, other, AllThree(other))}, kInvalidArgument,
                "settlement.chain_id: 'trainshard-other-2' is not this chain 'trainshard-test-1'");
  // Signed for chain B, then the field rewritten to this chain: signatures do not verify.
  pb::Settlement rewritten = other;
  rewritten.set_chain_id(kChainId);
  ExpectRefused(creator_, {SettleMsg(creator_, rewritten, AllThree(other))}, kUnauthenticated,
                "does not verify");
  // Sign bytes made with chain B's id over a statement naming this chain: refused too.
  std::vector<pb::SettlementSignature> cross = {
      SignSettlement(hosts_[0], s_, "", "trainshard-other-2"),
      SignSettlement(hosts_[1], s_, "", "trainshard-other-2"),
      SignSettlement(hosts_[2], s_, "", "trainshard-other-2")};
  ExpectRefused(creator_, {SettleMsg(creator_, s_, cross)}, kUnauthenticated, "does not verify");
}

TEST_F(SettlementRefusals, PayoutRules) {
  pb::Settlement above = s_;
  above.set_refund("2");
  ExpectRefused(creator_, {SettleMsg(creator_, above, AllThree(above))}, kInvalidArgument,
                "payouts 899999 + refund 2 exceed escrow 900000");
  pb::Settlement below = s_;
  below.set_refund("0");
  ExpectRefused(creator_, {SettleMsg(creator_, below, AllThree(below))}, kInvalidArgument,
                "payouts 899999 + refund 0 do not add up to escrow 900000");
  // The amounts follow from the stats beside them: moved between hosts, refused.
  pb::Settlement moved = s_;
  moved.mutable_payouts(0)->set_amount("385713");
  moved.mutable_payouts(2)->set_amount("128572");
  ExpectRefused(creator_, {SettleMsg(creator_, moved, AllThree(moved))}, kInvalidArgument,
                "settlement.payouts[0].amount: 385713 does not follow from its stats");
  // A marked host forfeits its pay: still paid, refused; paid nothing, its share is refunded.
  pb::Settlement marked = s_;
  marked.mutable_payouts(2)->set_marks(1);
  ExpectRefused(creator_, {SettleMsg(creator_, marked, AllThree(marked))}, kInvalidArgument,
                "settlement.payouts[2].amount: 128571 does not follow from its stats (tokens 1000, "
                "rounds 10, marks 1, rejected 0) under the reward policy: want 0");
  // Work is counted in one unit for all: beside hosts with tokens, a host without (its work all
  // in rounds no check could reach) has none, whatever rounds it signed.
  pb::Settlement no_tokens = s_;
  no_tokens.mutable_payouts(2)->set_tokens(0);
  ExpectRefused(creator_, {SettleMsg(creator_, no_tokens, AllThree(no_tokens))}, kInvalidArgument,
                "settlement.payouts[0].amount: 385714 does not follow from its stats (tokens "
                "3000, rounds 10, marks 0, rejected 0) under the reward policy: want 450000");
  // Every contribution left out for its score (docs/verification.md "Scoring"): no tokens, yet
  // nobody is paid by its rounds instead.
  pb::Settlement unhelpful = s_;
  for (int i = 0; i < unhelpful.payouts_size(); ++i) {
    unhelpful.mutable_payouts(i)->set_tokens(0);
    unhelpful.mutable_payouts(i)->set_unhelpful(10);
  }
  ExpectRefused(creator_, {SettleMsg(creator_, unhelpful, AllThree(unhelpful))}, kInvalidArgument,
                "settlement.payouts[0].amount: 385714 does not follow");
  pb::Settlement share = s_;
  share.mutable_payouts(0)->set_amount("450001");  // max_host_share_bps 5000 of 900000
  share.set_refund("0");
  share.mutable_payouts(2)->set_amount("149999");
  ExpectRefused(creator_, {SettleMsg(creator_, share, AllThree(share))}, kInvalidArgument,
                "settlement.payouts[0].amount: 450001 exceeds the host share 450000");
  pb::Settlement outsider = s_;
  outsider.mutable_payouts(2)->set_host(Addr(hosts_[3]));
  ExpectRefused(creator_, {SettleMsg(creator_, outsider, AllThree(outsider))}, kInvalidArgument,
                "settlement.payouts[2].host: '" + Addr(hosts_[3]) + "' is not a member of shard 1");
  pb::Settlement twice = s_;
  twice.mutable_payouts(2)->set_host(Addr(hosts_[0]));
  ExpectRefused(creator_, {SettleMsg(creator_, twice, AllThree(twice))}, kInvalidArgument,
                "is paid twice");
  pb::Settlement bad_amount = s_;
  bad_amount.mutable_payouts(1)->set_amount("3e5");
  ExpectRefused(creator_, {SettleMsg(creator_, bad_amount, AllThree(bad_amount))}, kInvalidArgument,
                "settlement.payouts[1].amount");
  pb::Settlement bad_root = s_;
  bad_root.set_final_checkpoint_root("short");
  ExpectRefused(creator_, {SettleMsg(creator_, bad_root, AllThree(bad_root))}, kInvalidArgument,
                "settlement.final_checkpoint_root: 5 bytes, want 32");
  pb::Settlement unknown = s_;
  unknown.set_shard_id(99);
  ExpectRefused(creator_, {SettleMsg(creator_, unknown, AllThree(unknown))}, kNotFound,
                "shard 99 not found");
  // The marked host paid nothing and its share refunded: accepted.
  marked.mutable_payouts(2)->set_amount("0");
  marked.set_refund("128572");
  Deliver(creator_, {SettleMsg(creator_, marked, AllThree(marked))});
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(SettlementRefusals, APartialSettlementPaysForTheRoundsItCompleted) {
  pb::Settlement none = s_;
  none.set_rounds_planned(0);
  ExpectRefused(creator_, {SettleMsg(creator_, none, AllThree(none))}, kInvalidArgument,
                "settlement.rounds_planned: 0 is outside 1..100000");
  pb::Settlement more = s_;
  more.set_rounds_completed(11);
  ExpectRefused(creator_, {SettleMsg(creator_, more, AllThree(more))}, kInvalidArgument,
                "settlement.rounds_completed: 11 is outside 1..10 (rounds_planned)");
  // 10 rounds of 20: half the escrow is payable. The whole run's amounts are refused, and so
  // is a host's share of the half moved to another host.
  pb::Settlement half = s_;
  half.set_rounds_planned(20);
  ExpectRefused(creator_, {SettleMsg(creator_, half, AllThree(half))}, kInvalidArgument,
                "settlement.payouts[0].amount: 385714 exceeds the host share 225000 "
                "(max_host_share_bps 5000 of 450000 payable of escrow 900000)");
  pb::Settlement moved = half;
  const char* shifted[] = {"192858", "192857", "64284"};
  for (int i = 0; i < 3; ++i) moved.mutable_payouts(i)->set_amount(shifted[i]);
  moved.set_refund("450001");
  ExpectRefused(creator_, {SettleMsg(creator_, moved, AllThree(moved))}, kInvalidArgument,
                "settlement.payouts[0].amount: 192858 does not follow from its stats");
  // 450000 × 3000 / 7000, × 3000 / 7000, × 1000 / 7000, rounded down; the rest refunded.
  const char* amounts[] = {"192857", "192857", "64285"};
  for (int i = 0; i < 3; ++i) half.mutable_payouts(i)->set_amount(amounts[i]);
  half.set_refund("450001");
  const uint64_t creator_before = app_->Balance(Addr(creator_));
  const uint64_t host_before = app_->Balance(Addr(hosts_[2]));
  Deliver(creator_, {SettleMsg(creator_, half, AllThree(half))});
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(app_->Balance(Addr(hosts_[2])) - host_before, 64285u);
  EXPECT_EQ(app_->Balance(Addr(creator_)) - creator_before, 450001u);
}

TEST_F(SettlementRefusals, TooManySignatures) {
  auto sigs = AllThree(s_);
  sigs.push_back(SignSettlement(hosts_[0], s_));
  ExpectRefused(creator_, {SettleMsg(creator_, s_, sigs)}, kInvalidArgument,
                "4 signatures for 3 members");
}

TEST_F(SettlementRefusals, SubmitterMustSignTheTx) {
  pb::MsgSettleTrainshard msg;
  msg.set_submitter(Addr(hosts_[0]));
  *msg.mutable_settlement() = s_;
  for (const auto& sig : AllThree(s_)) *msg.add_signatures() = sig;
  // Signed by the creator while naming host 1 as submitter: refused before execution.
  ExpectRefusedTx(SignTx(creator_, {PackMsg(msg)}), Addr(creator_), Sdk(SdkCode::kUnauthorized),
                  "is not the tx signer", /*bumps_sequence=*/false);
}

TEST_F(SettlementRefusals, RefusedSettlementThenValidOneInTheSameBlock) {
  // A bad settlement and a good one in one block: the first fails alone, the second pays.
  std::string bad = SignTx(creator_, {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_)})});
  std::string good = SignTx(creator_, {SettleMsg(creator_, s_, AllThree(s_))}, 1);
  BlockOutcome outcome = Block({bad, good});
  ASSERT_EQ(outcome.results.tx_results_size(), 2);
  EXPECT_EQ(outcome.results.tx_results(0).code(), kFailedPrecondition);
  EXPECT_EQ(outcome.results.tx_results(1).code(), kOk) << outcome.results.tx_results(1).raw_log();
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(app_->Account(Addr(creator_))->second, 3u);  // proposal, bad, good
}

// ---------------------------------------------------------------------------------------------
// Settlement signatures against the members' stored keys

// n - S for the big-endian S in bytes 32..63: the high-S twin of a low-S signature, which
// recovers the same key with the other V.
std::string HighSTwin(std::string signature) {
  const std::string n =
      common::HexDecode("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141").value();
  int borrow = 0;
  for (int i = 31; i >= 0; --i) {
    int diff = static_cast<uint8_t>(n[static_cast<size_t>(i)]) -
               static_cast<uint8_t>(signature[32 + static_cast<size_t>(i)]) - borrow;
    borrow = diff < 0 ? 1 : 0;
    signature[32 + static_cast<size_t>(i)] = static_cast<char>(diff + 256 * borrow);
  }
  signature[64] = static_cast<char>(signature[64] ^ 1);
  return signature;
}

class MemberKeys : public SettlementRefusals {
 protected:
  // Replaces app_ by an App restored from its state after `edit`: a node whose state was
  // written by an earlier layout, or was corrupted.
  void RestoreEdited(const std::function<void(std::map<std::string, std::string>&)>& edit) {
    std::map<std::string, std::string> state = app_->state();
    edit(state);
    auto restored = App::Restore(genesis_, std::move(state), app_->height(), app_->app_hash());
    ASSERT_TRUE(restored.ok()) << restored.status();
    app_ = *std::move(restored);
  }

  static void EraseMemberKeys(std::map<std::string, std::string>& state, uint64_t shard_id) {
    std::string prefix = keys::MemberKey(shard_id, "");
    for (auto it = state.lower_bound(prefix);
         it != state.end() && it->first.rfind(prefix, 0) == 0;) {
      it = state.erase(it);
    }
  }

  pb::SettlementSignature WithSignature(pb::SettlementSignature sig, std::string bytes) {
    sig.set_signature(std::move(bytes));
    return sig;
  }
};

TEST_F(MemberKeys, StoredWhenTheReservationIsAccepted) {
  for (uint64_t shard = 1; shard <= 2; ++shard) {
    for (size_t i = 0; i < 3; ++i) {
      auto it = app_->state().find(keys::MemberKey(shard, Addr(hosts_[i])));
      ASSERT_NE(it, app_->state().end()) << "shard " << shard << " host " << i;
      EXPECT_EQ(it->second, UncompressMemberKey(hosts_[i].public_key()).value());
    }
  }
  EXPECT_EQ(app_->state().count(keys::MemberKey(1, Addr(hosts_[3]))), 0u);
  // The key lives beside the member record, which is unchanged (GetShard lists no key).
  EXPECT_EQ(app_->GetShard(1)->reservations_size(), 3);
}

TEST_F(MemberKeys, SignaturesAreCheckedAgainstTheStoredKey) {
  // Swapping two members' stored keys makes their genuine signatures fail: the stored key, not
  // the claimed host, is what a signature must match.
  RestoreEdited([&](std::map<std::string, std::string>& state) {
    std::swap(state[keys::MemberKey(1, Addr(hosts_[0]))],
              state[keys::MemberKey(1, Addr(hosts_[1]))]);
  });
  ExpectRefused(creator_, {SettleMsg(creator_, s_, AllThree(s_))}, kUnauthenticated,
                "signature of " + Addr(hosts_[0]) + " does not verify");
}

TEST_F(MemberKeys, ForgedMalleatedOrBadRecoveryByteIsRefused) {
  auto genuine = SignSettlement(hosts_[0], s_);
  const std::string refused = "signature of " + Addr(hosts_[0]) + " does not verify";
  // An outsider's key over the same settlement, claiming host 1.
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(outsider_, s_, Addr(hosts_[0])),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // Host 1's own signature over another settlement (a different digest).
  pb::Settlement other = s_;
  other.set_rounds_completed(11);
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(hosts_[0], other, Addr(hosts_[0])),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // V outside 0..3.
  std::string bad_v = genuine.signature();
  bad_v[64] = 4;
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, bad_v), SignSettlement(hosts_[1], s_),
                            SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // The high-S twin of the genuine signature.
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, HighSTwin(genuine.signature())),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // And the genuine one passes.
  Deliver(creator_, {SettleMsg(creator_, s_, AllThree(s_))});
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(MemberKeys, MembersRecordedWithoutAKeyAreCheckedByRecovery) {
  // State written before member keys were stored: none for shard 1, and shard 2 lacks only
  // host 2's.
  RestoreEdited([&](std::map<std::string, std::string>& state) {
    EraseMemberKeys(state, 1);
    state.erase(keys::MemberKey(2, Addr(hosts_[1])));
  });
  ASSERT_EQ(app_->state().count(keys::MemberKey(1, Addr(hosts_[0]))), 0u);
  auto genuine = SignSettlement(hosts_[0], s_);
  const std::string refused = "signature of " + Addr(hosts_[0]) + " does not verify";
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(outsider_, s_, Addr(hosts_[0])),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // Recovery binds V: the genuine signature with the other parity recovers another key.
  std::string flipped = genuine.signature();
  flipped[64] = static_cast<char>(flipped[64] ^ 1);
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, flipped), SignSettlement(hosts_[1], s_),
                            SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, HighSTwin(genuine.signature())),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);

  TxResponse settled = Deliver(creator_, {SettleMsg(creator_, s_, AllThree(s_))});
  EXPECT_EQ(EventsOf(settled.events(), "trainshard.shard_settled")[0]["signed_weight"], "300");
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(app_->Balance(Addr(hosts_[0])), 1000u + 385714);

  // Shard 2 mixes both: hosts 1 and 3 by their stored keys, host 2 by recovery.
  pb::Settlement s2 = MakeSettlement(2);
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s2,
                 {SignSettlement(hosts_[0], s2), SignSettlement(outsider_, s2, Addr(hosts_[1])),
                  SignSettlement(hosts_[2], s2)})},
      kUnauthenticated, "signature of " + Addr(hosts_[1]) + " does not verify");
  Deliver(creator_, {SettleMsg(creator_, s2, AllThree(s2))});
  EXPECT_EQ(app_->GetShard(2)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(MemberKeys, StoredKeyOfTheWrongSizeIsDataLoss) {
  RestoreEdited([&](std::map<std::string, std::string>& state) {
    state[keys::MemberKey(1, Addr(hosts_[0]))] = hosts_[0].public_key();  // 33 bytes
  });
  constexpr uint32_t kDataLoss = 15;
  ExpectRefused(creator_, {SettleMsg(creator_, s_, AllThree(s_))}, kDataLoss, "33 bytes, want 65");
}

TEST_F(ChainTest, SettleAfterExpiry) {
  uint64_t shard = OpenShard(DefaultSpec());
  ReserveThree(shard);
  ASSERT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_RUNNING);
  int64_t deadline = app_->GetShard(shard)->deadline_height();
  uint64_t creator_before = app_->Balance(Addr(creator_));
  AdvanceTo(deadline);
  auto expired = EventsOf(last_.results.end_block_events(), "trainshard.shard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]["reason"], "timeout");
  EXPECT_EQ(expired[0]["refund"], "900000");
  EXPECT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_EXPIRED);
  EXPECT_EQ(app_->GetShard(shard)->close_reason(), pb::CLOSE_REASON_TIMEOUT);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before + 900000);
  pb::Settlement s = MakeSettlement(shard);
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s,
                 {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                  SignSettlement(hosts_[2], s)})},
      kFailedPrecondition,
      "shard " + std::to_string(shard) + " expired at height " + std::to_string(deadline));
}

// ---------------------------------------------------------------------------------------------
// Reservations

}  // namespace
}  // namespace ts::bridge::chain_test
