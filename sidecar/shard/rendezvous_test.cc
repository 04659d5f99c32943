#include "sidecar/shard/rendezvous.h"

#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

// Three members of weights 40, 30, 30: any two hold 60 or 70 of 100.
ShardView View() {
  ShardView v;
  v.members = {{"a", "a:1", 40}, {"b", "b:1", 30}, {"c", "c:1", 30}};
  return v;
}

const Rendezvous::Timing kTiming{
    .join_window_ms = 1000, .preparing_wait_ms = 5000, .fresh_ms = 3000};

Rendezvous::Announcement Ready(int64_t at_ms, uint32_t attempt = 0) {
  return {.endpoint = "e", .min_attempt = attempt, .at_ms = at_ms, .preparing = false};
}

TEST(Rendezvous, EveryoneReadyPlansAtOnce) {
  Rendezvous r;
  r.Enter(1, 0);
  for (const char* m : {"a", "b", "c"}) r.Announce(m, Ready(0));
  const Rendezvous::Decision d = r.Decide(View(), 10, 0, kTiming);
  EXPECT_TRUE(d.plan);
  EXPECT_EQ(d.ready.size(), 3u);
  EXPECT_EQ(d.ready_weight, 100u);
}

TEST(Rendezvous, AQuorumPlansOnlyPastTheJoinWindowAndExactlyTwoThirdsIsNotOne) {
  Rendezvous r;
  r.Enter(1, 0);
  r.Announce("a", Ready(0));
  r.Announce("b", Ready(0));  // 70 of 100: a quorum
  EXPECT_FALSE(r.Decide(View(), 999, 0, kTiming).plan);
  EXPECT_TRUE(r.Decide(View(), 1000, 0, kTiming).plan);
  // Three members of weight 1: two of them hold exactly 2/3, not a quorum, however long the wait.
  ShardView even = View();
  for (ShardMember& m : even.members) m.weight = 1;
  Rendezvous q;
  q.Enter(1, 0);
  q.Announce("b", Ready(0));
  q.Announce("c", Ready(0));
  EXPECT_FALSE(q.Decide(even, 2000, 0, kTiming).plan);
}

TEST(Rendezvous, APreparingMemberIsWaitedForABoundedTime) {
  Rendezvous r;
  r.Enter(1, 0);
  r.Announce("a", Ready(4000));
  r.Announce("b", Ready(4000));
  r.Announce("c", {.endpoint = "e", .min_attempt = 0, .at_ms = 0, .preparing = true});
  EXPECT_FALSE(r.Decide(View(), 4500, 0, kTiming).plan);  // past the window, c still preparing
  EXPECT_TRUE(r.Decide(View(), 5000, 0, kTiming).plan);   // the bounded wait is over
  // A preparing announce does not replace a ready one of the same attempt.
  r.Announce("c", Ready(4900));
  r.Announce("c", {.endpoint = "e", .min_attempt = 0, .at_ms = 4950, .preparing = true});
  EXPECT_EQ(r.Decide(View(), 4960, 0, kTiming).ready.size(), 3u);
}

TEST(Rendezvous, StaleOutsiderAndEarlierAttemptAnnouncesDoNotCount) {
  Rendezvous r;
  r.Enter(1, 1);
  r.Announce("a", Ready(0, 1));
  r.Announce("b", Ready(0, 0));      // an earlier attempt
  r.Announce("z", Ready(0, 1));      // not a member
  r.Announce("c", Ready(-5000, 1));  // stale by now
  const Rendezvous::Decision d = r.Decide(View(), 100, 0, kTiming);
  EXPECT_FALSE(d.plan);
  ASSERT_EQ(d.ready.size(), 1u);
  EXPECT_EQ(d.ready[0].first, "a");
  // One member alone never plans, even holding everything.
  ShardView alone;
  alone.members = {{"a", "a:1", 10}};
  EXPECT_FALSE(r.Decide(alone, 100, 0, kTiming).plan);
}

TEST(Rendezvous, ANewRoundOrAttemptForgetsThePlan) {
  Rendezvous r;
  r.Enter(1, 0);
  r.Announce("a", Ready(0));
  pb::RoundPlan plan;
  plan.set_round(1);
  plan.set_attempt(0);
  r.set_plan(plan);
  ASSERT_NE(r.PlanFor(0), nullptr);
  EXPECT_EQ(r.PlanFor(1), nullptr);  // a member asking for a later attempt
  r.Enter(1, 0);                     // the same round and attempt: kept
  EXPECT_NE(r.PlanFor(0), nullptr);
  r.Enter(1, 2);  // a later attempt: the plan goes, the announces stay
  EXPECT_EQ(r.PlanFor(0), nullptr);
  EXPECT_EQ(r.attempt(), 2u);
  r.Enter(2, 0);  // a new round: everything goes
  EXPECT_EQ(r.round(), 2u);
  EXPECT_EQ(r.attempt(), 0u);
  EXPECT_TRUE(r.Decide(View(), 0, 0, kTiming).ready.empty());
}

}  // namespace
}  // namespace ts::sidecar
