#include "sidecar/shard/ledger.h"

#include <set>
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

constexpr char kChain[] = "ledger-test-1";

struct Host {
  common::PrivateKey key = common::PrivateKey::Generate();
  std::string address = common::AddressFromPublicKey(key.public_key());
};

// The verified-work reward policy with a host's share capped at `max_host_share_bps`.
pb::RewardPolicy VerifiedWork(uint32_t max_host_share_bps) {
  pb::RewardPolicy policy;
  policy.set_kind(pb::RewardPolicy::KIND_VERIFIED_WORK);
  policy.set_max_host_share_bps(max_host_share_bps);
  return policy;
}

struct Fixture {
  std::vector<Host> hosts = std::vector<Host>(4);
  ShardView view;
  Fixture(std::vector<uint64_t> weights = {30, 30, 20, 20}) {
    view.shard_id = 7;
    for (size_t i = 0; i < hosts.size(); ++i) {
      view.members.push_back({hosts[i].address, "127.0.0.1:1", weights[i]});
    }
  }
  pb::RoundResult Result(uint64_t round) const {
    pb::RoundResult r;
    r.set_shard_id(7);
    r.set_round(round);
    r.set_base_root(std::string(32, static_cast<char>(round)));
    r.set_new_root(std::string(32, static_cast<char>(round + 1)));
    for (const Host& h : hosts) r.add_members(h.address);
    for (size_t i = 0; with_contributions && i < hosts.size(); ++i) {
      pb::Contribution* c = r.add_contributions();
      c->set_host(hosts[i].address);
      c->set_delta_commitment(common::Sha256(absl::StrCat("delta ", i)));
      c->set_assignment(AssignmentIdOf("spec", "seed", round, hosts[i].address));
      c->set_tokens(1024);
    }
    return r;
  }
  bool with_contributions = false;
  // A certificate of `round` signed by hosts[signers...], with an evaluation by each.
  pb::RoundCertificate Certify(uint64_t round, std::vector<size_t> signers) const {
    pb::RoundCertificate c;
    *c.mutable_result() = Result(round);
    std::vector<int64_t> losses;
    for (size_t i : signers) {
      pb::MemberSignature* s = c.add_signatures();
      s->set_host(hosts[i].address);
      s->set_signature(*SignRoundResult(hosts[i].key, kChain, c.result()));
      c.set_signed_weight(c.signed_weight() + view.members[i].weight);
      pb::SignedEvaluation* e = c.add_evaluations();
      e->mutable_result()->set_shard_id(7);
      e->mutable_result()->set_round(round);
      e->mutable_result()->set_checkpoint_root(c.result().new_root());
      e->mutable_result()->set_loss_micro(3'000'000 + 1000 * static_cast<int64_t>(i));
      e->mutable_result()->set_host(hosts[i].address);
      e->set_signature(*SignEvaluation(hosts[i].key, kChain, e->result()));
      losses.push_back(e->result().loss_micro());
    }
    c.set_total_weight(TotalWeight(view));
    c.set_eval_loss_micro(MedianOf(losses));
    return c;
  }
};

TEST(Ledger, PlannerOrderIsAPermutationThatDependsOnSeedAndRound) {
  Fixture f;
  auto a = PlannerOrder(1, 1, f.view.members);
  auto b = PlannerOrder(1, 1, f.view.members);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 4u);
  std::set<std::string> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), 4u);
  // Over rounds, more than one host plans first.
  std::set<std::string> firsts;
  for (uint64_t r = 1; r <= 32; ++r) firsts.insert(PlannerOrder(1, r, f.view.members)[0]);
  EXPECT_GT(firsts.size(), 1u);
  EXPECT_NE(DataSeedOf(1, 2, std::string(32, 'a')), DataSeedOf(1, 3, std::string(32, 'a')));
  EXPECT_NE(DataSeedOf(1, 2, std::string(32, 'a')), DataSeedOf(1, 2, std::string(32, 'b')));
}

TEST(Ledger, QuorumIsStrictlyMoreThanTwoThirds) {
  EXPECT_FALSE(HasQuorum(2, 3));
  EXPECT_TRUE(HasQuorum(201, 300));
  EXPECT_FALSE(HasQuorum(200, 300));
  EXPECT_TRUE(HasQuorum(UINT64_MAX, UINT64_MAX));
}

