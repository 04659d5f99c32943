// Aggregator tests.
//
// Stated bounds under attack (acceptance 5). Honest contributions are x_i = μ + σ·ε_i with
// d = 1000 coordinates, σ = 0.1 and ‖μ‖ ≈ 6.3 (μ_j ~ N(0, 0.2²)); h̄ is the mean of the honest
// contributions and S = σ·√d ≈ 3.16 the honest spread (the expected distance of one honest
// contribution from μ). With 1 attacker of 4 and with 2 attackers of 7, each attack being
//   scaled      a = 100 · x (the attacker's own honest vector, scaled),
//   sign flip   a = −100 · x, and a = −x,
//   ALIE        a_j = h̄_j − z · s_j (s_j the honest per-coordinate standard deviation), z = 1,
// the robust aggregators, with their automatic settings (trim (n − 1) / 3; τ the median
// distance to the median, 3 iterations), stay within
//   median, trimmed mean    ‖aggregate − h̄‖₂ ≤ 0.75 · S   (measured worst 0.60 S)
//   centered clipping       ‖aggregate − h̄‖₂ ≤ 0.5 · S    (measured worst 0.42 S)
// The attackers cannot push a coordinate beyond an honest order statistic (median, trimmed
// mean) or move the center by more than f/n · τ per iteration (centered clipping), and those
// sit about half an honest standard deviation from h̄ per coordinate. The plain mean under the
// same attacks: ≥ 10 S off for scaled and ×100 sign flip (measured 56–59 S), beyond 0.75 S for
// −x (measured 1.05–1.14 S). ALIE is built to hide inside the honest spread, so it moves even
// the plain mean only f/n · z · S (≈ 0.25–0.29 S); there only the robust bounds are checked.
#include "sidecar/collective/aggregate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/hex.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;

using Vec = std::vector<float>;

constexpr Aggregator kAll[] = {Aggregator::kMean, Aggregator::kMedian, Aggregator::kTrimmedMean,
                               Aggregator::kCenteredClip};
constexpr Aggregator kRobust[] = {Aggregator::kMedian, Aggregator::kTrimmedMean,
                                  Aggregator::kCenteredClip};

AggregateSpec SpecOf(Aggregator kind) {
  AggregateSpec spec;
  spec.kind = kind;
  return spec;
}

std::vector<std::span<const float>> Spans(const std::vector<Vec>& xs) {
  return std::vector<std::span<const float>>(xs.begin(), xs.end());
}

absl::StatusOr<Vec> AggregateTo(const AggregateSpec& spec, const std::vector<Vec>& xs, size_t dim) {
  Vec out(dim, -1.0f);
  const auto spans = Spans(xs);
  const absl::Status s = Aggregate(spec, spans, std::span<float>(out));
  if (!s.ok()) return s;
  return out;
}

Vec RunOk(const AggregateSpec& spec, const std::vector<Vec>& xs) {
  auto out = AggregateTo(spec, xs, xs[0].size());
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : Vec();
}

double Distance(const Vec& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t j = 0; j < a.size(); ++j) s += (a[j] - b[j]) * (a[j] - b[j]);
  return std::sqrt(s);
}

TEST(AggregatorNames, ParseAndName) {
  for (Aggregator a : kAll) {
    auto parsed = ParseAggregator(AggregatorName(a));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, a);
  }
  auto bad = ParseAggregator("krum");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'krum'"));
}

TEST(Aggregate, EffectiveTrimToleratesAThirdMinusOne) {
  const AggregateSpec automatic = SpecOf(Aggregator::kTrimmedMean);
  EXPECT_EQ(EffectiveTrim(automatic, 1), 0u);
  EXPECT_EQ(EffectiveTrim(automatic, 2), 0u);
  EXPECT_EQ(EffectiveTrim(automatic, 3), 1u);
  EXPECT_EQ(EffectiveTrim(automatic, 4), 1u);
  EXPECT_EQ(EffectiveTrim(automatic, 7), 2u);
  EXPECT_EQ(EffectiveTrim(automatic, 10), 3u);
  AggregateSpec fixed = automatic;
  fixed.trim = 2;
  EXPECT_EQ(EffectiveTrim(fixed, 4), 2u);
}

