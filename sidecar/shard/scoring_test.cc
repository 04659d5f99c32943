#include "sidecar/shard/scoring.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;

ParsedRunSpec SpecScoring(const std::string& rule, uint64_t margin = 100) {
  ParsedRunSpec spec;
  spec.spec.mutable_verification()->set_scoring(rule);
  spec.spec.mutable_verification()->set_score_windows(8);
  spec.spec.mutable_verification()->set_score_margin_micro(margin);
  return spec;
}

// Held-out scores as claims.
std::vector<StepScore> Claims(std::vector<int64_t> held_out) {
  std::vector<StepScore> out;
  for (int64_t v : held_out) out.push_back({.held_out_micro = v});
  return out;
}

TEST(Scoring, AStepsScoreIsTheLossFallInMicroNats) {
  pb::InnerStepsResponse done;
  done.add_losses(3.0f);
  done.add_losses(2.9f);
  done.set_score_base_loss(2.5);
  done.set_score_loss(2.0);
  done.set_assigned_loss(2.75);
  EXPECT_EQ(StepScoreOf(done), (StepScore{.held_out_micro = 500000, .assigned_micro = 250000}));
  done.set_score_loss(2.6);  // the held-out loss rose
  EXPECT_EQ(StepScoreOf(done).held_out_micro, -100000);
  // A loss that is not finite, or beyond any model's, counts as the largest rise; a fall beyond
  // the cap as the cap.
  done.set_score_loss(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(StepScoreOf(done).held_out_micro, -kScoreMicroMax);
  done.set_score_loss(1e30);
  EXPECT_EQ(StepScoreOf(done).held_out_micro, -kScoreMicroMax);
  done.set_score_base_loss(3e6);
  done.set_score_loss(1.0);
  EXPECT_EQ(StepScoreOf(done).held_out_micro, kScoreMicroMax);
}

TEST(Scoring, AClaimTravelsAsSixteenBytesAndBadOnesAreNamed) {
  const StepScore claim{.held_out_micro = -123456, .assigned_micro = 987654321};
  const std::string block = EncodeScoreClaim(claim);
  ASSERT_EQ(block.size(), kScoreClaimBytes);
  auto back = DecodeScoreClaim(block, "host-a");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, claim);
  EXPECT_THAT(DecodeScoreClaim(block.substr(1), "host-a").status().message(),
              HasSubstr("score claim of host-a: 15 bytes, want 16"));
  const std::string huge = EncodeScoreClaim({.held_out_micro = kScoreMicroMax + 1});
  EXPECT_THAT(DecodeScoreClaim(huge, "host-b").status().message(),
              HasSubstr("score claim of host-b: 1099511627777 is beyond"));
}

TEST(Scoring, TheDropRuleLeavesOutWhatFellFarBelowTheRoundsMedian) {
  const pb::VerificationSpec drop = SpecScoring("drop", 100).spec.verification();
  // The lower median of 500, 420, 390 and -50 is 390, the line 390 - 100 - 195 = 95: -50 is
  // below it.
  EXPECT_EQ(LeftOut(drop, Claims({500, -50, 420, 390})),
            (std::vector<bool>{false, true, false, false}));
  // Above the line, or all low together (a round whose outer momentum overshot): kept.
  EXPECT_TRUE(LeftOut(drop, Claims({500, 401, 420})).empty());
  EXPECT_TRUE(LeftOut(drop, Claims({500, 111, 420})).empty());  // the line is 110
  EXPECT_EQ(LeftOut(drop, Claims({500, 109, 420})), (std::vector<bool>{false, true, false}));
  EXPECT_TRUE(LeftOut(drop, Claims({-29, -60, -82})).empty());
  // One member, or two: the median one is never left out.
  EXPECT_TRUE(LeftOut(drop, Claims({-5000})).empty());
  EXPECT_TRUE(LeftOut(drop, Claims({100, -5000})).empty());
  // Liars claiming high cannot push an honest score out while they are fewer than half: the
  // lower median stays an honest one.
  EXPECT_TRUE(LeftOut(drop, Claims({300, 310, kScoreMicroMax})).empty());
  EXPECT_TRUE(LeftOut(drop, Claims({300, 310, 320, kScoreMicroMax, kScoreMicroMax})).empty());
  // "record" and "off" leave nothing out.
  for (const char* rule : {"record", "off"}) {
    EXPECT_TRUE(LeftOut(SpecScoring(rule).spec.verification(), Claims({500, -50, 420})).empty());
  }
  EXPECT_TRUE(Scores(SpecScoring("drop")));
  EXPECT_FALSE(Scores(SpecScoring("off")));
}

TEST(Scoring, ARoundsStepsAreAskedForTheirScoreOnWindowsThatMoveWithTheRound) {
  pb::InnerStepsRequest request;
  request.set_round(3);
  AddScoreRequest(SpecScoring("drop"), "data/eval.bin", &request);
  EXPECT_EQ(request.score_file(), "data/eval.bin");
  EXPECT_EQ(request.score_windows(), 8u);
  EXPECT_EQ(request.score_first_window(), 24u);
  pb::InnerStepsRequest off;
  AddScoreRequest(SpecScoring("off"), "data/eval.bin", &off);
  EXPECT_TRUE(off.score_file().empty());
}

}  // namespace
}  // namespace ts::sidecar