TEST(Ledger, PlanSignatureBindsPlannerAndMembers) {
  Fixture f;
  pb::RoundPlan plan;
  plan.set_shard_id(7);
  plan.set_round(3);
  plan.set_planner(f.hosts[1].address);
  for (int i = 0; i < 3; ++i) {
    auto* m = plan.add_members();
    m->set_address(f.hosts[i].address);
    m->set_collective_endpoint("127.0.0.1:9");
  }
  plan.set_base_root(std::string(32, 'b'));
  plan.set_data_seed(std::string(32, 's'));
  ASSERT_TRUE(SignPlan(f.hosts[1].key, kChain, &plan).ok());
  EXPECT_TRUE(VerifyPlan(kChain, plan, f.view).ok());
  pb::RoundPlan tampered = plan;
  tampered.mutable_members(0)->set_collective_endpoint("10.0.0.1:9");
  EXPECT_EQ(VerifyPlan(kChain, tampered, f.view).code(), absl::StatusCode::kUnauthenticated);
  pb::RoundPlan other_signer = plan;
  ASSERT_TRUE(SignPlan(f.hosts[2].key, kChain, &other_signer).ok());
  EXPECT_THAT(VerifyPlan(kChain, other_signer, f.view).message(), HasSubstr("not by"));
  pb::RoundPlan stranger = plan;
  stranger.mutable_members(2)->set_address("gonka1stranger");
  EXPECT_EQ(VerifyPlan(kChain, stranger, f.view).code(), absl::StatusCode::kPermissionDenied);
  pb::RoundPlan twice = plan;
  twice.mutable_members(2)->set_address(f.hosts[0].address);
  EXPECT_THAT(VerifyPlan(kChain, twice, f.view).message(), HasSubstr("appears twice"));
  // A thread count no replay could run with, signed by the planner itself.
  pb::RoundPlan greedy = plan;
  greedy.mutable_members(1)->set_worker_threads(5000);
  ASSERT_TRUE(SignPlan(f.hosts[1].key, kChain, &greedy).ok());
  EXPECT_THAT(VerifyPlan(kChain, greedy, f.view).message(),
              HasSubstr("members[1].worker_threads: 5000 is more than 1024"));
}