TEST(Aggregate, SmallExactCases) {
  const std::vector<Vec> xs = {{1, 10, -1}, {2, 40, -3}, {3, 20, -2}, {100, 30, 7}};
  EXPECT_EQ(RunOk(SpecOf(Aggregator::kMean), xs), (Vec{106.0f / 4, 25, 0.25f}));
  EXPECT_EQ(RunOk(SpecOf(Aggregator::kMedian), xs), (Vec{2.5f, 25, -1.5f}));
  // Trim 1 of 4: the middle two.
  EXPECT_EQ(RunOk(SpecOf(Aggregator::kTrimmedMean), xs), (Vec{2.5f, 25, -1.5f}));
  const std::vector<Vec> odd = {{5, 0}, {1, -2}, {4, 9}};
  EXPECT_EQ(RunOk(SpecOf(Aggregator::kMedian), odd), (Vec{4, 0}));
  // Centered clipping with no iterations is the median; with a radius nothing reaches it is the
  // mean (one step from the median lands on it).
  AggregateSpec cc = SpecOf(Aggregator::kCenteredClip);
  cc.clip_iterations = 0;
  EXPECT_EQ(RunOk(cc, xs), (Vec{2.5f, 25, -1.5f}));
  cc.clip_iterations = 3;
  cc.clip_tau = 1e6f;
  const Vec cc_mean = RunOk(cc, xs);
  const Vec mean = RunOk(SpecOf(Aggregator::kMean), xs);
  for (size_t j = 0; j < mean.size(); ++j) EXPECT_FLOAT_EQ(cc_mean[j], mean[j]) << j;
  // A tiny radius hardly moves off the median: 3 steps of at most τ each.
  cc.clip_tau = 1e-3f;
  const Vec cc_tight = RunOk(cc, xs);
  EXPECT_NEAR(cc_tight[0], 2.5f, 3e-3f);
  // One contribution: every aggregator returns it.
  for (Aggregator a : kAll) EXPECT_EQ(RunOk(SpecOf(a), {{3, -4}}), (Vec{3, -4}));
}

TEST(Aggregate, TheMeanWeighsEachContributionByItsTokens) {
  const std::vector<Vec> xs = {{1, 8}, {4, -8}};
  AggregateSpec weighted = SpecOf(Aggregator::kMean);
  weighted.weights = {3, 1};  // three times the tokens behind the first
  EXPECT_EQ(RunOk(weighted, xs), (Vec{1.75f, 4}));
  // Equal weights are the plain mean, bit for bit.
  weighted.weights = {5, 5};
  EXPECT_EQ(RunOk(weighted, xs), RunOk(SpecOf(Aggregator::kMean), xs));
  // The robust aggregators count each contribution once.
  AggregateSpec median = SpecOf(Aggregator::kMedian);
  median.weights = {100, 1, 1};
  EXPECT_EQ(RunOk(median, {{1}, {2}, {3}}), (Vec{2}));
}

TEST(Aggregate, ContributionsLeftOutAreNotAggregated) {
  const std::vector<Vec> xs = {{1, 10}, {2, 40}, {3, 20}, {100, 30}};
  AggregateSpec mean = SpecOf(Aggregator::kMean);
  mean.weights = {1, 1, 2, 4};
  mean.left_out = {false, true, false, true};
  const Vec weighted = RunOk(mean, xs);  // the first and third, weighted 1:2
  ASSERT_EQ(weighted.size(), 2u);
  EXPECT_FLOAT_EQ(weighted[0], 7.0f / 3);
  EXPECT_FLOAT_EQ(weighted[1], 50.0f / 3);
  // A trim of 1 of 4 with two left: too large for two, so their plain mean.
  AggregateSpec trimmed = SpecOf(Aggregator::kTrimmedMean);
  trimmed.trim = 1;
  trimmed.left_out = {false, false, true, false};
  EXPECT_EQ(RunOk(trimmed, xs), (Vec{2, 30}));  // the middle one of 1, 2, 100 and of 10, 40, 30
  trimmed.left_out = {true, false, false, true};
  EXPECT_EQ(RunOk(trimmed, xs), (Vec{2.5f, 30}));
  // Nothing left out: as without the flags.
  trimmed.left_out = {false, false, false, false};
  EXPECT_EQ(RunOk(trimmed, xs), RunOk(SpecOf(Aggregator::kTrimmedMean), xs));
  std::vector<float> out(2);
  std::vector<std::span<const float>> spans(xs.begin(), xs.end());
  trimmed.left_out = {true, true, true, true};
  EXPECT_THAT(std::string(Aggregate(trimmed, spans, out).message()),
              HasSubstr("every contribution left out"));
  trimmed.left_out = {true};
  EXPECT_THAT(std::string(Aggregate(trimmed, spans, out).message()),
              HasSubstr("1 left_out flags for 4 contributions"));
}

