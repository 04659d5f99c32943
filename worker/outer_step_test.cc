#include "worker/outer_step.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::worker {
namespace {

TEST(OuterStep, NesterovMatchesTheFormula) {
  std::vector<float> theta = {1.0f, -2.0f, 0.5f}, m = {0.0f, 0.1f, -0.2f};
  const std::vector<float> delta = {0.01f, -0.02f, 0.0f};
  const std::vector<float> theta0 = theta, m0 = m;
  ASSERT_TRUE(OuterStep(theta, m, delta, OuterOptions{}).ok());
  for (size_t i = 0; i < 3; ++i) {
    const float mi = 0.9f * m0[i] + delta[i];
    EXPECT_EQ(m[i], mi);
    EXPECT_EQ(theta[i], theta0[i] - 0.7f * (delta[i] + 0.9f * mi));
  }
}

TEST(OuterStep, PlainMomentumAndPlainSgd) {
  std::vector<float> theta = {1.0f}, m = {0.5f};
  ASSERT_TRUE(OuterStep(theta, m, std::vector<float>{0.25f},
                        OuterOptions{.lr = 1.0f, .momentum = 0.5f, .nesterov = false})
                  .ok());
  EXPECT_EQ(m[0], 0.5f);
  EXPECT_EQ(theta[0], 0.5f);
  // momentum 0 and lr 1: θ ← θ − Δ, DiLoCo's "outer step = FedAvg".
  theta = {1.0f};
  m = {0.0f};
  ASSERT_TRUE(OuterStep(theta, m, std::vector<float>{0.25f},
                        OuterOptions{.lr = 1.0f, .momentum = 0.0f, .nesterov = true})
                  .ok());
  EXPECT_EQ(theta[0], 0.75f);
}

TEST(OuterStep, RefusesAndLeavesEverythingUnchanged) {
  std::vector<float> theta = {1.0f, 2.0f}, m = {0.0f, 0.0f};
  const std::vector<float> theta0 = theta;
  EXPECT_EQ(OuterStep(theta, m, std::vector<float>{1.0f}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(
          OuterStep(theta, m, std::vector<float>{0.0f, std::numeric_limits<float>::infinity()}, {})
              .message()),
      ::testing::HasSubstr("delta[1] is inf"));
  EXPECT_EQ(OuterStep(theta, m, std::vector<float>{0.0f, 0.0f}, {.lr = -1.0f}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(theta, theta0);
}

TEST(OuterStep, BitsAreFixed) {
  // Values chosen so that a fused multiply-add would round differently; the expected bits are
  // the unfused computation, done here in the same order with volatile temporaries.
  std::vector<float> theta(1000), m(1000), delta(1000);
  for (int i = 0; i < 1000; ++i) {
    theta[i] = std::sin(float(i)) * 0.1f;
    m[i] = std::cos(float(i)) * 0.01f;
    delta[i] = std::sin(float(i) * 1.7f) * 0.003f;
  }
  std::vector<float> want_theta = theta, want_m = m;
  for (int i = 0; i < 1000; ++i) {
    volatile float mu_m = 0.9f * want_m[i];
    volatile float mi = mu_m + delta[i];
    volatile float mu_mi = 0.9f * mi;
    volatile float d = delta[i] + mu_mi;
    volatile float step = 0.7f * d;
    want_m[i] = mi;
    want_theta[i] = want_theta[i] - step;
  }
  ASSERT_TRUE(OuterStep(theta, m, delta, {}).ok());
  EXPECT_EQ(theta, want_theta);
  EXPECT_EQ(m, want_m);
}

}  // namespace
}  // namespace ts::worker
