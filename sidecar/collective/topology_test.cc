// Ring order tests: the exhaustive search (n ≤ 9) against an independent brute force, the tie
// rule, the heuristic (n ≥ 10) on instances with a known best ring and against brute force at
// n = 10 and 11, determinism, n = 256, and the errors.
#include "sidecar/collective/topology.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;
using Matrix = std::vector<std::vector<double>>;

Matrix RandomRates(size_t n, uint64_t seed, double lo = 1, double hi = 100) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Matrix r(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) r[i][j] = i == j ? 0.0 : dist(rng);
  }
  return r;
}

double SumOf(const Matrix& r, const std::vector<size_t>& order) {
  double s = 0;
  for (size_t k = 0; k < order.size(); ++k) s += r[order[k]][order[(k + 1) % order.size()]];
  return s;
}

// Depth-first over every ring starting at 0: the best bottleneck and, among rings with it, the
// best total rate. Written independently of the library's search.
struct Best {
  double bottleneck = -1;
  double sum = -1;
};

void Search(const Matrix& r, std::vector<size_t>& path, std::vector<bool>& used, double min_so_far,
            double sum_so_far, bool need_sum, Best* best) {
  const size_t n = r.size();
  if (path.size() == n) {
    const double close = r[path.back()][0];
    const double b = std::min(min_so_far, close);
    const double s = sum_so_far + close;
    if (b > best->bottleneck || (b == best->bottleneck && s > best->sum)) *best = {b, s};
    return;
  }
  // A ring's bottleneck only drops as links are added.
  if (min_so_far < best->bottleneck || (!need_sum && min_so_far == best->bottleneck)) return;
  for (size_t v = 1; v < n; ++v) {
    if (used[v]) continue;
    const double rate = r[path.back()][v];
    used[v] = true;
    path.push_back(v);
    Search(r, path, used, std::min(min_so_far, rate), sum_so_far + rate, need_sum, best);
    path.pop_back();
    used[v] = false;
  }
}

// need_sum: also the best total among the rings of best bottleneck (no pruning on equality).
Best BruteForce(const Matrix& r, bool need_sum) {
  std::vector<size_t> path = {0};
  std::vector<bool> used(r.size(), false);
  used[0] = true;
  Best best;
  Search(r, path, used, std::numeric_limits<double>::infinity(), 0.0, need_sum, &best);
  return best;
}

void ExpectRing(const std::vector<size_t>& order, size_t n) {
  ASSERT_EQ(order.size(), n);
  ASSERT_EQ(order[0], 0u);
  std::vector<size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
}

TEST(RingOrder, SmallMatricesMatchBruteForce) {
  int trials = 0;
  for (size_t n = 2; n <= 9; ++n) {
    for (uint64_t seed = 0; seed < (n <= 7 ? 30u : 6u); ++seed) {
      // Coarse rates (few distinct values) make ties in the bottleneck common, which exercises the
      // total-rate tie break.
      Matrix r = RandomRates(n, seed * 31 + n);
      if (seed % 2 == 1) {
        for (auto& row : r) {
          for (double& v : row) v = std::round(v / 25);
        }
      }
      auto order = ChooseRingOrder(r);
      ASSERT_TRUE(order.ok()) << order.status();
      ExpectRing(*order, n);
      const Best best = BruteForce(r, /*need_sum=*/true);
      EXPECT_EQ(RingBottleneck(r, *order), best.bottleneck) << "n " << n << " seed " << seed;
      EXPECT_NEAR(SumOf(r, *order), best.sum, 1e-9 * best.sum) << "n " << n << " seed " << seed;
      ++trials;
    }
  }
  EXPECT_EQ(trials, 6 * 30 + 2 * 6);
}

TEST(RingOrder, DirectionMatters) {
  // 0 → 1 → 2 → 0 is fast, the other direction slow.
  Matrix r = {{0, 100, 1}, {1, 0, 100}, {100, 1, 0}};
  EXPECT_EQ(*ChooseRingOrder(r), (std::vector<size_t>{0, 1, 2}));
  Matrix t = r;
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < 3; ++j) t[i][j] = r[j][i];
  }
  EXPECT_EQ(*ChooseRingOrder(t), (std::vector<size_t>{0, 2, 1}));
  EXPECT_EQ(RingBottleneck(t, {0, 2, 1}), 100);
  EXPECT_EQ(RingBottleneck(t, {0, 1, 2}), 1);
}

TEST(RingOrder, AvoidsTheSlowLink) {
  // Four members, all links 10 except 1 ↔ 2 at 1: the given order 0 1 2 3 uses it.
  Matrix r(4, std::vector<double>(4, 10));
  r[1][2] = r[2][1] = 1;
  const std::vector<size_t> order = *ChooseRingOrder(r);
  EXPECT_EQ(RingBottleneck(r, order), 10);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 3, 2}));  // the first such ring in order
}