TEST(Ledger, CertificateNeedsMoreThanTwoThirdsOfTheShardWeight) {
  Fixture f;  // weights 30 30 20 20
  EXPECT_TRUE(VerifyCertificate(kChain, f.Certify(1, {0, 1, 2}), f.view).ok());     // 80
  absl::Status short_of = VerifyCertificate(kChain, f.Certify(1, {0, 1}), f.view);  // 60
  EXPECT_EQ(short_of.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(short_of.message(), HasSubstr("not more than 2/3"));
}

TEST(Ledger, CertificateRefusesForgedOrInflatedParts) {
  Fixture f;
  pb::RoundCertificate good = f.Certify(2, {0, 1, 2, 3});
  ASSERT_TRUE(VerifyCertificate(kChain, good, f.view).ok());

  pb::RoundCertificate other_root = good;
  other_root.mutable_result()->set_new_root(std::string(32, 'x'));
  EXPECT_EQ(VerifyCertificate(kChain, other_root, f.view).code(),
            absl::StatusCode::kUnauthenticated);

  pb::RoundCertificate duplicated = f.Certify(2, {0, 1});
  *duplicated.add_signatures() = duplicated.signatures(0);
  EXPECT_THAT(VerifyCertificate(kChain, duplicated, f.view).message(), HasSubstr("signs twice"));

  pb::RoundCertificate inflated = good;
  inflated.set_signed_weight(1000);
  EXPECT_THAT(VerifyCertificate(kChain, inflated, f.view).message(),
              HasSubstr("the signatures give"));

  pb::RoundCertificate bad_median = good;
  bad_median.set_eval_loss_micro(1);
  EXPECT_THAT(VerifyCertificate(kChain, bad_median, f.view).message(), HasSubstr("median"));

  pb::RoundCertificate forged_eval = good;
  forged_eval.mutable_evaluations(0)->mutable_result()->set_loss_micro(1);
  EXPECT_EQ(VerifyCertificate(kChain, forged_eval, f.view).code(),
            absl::StatusCode::kUnauthenticated);

  // Signed for another chain.
  EXPECT_EQ(VerifyCertificate("other-chain", good, f.view).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(Ledger, ContributionsAreSignedOnePerMemberInPlanOrder) {
  Fixture f;
  f.with_contributions = true;
  pb::RoundCertificate good = f.Certify(3, {0, 1, 2, 3});
  ASSERT_TRUE(VerifyCertificate(kChain, good, f.view).ok());

  // A commitment changed after the members signed: the signatures no longer verify.
  pb::RoundCertificate changed = good;
  changed.mutable_result()->mutable_contributions(1)->set_delta_commitment(std::string(32, 'z'));
  EXPECT_EQ(VerifyCertificate(kChain, changed, f.view).code(), absl::StatusCode::kUnauthenticated);

  pb::RoundCertificate missing = good;
  missing.mutable_result()->mutable_contributions()->RemoveLast();
  EXPECT_THAT(VerifyCertificate(kChain, missing, f.view).message(),
              HasSubstr("3 contributions for 4 members"));

  pb::RoundCertificate swapped = good;
  swapped.mutable_result()->mutable_contributions()->SwapElements(0, 1);
  EXPECT_THAT(VerifyCertificate(kChain, swapped, f.view).message(),
              HasSubstr("contributions[0].host: " + f.hosts[1].address + " is not members[0]"));

  pb::RoundCertificate short_commitment = good;
  short_commitment.mutable_result()->mutable_contributions(2)->set_delta_commitment("abc");
  EXPECT_THAT(VerifyCertificate(kChain, short_commitment, f.view).message(),
              HasSubstr("contributions[2]: delta_commitment and assignment must be 32 bytes, "
                        "not 3 and 32"));
}

TEST(Ledger, AssignmentIdNamesTheSpecTheSeedTheRoundAndTheHost) {
  const std::string id = AssignmentIdOf("spec", "seed", 4, "host");
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(id, AssignmentIdOf("spec", "seed", 4, "host"));
  EXPECT_NE(id, AssignmentIdOf("spec2", "seed", 4, "host"));
  EXPECT_NE(id, AssignmentIdOf("spec", "seed2", 4, "host"));
  EXPECT_NE(id, AssignmentIdOf("spec", "seed", 5, "host"));
  EXPECT_NE(id, AssignmentIdOf("spec", "seed", 4, "host2"));
  // Lengths are part of the hash: moving bytes between fields gives another id.
  EXPECT_NE(AssignmentIdOf("ab", "c", 1, "h"), AssignmentIdOf("a", "bc", 1, "h"));
}

TEST(Ledger, ReplaysAreDrawnFromTheCertifiedRootAndNeverByTheMemberItself) {
  Fixture f;
  f.with_contributions = true;
  pb::RoundResult result = f.Result(2);
  EXPECT_TRUE(DrawReplays(result, 0).empty());
  // At 100 % every member is checked, each by another member.
  std::vector<ReplayDraw> all = DrawReplays(result, 10000);
  ASSERT_EQ(all.size(), 4u);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].member, i);
    EXPECT_NE(all[i].validator, i);
    EXPECT_LT(all[i].validator, 4u);
  }
  // At 25 %, about a quarter of the member-rounds over many roots; the same root draws the same.
  size_t drawn = 0;
  std::set<size_t> validators;
  for (int k = 0; k < 400; ++k) {
    result.set_new_root(common::Sha256(absl::StrCat("root ", k)));
    std::vector<ReplayDraw> draws = DrawReplays(result, 2500);
    drawn += draws.size();
    for (const ReplayDraw& d : draws) validators.insert(d.validator);
    EXPECT_EQ(DrawReplays(result, 2500).size(), draws.size());
  }
  EXPECT_GT(drawn, 300u);  // 400 expected of 1,600
  EXPECT_LT(drawn, 500u);
  EXPECT_EQ(validators.size(), 4u);
  // A round without contributions (no commitments) draws nothing.
  EXPECT_TRUE(DrawReplays(Fixture().Result(2), 10000).empty());
}

