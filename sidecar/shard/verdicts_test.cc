#include "sidecar/shard/verdicts.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;
using Judgement = VerdictTally::Judgement;

constexpr char kChain[] = "verdicts-test-1";

struct Host {
  common::PrivateKey key = common::PrivateKey::Generate();
  std::string address = common::AddressFromPublicKey(key.public_key());
};

class VerdictsTest : public ::testing::Test {
 protected:
  VerdictsTest() {
    view_.shard_id = 7;
    for (const Host& h : hosts_) view_.members.push_back({h.address, "127.0.0.1:1", 10});
  }

  // hosts_[validator]'s signed verdict on hosts_[member]'s round.
  pb::SignedVerdict Verdict(size_t validator, size_t member, uint64_t round, bool reproduced) {
    pb::Verdict v;
    v.set_shard_id(7);
    v.set_round(round);
    v.set_member(hosts_[member].address);
    v.set_validator(hosts_[validator].address);
    v.set_committed(common::Sha256(absl::StrCat("delta ", member, " ", round)));
    v.set_replayed(reproduced ? v.committed() : common::Sha256("another delta"));
    v.set_assignment(common::Sha256("assignment"));
    v.set_reproduced(reproduced);
    auto s = SignVerdict(hosts_[validator].key, kChain, v);
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  }
  // A certified result of `round` with every host's contribution, carrying `verdicts`.
  pb::RoundResult Carrying(uint64_t round, std::vector<pb::SignedVerdict> verdicts) const {
    pb::RoundResult r;
    r.set_round(round);
    r.set_new_root(common::Sha256(absl::StrCat("root ", round)));
    for (const Host& h : hosts_) {
      r.add_members(h.address);
      pb::Contribution* c = r.add_contributions();
      c->set_host(h.address);
    }
    for (auto& v : verdicts) *r.add_verdicts() = std::move(v);
    return r;
  }
  // The index of the validator `tally` drew for hosts_[member]'s round, and the two others.
  struct Roles {
    size_t validator = 0;
    std::vector<size_t> others;
  };
  Roles RolesOf(const VerdictTally& tally, uint64_t round, size_t member) const {
    Roles roles;
    for (const VerdictTally::Draw& d : tally.Draws(round)) {
      if (d.member != hosts_[member].address) continue;
      for (size_t i = 0; i < hosts_.size(); ++i) {
        if (hosts_[i].address == d.validator) roles.validator = i;
      }
    }
    for (size_t i = 0; i < hosts_.size(); ++i) {
      if (i != member && i != roles.validator) roles.others.push_back(i);
    }
    return roles;
  }
  static pb::VerificationSpec Every() {
    pb::VerificationSpec spec;
    spec.set_commitments(true);
    spec.set_replay_rate_bps(10000);
    spec.set_marked_replay_rate_bps(10000);
    spec.set_exclude_after_marks(2);
    return spec;
  }
  absl::Status Check(std::vector<pb::SignedVerdict> verdicts, uint64_t round, int max = 64) {
    google::protobuf::RepeatedPtrField<pb::SignedVerdict> field;
    for (auto& v : verdicts) *field.Add() = std::move(v);
    return CheckVerdicts(kChain, field, round, view_, "plan.verdicts", max);
  }
  const std::string& A(size_t i) const { return hosts_[i].address; }

  std::vector<Host> hosts_ = std::vector<Host>(4);
  ShardView view_;
};

TEST_F(VerdictsTest, ASignedVerdictChecksAndEveryAlterationIsNamed) {
  EXPECT_TRUE(Check({Verdict(1, 0, 3, false), Verdict(2, 0, 3, true)}, 4).ok());

  pb::SignedVerdict forged = Verdict(1, 0, 3, false);
  forged.mutable_verdict()->set_validator(A(2));  // claims another validator
  EXPECT_THAT(Check({forged}, 4).message(), HasSubstr("not by its validator"));
  pb::SignedVerdict flipped = Verdict(1, 0, 3, false);
  flipped.mutable_verdict()->set_replayed(flipped.verdict().committed());
  EXPECT_THAT(Check({flipped}, 4).message(), HasSubstr("reproduced does not say"));
  EXPECT_THAT(Check({Verdict(1, 1, 3, false)}, 4).message(), HasSubstr("judges itself"));
  EXPECT_THAT(Check({Verdict(1, 0, 4, false)}, 4).message(), HasSubstr("about round 4"));
  EXPECT_THAT(Check({Verdict(1, 0, 3, false)}, 3 + kVerdictRounds + 1).message(),
              HasSubstr("about round 3"));
  EXPECT_THAT(Check({Verdict(1, 0, 3, false), Verdict(1, 0, 3, true)}, 4).message(),
              HasSubstr("a second verdict"));
  EXPECT_THAT(Check({Verdict(1, 0, 3, false), Verdict(2, 0, 3, false)}, 4, 1).message(),
              HasSubstr("at most 1"));
  Host outsider;
  pb::Verdict v = Verdict(1, 0, 3, false).verdict();
  v.set_validator(outsider.address);
  auto by_outsider = SignVerdict(outsider.key, kChain, v);
  ASSERT_TRUE(by_outsider.ok());
  EXPECT_EQ(Check({*by_outsider}, 4).code(), absl::StatusCode::kPermissionDenied);
}