TEST(Aggregate, ErrorsNameTheField) {
  auto expect_error = [](const AggregateSpec& spec, const std::vector<Vec>& xs, size_t dim,
                         const std::string& text) {
    auto out = AggregateTo(spec, xs, dim);
    ASSERT_FALSE(out.ok()) << text;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(out.status().message()), HasSubstr(text));
  };
  expect_error(SpecOf(Aggregator::kMean), {}, 3, "no contributions");
  expect_error(SpecOf(Aggregator::kMedian), {{1, 2, 3}, {1, 2}}, 3,
               "contribution 1 has 2 elements, expected 3");
  AggregateSpec trim = SpecOf(Aggregator::kTrimmedMean);
  trim.trim = 2;
  expect_error(trim, {{1}, {2}, {3}, {4}}, 1, "trim 2 is too large for 4 contributions");
  AggregateSpec cc = SpecOf(Aggregator::kCenteredClip);
  cc.clip_iterations = 101;
  expect_error(cc, {{1}}, 1, "clip_iterations 101");
  cc.clip_iterations = 3;
  for (float tau :
       {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    cc.clip_tau = tau;
    expect_error(cc, {{1}}, 1, "clip_tau");
  }
  for (Aggregator a : kAll) {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      expect_error(SpecOf(a), {{1, 2, 3}, {4, 5, 6}, {7, bad, 9}}, 3,
                   "contribution 2 element 1 is not finite");
    }
  }
  AggregateSpec weights = SpecOf(Aggregator::kMean);
  weights.weights = {1};
  expect_error(weights, {{1}, {2}}, 1, "1 weights for 2 contributions");
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    weights.weights = {1, bad};
    expect_error(weights, {{1}, {2}}, 1, "weight 1 is");
  }
  AggregateSpec unknown;
  unknown.kind = static_cast<Aggregator>(9);
  expect_error(unknown, {{1}}, 1, "kind 9");
}

// ---- robustness ------------------------------------------------------------------------------

constexpr size_t kDim = 1000;
constexpr float kSigma = 0.1f;
// The stated bounds, in units of S = σ·√d (see the top of the file).
double BoundInSpreads(Aggregator a) { return a == Aggregator::kCenteredClip ? 0.5 : 0.75; }
constexpr double kMeanFarInSpreads = 10;

enum class Attack { kScaled, kSignFlip100, kSignFlip, kAlie };

const char* AttackName(Attack a) {
  switch (a) {
    case Attack::kScaled:
      return "scaled x100";
    case Attack::kSignFlip100:
      return "sign flip x100";
    case Attack::kSignFlip:
      return "sign flip";
    case Attack::kAlie:
      return "ALIE z=1";
  }
  return "?";
}

struct Scenario {
  std::vector<Vec> contributions;  // in group order, attackers among them
  std::vector<double> honest_mean;
};

// n contributions of which those at `attackers` (indices) are replaced by the attack.
Scenario MakeScenario(size_t n, const std::vector<size_t>& attackers, Attack attack,
                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> mu_dist(0.0f, 0.2f);
  std::normal_distribution<float> noise(0.0f, kSigma);
  Vec mu(kDim);
  for (float& v : mu) v = mu_dist(rng);
  Scenario s;
  s.contributions.assign(n, Vec(kDim));
  for (Vec& x : s.contributions) {
    for (size_t j = 0; j < kDim; ++j) x[j] = mu[j] + noise(rng);
  }
  auto is_attacker = [&](size_t i) {
    return std::find(attackers.begin(), attackers.end(), i) != attackers.end();
  };
  const double honest = static_cast<double>(n - attackers.size());
  s.honest_mean.assign(kDim, 0.0);
  std::vector<double> sq(kDim, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (is_attacker(i)) continue;
    for (size_t j = 0; j < kDim; ++j) s.honest_mean[j] += s.contributions[i][j] / honest;
  }
  for (size_t i = 0; i < n; ++i) {
    if (is_attacker(i)) continue;
    for (size_t j = 0; j < kDim; ++j) {
      const double d = s.contributions[i][j] - s.honest_mean[j];
      sq[j] += d * d / (honest - 1);
    }
  }
  for (size_t i : attackers) {
    Vec& x = s.contributions[i];
    for (size_t j = 0; j < kDim; ++j) {
      switch (attack) {
        case Attack::kScaled:
          x[j] = 100.0f * x[j];
          break;
        case Attack::kSignFlip100:
          x[j] = -100.0f * x[j];
          break;
        case Attack::kSignFlip:
          x[j] = -x[j];
          break;
        case Attack::kAlie:
          x[j] = static_cast<float>(s.honest_mean[j] - 1.0 * std::sqrt(sq[j]));
          break;
      }
    }
  }
  return s;
}