TEST(Ledger, MedianIsTheLowerMedian) {
  EXPECT_EQ(MedianOf({}), 0);
  EXPECT_EQ(MedianOf({5}), 5);
  EXPECT_EQ(MedianOf({9, 1, 5}), 5);
  EXPECT_EQ(MedianOf({4, 1, 3, 2}), 2);
  EXPECT_EQ(MedianOf({1, 1000000, 2}), 2);  // one outlier does not move it
}

TEST(Ledger, SettlementPaysByContributionWithTheCapAndRefundsTheRest) {
  Fixture f;
  std::vector<pb::RoundCertificate> certs = {f.Certify(1, {0, 1, 2}), f.Certify(2, {0, 1, 2, 3}),
                                             f.Certify(3, {0, 1, 2, 3})};
  const pb::RewardPolicy policy = VerifiedWork(5000);
  const pb::VerificationSpec none;
  auto s = DraftSettlement(kChain, f.view, 1100, policy, none, certs, 3);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->final_checkpoint_root(), certs.back().result().new_root());
  EXPECT_EQ(s->rounds_completed(), 3u);
  EXPECT_EQ(s->evaluation().value_micro(), certs.back().eval_loss_micro());
  EXPECT_EQ(s->evaluation().evaluators(), 4u);
  uint64_t paid = 0;
  for (const auto& p : s->payouts()) {
    const uint64_t n = p.host() == f.hosts[3].address ? 2 : 3;
    EXPECT_EQ(p.rounds_contributed(), n);
    EXPECT_EQ(std::stoull(p.amount()), 1100 * n / 11);
    paid += std::stoull(p.amount());
  }
  EXPECT_EQ(std::stoull(s->refund()), 1100 - paid);
  // Sorted by host, so every member drafts the same bytes.
  for (int i = 1; i < s->payouts_size(); ++i) {
    EXPECT_LT(s->payouts(i - 1).host(), s->payouts(i).host());
  }
  // The cap: one host alone would get everything; it gets half, the rest is refunded.
  pb::RoundCertificate solo = f.Certify(1, {0, 1, 2});
  solo.mutable_signatures()->DeleteSubrange(1, 2);
  std::vector<pb::RoundCertificate> solo_certs = {solo};
  auto capped = DraftSettlement(kChain, f.view, 1000, policy, none, solo_certs, 1);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->payouts(0).amount(), "500");
  EXPECT_EQ(capped->refund(), "500");
  // Missing rounds are refused.
  std::vector<pb::RoundCertificate> gap = {certs[0], certs[2]};
  EXPECT_THAT(DraftSettlement(kChain, f.view, 1000, policy, none, gap, 2).status().message(),
              HasSubstr("round 3, want 2"));
  EXPECT_FALSE(DraftSettlement(kChain, f.view, 1000, policy, none, certs, 2).ok());
  EXPECT_FALSE(DraftSettlement(kChain, f.view, 1000, policy, none, {}, 2).ok());
}

TEST(Ledger, WithReplaysTheLastTwoRoundsPayNobody) {
  Fixture f;
  f.with_contributions = true;
  std::vector<pb::RoundCertificate> certs;
  for (uint64_t r = 1; r <= 4; ++r) certs.push_back(f.Certify(r, {0, 1, 2, 3}));
  // Host 3 claims ten times the tokens in the last two rounds, where no check can reach.
  for (size_t r : {2, 3}) certs[r].mutable_result()->mutable_contributions(3)->set_tokens(10240);
  const pb::RewardPolicy policy = VerifiedWork(10000);
  pb::VerificationSpec replays;
  replays.set_replay_rate_bps(800);
  auto s = DraftSettlement(kChain, f.view, 1000, policy, replays, certs, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const pb::HostPayout& p : s->payouts()) {
    EXPECT_EQ(p.tokens(), 2048u) << p.host();
    EXPECT_EQ(p.rounds_contributed(), 4u);
    EXPECT_EQ(p.amount(), "250");  // the whole escrow, shared by rounds 1 and 2's work
  }
  // Without replays nothing is checked and every round is paid: host 3's claim too.
  auto trusting = DraftSettlement(kChain, f.view, 1000, policy, pb::VerificationSpec(), certs, 4);
  ASSERT_TRUE(trusting.ok());
  for (const pb::HostPayout& p : trusting->payouts()) {
    EXPECT_EQ(p.tokens(), p.host() == f.hosts[3].address ? 22528u : 4096u);
  }
}