// A verdict about a round the member evaluated also holds its evaluation to the validator's
// re-evaluation: the same Δ with another loss is a failure, and a verdict must say so.
TEST_F(VerdictsTest, AVerdictHoldsTheMembersEvaluationToTheReevaluation) {
  auto signed_as = [&](pb::Verdict v) {
    auto s = SignVerdict(hosts_[1].key, kChain, std::move(v));
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  };
  pb::Verdict same = Verdict(1, 0, 3, true).verdict();
  same.set_evaluated(true);
  same.set_evaluation_loss_micro(4'500'000);
  same.set_reevaluation_loss_micro(4'500'000);
  EXPECT_TRUE(Check({signed_as(same)}, 4).ok());
  pb::Verdict lied = same;
  lied.set_evaluation_loss_micro(3'500'000);
  EXPECT_THAT(Check({signed_as(lied)}, 4).message(), HasSubstr("re-evaluation the evaluation"));
  lied.set_reproduced(false);
  EXPECT_TRUE(Check({signed_as(lied)}, 4).ok());
  pb::Verdict unsaid = Verdict(1, 0, 3, true).verdict();
  unsaid.set_reevaluation_loss_micro(1);
  EXPECT_THAT(Check({signed_as(unsaid)}, 4).message(), HasSubstr("without evaluated"));
}