void CheckRobustness(size_t n, const std::vector<size_t>& attackers) {
  const double spread = kSigma * std::sqrt(static_cast<double>(kDim));
  const double loosest = BoundInSpreads(Aggregator::kMedian) * spread;
  double worst = 0;
  for (Attack attack : {Attack::kScaled, Attack::kSignFlip100, Attack::kSignFlip, Attack::kAlie}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const Scenario s = MakeScenario(n, attackers, attack, seed * 1000 + n);
      for (Aggregator a : kRobust) {
        const double dist = Distance(RunOk(SpecOf(a), s.contributions), s.honest_mean);
        worst = std::max(worst, dist / spread);
        EXPECT_LE(dist, BoundInSpreads(a) * spread)
            << AggregatorName(a) << " under " << AttackName(attack) << ", " << attackers.size()
            << " of " << n << ", seed " << seed << ": distance " << dist / spread << " S";
      }
      const double mean_dist =
          Distance(RunOk(SpecOf(Aggregator::kMean), s.contributions), s.honest_mean);
      if (seed == 1) {
        std::printf("%zu of %zu, %-14s: plain mean off by %7.2f S\n", attackers.size(), n,
                    AttackName(attack), mean_dist / spread);
      }
      // The attack is strong enough to matter: the plain mean fails the bound (by far, unless the
      // attack is the weak −x).
      if (attack == Attack::kScaled || attack == Attack::kSignFlip100) {
        EXPECT_GE(mean_dist, kMeanFarInSpreads * spread) << AttackName(attack);
      } else if (attack == Attack::kSignFlip) {
        EXPECT_GT(mean_dist, loosest) << AttackName(attack);
      }
    }
  }
  std::printf("%zu of %zu: robust aggregators at most %.3f S from the honest mean\n",
              attackers.size(), n, worst);
}

TEST(AggregateRobustness, OneAttackerOfFour) { CheckRobustness(4, {2}); }

TEST(AggregateRobustness, TwoAttackersOfSeven) { CheckRobustness(7, {0, 4}); }

// Attackers at the edge of fp32's range: robust aggregates stay finite and within the bound
// (centered clipping's fp64 differences and norms cannot overflow).
TEST(AggregateRobustness, ExtremeValuesStayFinite) {
  Scenario s = MakeScenario(7, {1, 5}, Attack::kScaled, 99);
  const float max = std::numeric_limits<float>::max();
  for (size_t j = 0; j < kDim; ++j) {
    s.contributions[1][j] = (j % 2 == 0) ? max : -max;
    s.contributions[5][j] = max;
  }
  const double spread = kSigma * std::sqrt(static_cast<double>(kDim));
  for (Aggregator a : kRobust) {
    const Vec out = RunOk(SpecOf(a), s.contributions);
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << AggregatorName(a);
    EXPECT_LE(Distance(out, s.honest_mean), BoundInSpreads(a) * spread) << AggregatorName(a);
  }
  // A fixed radius as well.
  AggregateSpec cc = SpecOf(Aggregator::kCenteredClip);
  cc.clip_tau = 1.0f;
  const Vec out = RunOk(cc, s.contributions);
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
}

// ---- determinism -----------------------------------------------------------------------------

// Inputs from integer arithmetic and one IEEE division each, so that every build (compiler,
// standard library) sees the same bits.
std::vector<Vec> PortableInputs(size_t n, size_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Vec> xs(n, Vec(dim));
  for (Vec& x : xs) {
    for (float& v : x) {
      const int64_t k = static_cast<int64_t>(rng() % 2000001) - 1000000;
      v = static_cast<float>(k) / 65536.0f / 7.0f;
    }
  }
  for (size_t j = 0; j < dim; j += 3) xs[1][j] *= 50.0f;  // an outlier
  return xs;
}

