#include "sidecar/host/events.h"

#include <gtest/gtest.h>

#include "sidecar/host/fake_chain_client.h"

namespace ts::sidecar {
namespace {

using testing::MakeEvent;

TEST(EventsTest, ParsesShardOpened) {
  auto e =
      ParseShardOpened(MakeEvent("trainshard.shard_opened", {{"shard_id", "7"},
                                                             {"creator", "gonka1c"},
                                                             {"hardware_profile", "cpu-small"},
                                                             {"min_nodes", "2"},
                                                             {"max_nodes", "3"},
                                                             {"min_host_weight", "10"},
                                                             {"escrow", "300000ngonka"},
                                                             {"reservation_deadline_height", "120"},
                                                             {"deadline_height", "420"}}));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->shard_id, 7u);
  EXPECT_EQ(e->max_nodes, 3u);
  EXPECT_EQ(e->min_host_weight, 10u);
  EXPECT_EQ(e->escrow, 300000u);
  EXPECT_EQ(e->reservation_deadline_height, 120);
  EXPECT_EQ(e->deadline_height, 420);
}

TEST(EventsTest, ParsesTheOthers) {
  auto r =
      ParseReservationAdded(MakeEvent("trainshard.reservation_added", {{"shard_id", "1"},
                                                                       {"host", "gonka1h"},
                                                                       {"frozen_weight", "100"},
                                                                       {"endpoint", "1.2.3.4:5"},
                                                                       {"members", "2"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->frozen_weight, 100u);
  EXPECT_EQ(r->members, 2u);
  auto s = ParseShardSettled(MakeEvent("trainshard.shard_settled", {{"shard_id", "1"},
                                                                    {"final_checkpoint_root", "ab"},
                                                                    {"signed_weight", "200"},
                                                                    {"total_weight", "240"},
                                                                    {"refund", "60000"}}));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->refund, 60000u);
  auto x = ParseShardExpired(MakeEvent(
      "trainshard.shard_expired", {{"shard_id", "1"}, {"reason", "timeout"}, {"refund", "5"}}));
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(x->reason, "timeout");
  auto j = ParseShardRejected(
      MakeEvent("trainshard.shard_rejected", {{"shard_id", "1"}, {"reason", "vote failed"}}));
  ASSERT_TRUE(j.ok());
  auto w = ParseWeightsSubmitted(MakeEvent(
      "poc.weights_submitted", {{"epoch", "3"}, {"hosts", "4"}, {"total_weight", "400"}}));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->hosts, 4u);
}

TEST(EventsTest, BadAttributesNameEventAttributeAndValue) {
  auto missing = ParseShardRunning(
      MakeEvent("trainshard.shard_running", {{"shard_id", "1"}, {"members", "3"}}));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("total_weight missing"), absl::string_view::npos);

  for (const char* bad : {"", "-1", "1e3", "0x10", "007", "99999999999999999999999"}) {
    auto e = ParsePayout(
        MakeEvent("trainshard.payout", {{"shard_id", "1"}, {"host", "h"}, {"amount", bad}}));
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.status().message().find("trainshard.payout: attribute amount"),
              absl::string_view::npos)
        << e.status().message();
  }
  auto zero = ParseShardRejected(
      MakeEvent("trainshard.shard_rejected", {{"shard_id", "0"}, {"reason", "x"}}));
  EXPECT_FALSE(zero.ok());
  auto wide = ParseShardRunning(
      MakeEvent("trainshard.shard_running",
                {{"shard_id", "1"}, {"members", "4294967296"}, {"total_weight", "1"}}));
  EXPECT_FALSE(wide.ok());
}

}  // namespace
}  // namespace ts::sidecar