TEST_F(VerdictsTest, AFailureConfirmedByMoreThanTwoThirdsMarksTheMemberAndExcludesItAtTheLimit) {
  VerdictTally tally(view_, Every());
  tally.Add(Carrying(1, {}));
  tally.Add(Carrying(2, {}));
  tally.Add(Carrying(3, {}));
  ASSERT_EQ(tally.Draws(3).size(), 4u);  // every member, at 10000 bps
  const Roles r = RolesOf(tally, 3, 0);
  tally.Add(Carrying(4, {Verdict(r.validator, 0, 3, false)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kOpen);
  // The accused and the validator are not asked again; the two others are.
  EXPECT_TRUE(tally.Unanswered(A(0)).empty());
  EXPECT_TRUE(tally.Unanswered(A(r.validator)).empty());
  EXPECT_EQ(tally.Unanswered(A(r.others[0])).size(), 1u);
  tally.Add(Carrying(5, {Verdict(r.others[0], 0, 3, false)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kOpen);  // 20 of the others' 30: not > 2/3
  tally.Add(Carrying(6, {Verdict(r.others[1], 0, 3, false)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kConfirmed);  // 30 of 30
  EXPECT_EQ(tally.Marks(A(0)), 1u);
  EXPECT_FALSE(tally.Excluded(A(0)));
  EXPECT_FALSE(tally.Verified(3, A(0)));
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(tally.Marks(A(i)), 0u);
  EXPECT_TRUE(tally.Unanswered(A(r.others[1])).empty());

  const Roles r5 = RolesOf(tally, 5, 0);
  tally.Add(Carrying(7, {Verdict(r5.validator, 0, 5, false)}));
  tally.Add(Carrying(8, {Verdict(r5.others[0], 0, 5, false), Verdict(r5.others[1], 0, 5, false)}));
  EXPECT_EQ(tally.Marks(A(0)), 2u);
  EXPECT_TRUE(tally.Excluded(A(0)));
  // A round already read is not read again.
  tally.Add(Carrying(8, {Verdict(r5.validator, 0, 6, false)}));
  EXPECT_EQ(tally.JudgementOf(6, A(0)), Judgement::kNone);
}

TEST_F(VerdictsTest, OnlyTheDrawnValidatorMayAccuseAndOnlyAnAccusationCallsForOtherVerdicts) {
  VerdictTally tally(view_, Every());
  for (uint64_t round = 1; round <= 3; ++round) tally.Add(Carrying(round, {}));
  const Roles r = RolesOf(tally, 3, 0);
  // A member that was not drawn accuses: ignored, nobody is asked to replay.
  tally.Add(Carrying(4, {Verdict(r.others[0], 0, 3, false), Verdict(r.others[1], 0, 3, true)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kNone);
  EXPECT_TRUE(tally.Unanswered(A(r.validator)).empty());
  // A round outside the draws' window is not drawn any more.
  VerdictTally late(view_, Every());
  for (uint64_t round = 1; round <= 3 + kVerdictRounds + 1; ++round) late.Add(Carrying(round, {}));
  EXPECT_TRUE(late.Draws(3).empty());
  EXPECT_FALSE(late.Draws(3 + kVerdictRounds + 1).empty());
}

// One liar of four equal hosts is overruled by the two others, whose weight is all the shard
// has besides the accused and the accuser; one of them alone leaves the verdict open.
TEST_F(VerdictsTest, ALyingValidatorIsOverruledAndMarkedAndTheMemberIsVerified) {
  {
    VerdictTally tally(view_, Every());
    for (uint64_t round = 1; round <= 3; ++round) tally.Add(Carrying(round, {}));
    const Roles r = RolesOf(tally, 3, 0);
    tally.Add(Carrying(4, {Verdict(r.validator, 0, 3, false)}));
    tally.Add(Carrying(5, {Verdict(r.others[0], 0, 3, true)}));
    EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kOpen);  // 10 of 20: not more than 2/3
    EXPECT_EQ(tally.Marks(A(r.validator)), 0u);
  }
  ShardView weighted = view_;
  VerdictTally probe(view_, Every());
  for (uint64_t round = 1; round <= 3; ++round) probe.Add(Carrying(round, {}));
  const Roles r = RolesOf(probe, 3, 0);
  // The two others hold more weight than the accused and the liar: 40 of the others' 50.
  weighted.members[r.others[0]].weight = 20;
  weighted.members[r.others[1]].weight = 20;
  for (const ShardView* view : {&view_, &weighted}) {
    VerdictTally tally(*view, Every());
    for (uint64_t round = 1; round <= 3; ++round) tally.Add(Carrying(round, {}));
    tally.Add(Carrying(4, {Verdict(r.validator, 0, 3, false)}));  // a lie
    tally.Add(Carrying(5, {Verdict(r.others[0], 0, 3, true), Verdict(r.others[1], 0, 3, true)}));
    // Equal weights: 20 of the 20 neither accused nor accusing say it reproduces (more than
    // 2/3 of them, and more than 1/3 of the shard's 40); weighted, 40 of 40.
    EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kRejected);
    EXPECT_EQ(tally.Marks(A(r.validator)), 1u);
    EXPECT_EQ(tally.Marks(A(0)), 0u);
    EXPECT_TRUE(tally.Verified(3, A(0)));
  }
}

TEST_F(VerdictsTest, AValidatorThatPassesAConfirmedFailureIsMarked) {
  VerdictTally tally(view_, Every());
  for (uint64_t round = 1; round <= 3; ++round) tally.Add(Carrying(round, {}));
  const Roles r = RolesOf(tally, 3, 0);
  tally.Add(Carrying(4, {Verdict(r.validator, 0, 3, false)}));
  // One of the others covers for the member; the other confirms; then a fifth host's weight
  // would be needed — with four equal hosts 20 of 30 is no quorum, so give the confirmer more.
  ShardView weighted = view_;
  weighted.members[r.validator].weight = 20;
  weighted.members[r.others[1]].weight = 20;
  VerdictTally heavy(weighted, Every());
  for (uint64_t round = 1; round <= 3; ++round) heavy.Add(Carrying(round, {}));
  heavy.Add(Carrying(4, {Verdict(r.validator, 0, 3, false)}));
  heavy.Add(Carrying(5, {Verdict(r.others[0], 0, 3, true), Verdict(r.others[1], 0, 3, false)}));
  EXPECT_EQ(heavy.JudgementOf(3, A(0)), Judgement::kConfirmed);  // 40 of the others' 50
  EXPECT_EQ(heavy.Marks(A(0)), 1u);
  EXPECT_EQ(heavy.Marks(A(r.others[0])), 1u);
  EXPECT_EQ(heavy.Marks(A(r.validator)), 0u);
  EXPECT_FALSE(heavy.Verified(3, A(0)));
}

}  // namespace
}  // namespace ts::sidecar