std::string Bytes(const Vec& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(AggregateDeterminism, SameInputsSameBytes) {
  const std::vector<Vec> xs = PortableInputs(7, 5000, 5);
  for (Aggregator a : kAll) {
    const AggregateSpec spec = SpecOf(a);
    const Vec first = RunOk(spec, xs);
    // Output buffer contents and input addresses (a copy at another alignment) change nothing.
    Vec out(xs[0].size(), std::numeric_limits<float>::quiet_NaN());
    std::vector<std::vector<float>> storage(xs.size());
    std::vector<std::span<const float>> shifted;
    for (size_t i = 0; i < xs.size(); ++i) {
      storage[i].assign(xs[i].size() + 1 + i, 0.0f);
      std::copy(xs[i].begin(), xs[i].end(), storage[i].begin() + 1 + i);
      shifted.emplace_back(storage[i].data() + 1 + i, xs[i].size());
    }
    ASSERT_TRUE(Aggregate(spec, shifted, std::span<float>(out)).ok());
    EXPECT_EQ(Bytes(out), Bytes(first)) << AggregatorName(a);
    EXPECT_EQ(Bytes(RunOk(spec, xs)), Bytes(first)) << AggregatorName(a);
  }
}

TEST(AggregateDeterminism, MedianAndTrimmedMeanIgnoreContributionOrder) {
  std::vector<Vec> xs = PortableInputs(7, 3000, 6);
  // Signed zeros and ties: a total order decides, not the sort's luck.
  for (size_t i = 0; i < xs.size(); ++i) xs[i][0] = (i % 2 == 0) ? 0.0f : -0.0f;
  for (size_t i = 0; i < xs.size(); ++i) xs[i][1] = 1.5f;
  for (Aggregator a : {Aggregator::kMedian, Aggregator::kTrimmedMean}) {
    const std::string first = Bytes(RunOk(SpecOf(a), xs));
    std::vector<Vec> permuted = xs;
    std::mt19937_64 rng(8);
    for (int round = 0; round < 5; ++round) {
      std::shuffle(permuted.begin(), permuted.end(), rng);
      EXPECT_EQ(Bytes(RunOk(SpecOf(a), permuted)), first) << AggregatorName(a);
    }
  }
}

// The same bits on every build: a digest of all four aggregates over portable inputs, fixed
// here. A compiler that contracted a multiply-add or reordered a sum would change it.
TEST(AggregateDeterminism, GoldenDigestAcrossBuilds) {
  std::string all;
  for (size_t n : {size_t{4}, size_t{7}}) {
    const std::vector<Vec> xs = PortableInputs(n, 2000, 40 + n);
    for (Aggregator a : kAll) all += Bytes(RunOk(SpecOf(a), xs));
  }
  // Any 32-byte digest of the outputs would do; CommitmentOf is one.
  EXPECT_EQ(common::HexEncode(CommitmentOf(0, 0, all)),
            "7d0041750358ea4f3ac6bb0d37fb282cc5f9ac19b44cbf9a80cd462f091a212e");
}

TEST(Commitment, LayoutAndSensitivity) {
  // SHA-256("gonka-trainshard/v1/collective_commit" || be64 op_id || be32 index || payload),
  // computed independently.
  EXPECT_EQ(common::HexEncode(CommitmentOf(0x0102030405060708ull, 7, "payload")),
            "caf8e0abf34cc4ee82b7a7038090e1c61f14baf1f152278e2ca6d137542d33c4");
  EXPECT_EQ(common::HexEncode(CommitmentOf(0, 0, "")),
            "1034b920435f8c3a7f674f77f964c6ccf3946de418f5ff54a1cf70507ed9d128");
  const std::string base = CommitmentOf(5, 1, "abc");
  EXPECT_EQ(base.size(), 32u);
  EXPECT_NE(CommitmentOf(6, 1, "abc"), base);
  EXPECT_NE(CommitmentOf(5, 2, "abc"), base);
  EXPECT_NE(CommitmentOf(5, 1, "abd"), base);
  EXPECT_EQ(CommitmentOf(5, 1, "abc"), base);
}

}  // namespace
}  // namespace ts::sidecar