TEST(Ledger, AContributionTheScoringRuleLeftOutIsNotPaid) {
  Fixture f;
  f.with_contributions = true;
  std::vector<pb::RoundCertificate> certs;
  for (uint64_t r = 1; r <= 4; ++r) {
    certs.push_back(f.Certify(r, {0, 1, 2, 3}));
    for (pb::Contribution& c : *certs.back().mutable_result()->mutable_contributions()) {
      c.set_score_micro(100000);
      c.set_assigned_score_micro(900000);
    }
  }
  // Host 2's round 1 raised the held-out loss while the others' lowered it.
  certs[0].mutable_result()->mutable_contributions(2)->set_score_micro(-5);
  const pb::RewardPolicy policy = VerifiedWork(10000);
  pb::VerificationSpec drop;
  drop.set_scoring("drop");
  drop.set_score_margin_micro(50000);
  auto s = DraftSettlement(kChain, f.view, 1500, policy, drop, certs, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const pb::HostPayout& p : s->payouts()) {
    const bool left_out = p.host() == f.hosts[2].address;
    EXPECT_EQ(p.tokens(), left_out ? 3072u : 4096u) << p.host();
    EXPECT_EQ(p.unhelpful(), left_out ? 1u : 0u);
    EXPECT_EQ(p.score(), left_out ? 300000 : 400000);
    EXPECT_EQ(p.amount(), left_out ? "300" : "400");  // 1500 × its tokens / 15,360
  }
  // A wider margin keeps it: paid like the others, its low score settled.
  drop.set_score_margin_micro(200000);
  auto wide = DraftSettlement(kChain, f.view, 1600, policy, drop, certs, 4);
  ASSERT_TRUE(wide.ok()) << wide.status();
  for (const pb::HostPayout& p : wide->payouts()) {
    EXPECT_EQ(p.tokens(), 4096u);
    EXPECT_EQ(p.unhelpful(), 0u);
    EXPECT_EQ(p.score(), p.host() == f.hosts[2].address ? 299995 : 400000);
    EXPECT_EQ(p.amount(), "400");
  }
  // "record" settles the scores and pays every contribution.
  pb::VerificationSpec record;
  record.set_scoring("record");
  auto recorded = DraftSettlement(kChain, f.view, 1600, policy, record, certs, 4);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  for (const pb::HostPayout& p : recorded->payouts()) {
    EXPECT_EQ(p.unhelpful(), 0u);
    EXPECT_EQ(p.amount(), "400");
  }
}

TEST(Ledger, APartialSettlementPaysForTheRoundsCertifiedAndRefundsTheRest) {
  Fixture f;
  std::vector<pb::RoundCertificate> certs = {f.Certify(1, {0, 1, 2}), f.Certify(2, {0, 1, 2, 3}),
                                             f.Certify(3, {0, 1, 2, 3})};
  const pb::RewardPolicy policy = VerifiedWork(5000);
  // Three rounds of the six planned: half the escrow is payable, shared as for a whole run.
  auto s = DraftSettlement(kChain, f.view, 2200, policy, pb::VerificationSpec(), certs, 6);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->rounds_completed(), 3u);
  EXPECT_EQ(s->rounds_planned(), 6u);
  uint64_t paid = 0;
  for (const auto& p : s->payouts()) {
    const uint64_t n = p.host() == f.hosts[3].address ? 2 : 3;
    EXPECT_EQ(std::stoull(p.amount()), 1100 * n / 11);
    paid += std::stoull(p.amount());
  }
  EXPECT_EQ(paid, 1100u);  // all of the payable half
  EXPECT_EQ(std::stoull(s->refund()), 2200 - paid);
}

}  // namespace
}  // namespace ts::sidecar
