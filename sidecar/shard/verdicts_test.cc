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
  // A certified result of `round` carrying `verdicts`.
  static pb::RoundResult Carrying(uint64_t round, std::vector<pb::SignedVerdict> verdicts) {
    pb::RoundResult r;
    r.set_round(round);
    for (auto& v : verdicts) *r.add_verdicts() = std::move(v);
    return r;
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

TEST_F(VerdictsTest, AFailureConfirmedByMoreThanTwoThirdsMarksTheMemberAndExcludesItAtTheLimit) {
  VerdictTally tally(view_, 2);
  tally.Add(Carrying(4, {Verdict(1, 0, 3, false)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kOpen);
  // The accused and the validator are not asked again; the two others are.
  EXPECT_TRUE(tally.Unanswered(A(0)).empty());
  EXPECT_TRUE(tally.Unanswered(A(1)).empty());
  EXPECT_EQ(tally.Unanswered(A(2)).size(), 1u);
  tally.Add(Carrying(5, {Verdict(2, 0, 3, false)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kOpen);  // 20 of the others' 30: not > 2/3
  tally.Add(Carrying(6, {Verdict(3, 0, 3, false)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kConfirmed);  // 30 of 30
  EXPECT_EQ(tally.Marks(A(0)), 1u);
  EXPECT_FALSE(tally.Excluded(A(0)));
  EXPECT_FALSE(tally.Verified(3, A(0)));
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(tally.Marks(A(i)), 0u);
  EXPECT_TRUE(tally.Unanswered(A(3)).empty());

  tally.Add(
      Carrying(7, {Verdict(1, 0, 5, false), Verdict(2, 0, 5, false), Verdict(3, 0, 5, false)}));
  EXPECT_EQ(tally.Marks(A(0)), 2u);
  EXPECT_TRUE(tally.Excluded(A(0)));
  // A round already read is not read again.
  tally.Add(Carrying(7, {Verdict(1, 2, 6, false)}));
  EXPECT_EQ(tally.JudgementOf(6, A(2)), Judgement::kNone);
}

TEST_F(VerdictsTest, ALyingValidatorIsOverruledAndMarkedAndTheMemberIsVerified) {
  VerdictTally tally(view_, 2);
  tally.Add(Carrying(4, {Verdict(1, 0, 3, false)}));  // hosts_[1] lies
  tally.Add(Carrying(5, {Verdict(2, 0, 3, true), Verdict(3, 0, 3, true)}));
  // 20 of the others' 30 say it reproduces: not more than 2/3, so the verdict stays open (the
  // member keeps its pay, the liar is not marked). With more weight behind the two others:
  ShardView weighted = view_;
  weighted.members[2].weight = 20;
  weighted.members[3].weight = 20;
  VerdictTally heavy(weighted, 2);
  heavy.Add(Carrying(4, {Verdict(1, 0, 3, false)}));
  heavy.Add(Carrying(5, {Verdict(2, 0, 3, true), Verdict(3, 0, 3, true)}));
  EXPECT_EQ(heavy.JudgementOf(3, A(0)), Judgement::kRejected);  // 40 of the others' 50
  EXPECT_EQ(heavy.Marks(A(1)), 1u);
  EXPECT_EQ(heavy.Marks(A(0)), 0u);
  EXPECT_TRUE(heavy.Verified(3, A(0)));
}

TEST_F(VerdictsTest, AValidatorThatPassesAConfirmedFailureIsMarked) {
  VerdictTally tally(view_, 2);
  tally.Add(Carrying(4, {Verdict(1, 0, 3, true)}));  // covers for hosts_[0]
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kNone);
  EXPECT_TRUE(tally.Verified(3, A(0)));
  // Caught on another draw: the others confirm round 3 too (each replays what it is asked).
  tally.Add(Carrying(5, {Verdict(2, 0, 3, false), Verdict(3, 0, 3, false)}));
  EXPECT_EQ(tally.JudgementOf(3, A(0)), Judgement::kOpen);  // 20 of the others' 30
  ShardView weighted = view_;
  weighted.members[2].weight = 20;
  weighted.members[3].weight = 20;
  VerdictTally heavy(weighted, 2);
  heavy.Add(Carrying(4, {Verdict(1, 0, 3, true)}));
  heavy.Add(Carrying(5, {Verdict(2, 0, 3, false), Verdict(3, 0, 3, false)}));
  EXPECT_EQ(heavy.JudgementOf(3, A(0)), Judgement::kConfirmed);
  EXPECT_EQ(heavy.Marks(A(0)), 1u);
  EXPECT_EQ(heavy.Marks(A(1)), 1u);
  EXPECT_FALSE(heavy.Verified(3, A(0)));
}

}  // namespace
}  // namespace ts::sidecar