TEST(RingOrder, TiesKeepTheGivenOrder) {
  for (size_t n : {2, 5, 9, 10, 30}) {
    Matrix r(n, std::vector<double>(n, 7.0));
    std::vector<size_t> identity(n);
    std::iota(identity.begin(), identity.end(), size_t{0});
    EXPECT_EQ(*ChooseRingOrder(r), identity) << n;
    // Nothing reachable at all: still the given order.
    Matrix zero(n, std::vector<double>(n, 0.0));
    EXPECT_EQ(*ChooseRingOrder(zero), identity) << n;
  }
}

TEST(RingOrder, Deterministic) {
  for (size_t n : {6, 12, 20}) {
    const Matrix r = RandomRates(n, 500 + n);
    EXPECT_EQ(*ChooseRingOrder(r), *ChooseRingOrder(r)) << n;
  }
}

Matrix Planted(size_t n, uint64_t seed) {
  Matrix r = RandomRates(n, seed + 7 * n, 1, 100);
  std::vector<size_t> ring(n);
  std::iota(ring.begin(), ring.end(), size_t{0});
  std::mt19937_64 rng(seed);
  std::shuffle(ring.begin(), ring.end(), rng);
  for (size_t k = 0; k < n; ++k) r[ring[k]][ring[(k + 1) % n]] = 1000 + static_cast<double>(k);
  return r;
}

// A ring of fast links hidden among slow ones: its bottleneck is the best possible, and the
// heuristic must find a ring as good.
TEST(RingOrder, HeuristicFindsAPlantedFastRing) {
  for (size_t n : {10, 17, 64}) {
    for (uint64_t seed = 0; seed < 3; ++seed) {
      const Matrix r = Planted(n, seed);
      auto order = ChooseRingOrder(r);
      ASSERT_TRUE(order.ok());
      ExpectRing(*order, n);
      EXPECT_EQ(RingBottleneck(r, *order), 1000) << "n " << n << " seed " << seed;
    }
  }
}

// Above 9 members the search is bounded, but at these sizes it runs to the end: the best
// bottleneck, as brute force finds it.
TEST(RingOrder, AboveNineMatchesBruteForceOnSmallMatrices) {
  for (size_t n : {10, 11, 12, 14}) {
    for (uint64_t seed = 0; seed < 10; ++seed) {
      Matrix r = RandomRates(n, 900 + seed * 13 + n);
      if (seed % 2 == 1) {
        for (auto& row : r) {
          for (double& v : row) v = std::round(v / 10);
        }
      }
      const std::vector<size_t> order = *ChooseRingOrder(r);
      ExpectRing(order, n);
      EXPECT_EQ(RingBottleneck(r, order), BruteForce(r, /*need_sum=*/false).bottleneck)
          << "n " << n << " seed " << seed;
    }
  }
}

TEST(RingOrder, TwoHundredFiftySixMembersIsFast) {
  const Matrix r = Planted(256, 4242);
  const auto start = std::chrono::steady_clock::now();
  auto order = ChooseRingOrder(r);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(order.ok());
  ExpectRing(*order, 256);
  // Generous for sanitizer builds; an optimized build takes about 50 ms.
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(RingBottleneck(r, *order), 1000);
}

TEST(RingOrder, Errors) {
  auto expect_error = [](const Matrix& r, const std::string& text) {
    auto order = ChooseRingOrder(r);
    ASSERT_FALSE(order.ok()) << text;
    EXPECT_EQ(order.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(order.status().message()), HasSubstr(text));
  };
  expect_error({}, "0 members");
  expect_error({{0}}, "1 members");
  expect_error(Matrix(257, std::vector<double>(257, 1.0)), "257 members");
  expect_error({{0, 1, 1}, {1, 0}, {1, 1, 0}}, "row 1 has 2 entries, expected 3");
  expect_error({{0, -1}, {1, 0}}, "rates[0][1] = -1");
  expect_error({{0, 1}, {std::numeric_limits<double>::quiet_NaN(), 0}}, "rates[1][0] = nan");
  expect_error({{0, std::numeric_limits<double>::infinity()}, {1, 0}}, "rates[0][1] = inf");
  // The diagonal is ignored, whatever it holds.
  EXPECT_TRUE(ChooseRingOrder({{std::numeric_limits<double>::quiet_NaN(), 1}, {1, -5}}).ok());
  EXPECT_EQ(RingBottleneck({{0, 1}, {1, 0}}, {0}), 0);
}

}  // namespace
}  // namespace ts::sidecar
