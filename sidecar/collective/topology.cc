#include "sidecar/collective/topology.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ts::sidecar {
namespace {

using Matrix = std::vector<std::vector<double>>;

constexpr size_t kMaxMembers = 256;
constexpr size_t kMaxExhaustive = 9;  // 8! = 40320 rings
constexpr int kMaxPasses = 32;        // local-search sweeps above kMaxExhaustive
// Links examined by the branch-and-bound search above kMaxExhaustive: tens of milliseconds at
// n = 256 in an optimized build, and enough to finish (so be exact) for the small n where it can.
constexpr int64_t kMaxSearchSteps = int64_t{1} << 21;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A ring's quality: its slowest link first, then the total rate of its links.
struct Score {
  double bottleneck = 0;
  double sum = 0;
};

bool Better(const Score& a, const Score& b) {
  return a.bottleneck > b.bottleneck || (a.bottleneck == b.bottleneck && a.sum > b.sum);
}

Score ScoreOf(const Matrix& rates, const std::vector<size_t>& p) {
  Score s{kInf, 0};
  for (size_t k = 0; k < p.size(); ++k) {
    const double rate = rates[p[k]][p[(k + 1) % p.size()]];
    s.bottleneck = std::min(s.bottleneck, rate);
    s.sum += rate;
  }
  return s;
}

std::vector<size_t> Identity(size_t n) {
  std::vector<size_t> p(n);
  std::iota(p.begin(), p.end(), size_t{0});
  return p;
}

// Every ring starting at member 0, in lexicographic order; the first of the best wins.
std::vector<size_t> Exhaustive(const Matrix& rates) {
  std::vector<size_t> p = Identity(rates.size());
  std::vector<size_t> best = p;
  Score best_score = ScoreOf(rates, p);
  while (std::next_permutation(p.begin() + 1, p.end())) {
    const Score s = ScoreOf(rates, p);
    if (Better(s, best_score)) {
      best_score = s;
      best = p;
    }
  }
  return best;
}

// Each member's others, fastest link first (ties: the lower index, so every use is
// deterministic).
std::vector<std::vector<size_t>> ByRate(const Matrix& rates) {
  const size_t n = rates.size();
  std::vector<std::vector<size_t>> by_rate(n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (j != i) by_rate[i].push_back(j);
    }
    std::stable_sort(by_rate[i].begin(), by_rate[i].end(),
                     [&](size_t a, size_t b) { return rates[i][a] > rates[i][b]; });
  }
  return by_rate;
}

// Nearest neighbour by rate: from `start`, always on to the fastest unvisited member.
std::vector<size_t> Greedy(const std::vector<std::vector<size_t>>& by_rate, size_t start) {
  const size_t n = by_rate.size();
  std::vector<bool> visited(n, false);
  std::vector<size_t> p;
  p.reserve(n);
  size_t at = start;
  for (size_t step = 0; step < n; ++step) {
    p.push_back(at);
    visited[at] = true;
    for (size_t next : by_rate[at]) {
      if (!visited[next]) {
        at = next;
        break;
      }
    }
  }
  return p;
}

// Local search over two move kinds, first improvement, in sweeps until one improves nothing:
//   reversal  — the ring segment p[i+1..j] is traversed backwards (links inside change
//               direction, which matters since rates are directed);
//   relocation — one member moves to another place in the ring.
// Each candidate is estimated in O(1) from prefix/suffix minima and sums, then checked exactly.
class LocalSearch {
 public:
  LocalSearch(const Matrix& rates, std::vector<size_t> p)
      : rates_(rates), n_(p.size()), p_(std::move(p)), f_(n_), b_(n_), pre_(n_ + 1), suf_(n_ + 1) {
    Refresh();
  }

  std::vector<size_t> Run() {
    for (int pass = 0; pass < kMaxPasses; ++pass) {
      const bool reversed = ReversalSweep();
      const bool relocated = RelocationSweep();
      if (!reversed && !relocated) break;
    }
    return p_;
  }

 private:
  double Rate(size_t from, size_t to) const { return rates_[from][to]; }

  void Refresh() {
    score_ = ScoreOf(rates_, p_);
    for (size_t k = 0; k < n_; ++k) {
      f_[k] = Rate(p_[k], p_[(k + 1) % n_]);
      b_[k] = Rate(p_[(k + 1) % n_], p_[k]);
    }
    pre_[0] = kInf;
    for (size_t k = 0; k < n_; ++k) pre_[k + 1] = std::min(pre_[k], f_[k]);
    suf_[n_] = kInf;
    for (size_t k = n_; k-- > 0;) suf_[k] = std::min(suf_[k + 1], f_[k]);
    // The four slowest links, for "the slowest link not among these three".
    slowest_.fill({kInf, n_});
    for (size_t k = 0; k < n_; ++k) {
      std::pair<double, size_t> entry{f_[k], k};
      for (auto& slot : slowest_) {
        if (entry < slot) std::swap(entry, slot);
      }
    }
  }

  double SlowestExcept(size_t a, size_t b, size_t c) const {
    for (const auto& [rate, k] : slowest_) {
      if (k != a && k != b && k != c) return rate;
    }
    return kInf;
  }

  bool Promising(double bottleneck, double sum) const {
    return Better(Score{bottleneck, sum}, score_);
  }

  // Keeps the trial order if it is exactly better; otherwise restores the saved one.
  bool Accept(std::vector<size_t>& saved) {
    if (Better(ScoreOf(rates_, p_), score_)) {
      Refresh();
      return true;
    }
    p_.swap(saved);
    return false;
  }

  bool ReversalSweep() {
    bool improved = false;
    std::vector<size_t> saved;
    for (size_t i = 0; i + 2 < n_; ++i) {
      double inner_min = kInf;
      double inner_forward = 0;
      double inner_backward = 0;
      for (size_t j = i + 2; j < n_; ++j) {
        // Links i+1..j-1 lie inside the segment and change direction.
        inner_min = std::min(inner_min, b_[j - 1]);
        inner_forward += f_[j - 1];
        inner_backward += b_[j - 1];
        const double in_link = Rate(p_[i], p_[j]);
        const double out_link = Rate(p_[i + 1], p_[(j + 1) % n_]);
        const double bottleneck = std::min({pre_[i], suf_[j + 1], inner_min, in_link, out_link});
        const double sum =
            score_.sum - f_[i] - f_[j] - inner_forward + inner_backward + in_link + out_link;
        if (!Promising(bottleneck, sum)) continue;
        saved = p_;
        std::reverse(p_.begin() + static_cast<std::ptrdiff_t>(i + 1),
                     p_.begin() + static_cast<std::ptrdiff_t>(j + 1));
        if (Accept(saved)) {
          improved = true;
          // The prefix structures changed: restart this i's segments.
          inner_min = kInf;
          inner_forward = 0;
          inner_backward = 0;
          j = i + 1;
        }
      }
    }
    return improved;
  }

  bool RelocationSweep() {
    bool improved = false;
    std::vector<size_t> saved;
    for (size_t a = 0; a < n_; ++a) {
      for (size_t c = 0; c < n_; ++c) {
        const size_t before = (a + n_ - 1) % n_;
        // Moving p[a] between p[c] and p[c+1]; c == a or c == a−1 leaves the ring as it is.
        if (c == a || c == before) continue;
        const size_t u = p_[a];
        const size_t after = (a + 1) % n_;
        const double bridge = Rate(p_[before], p_[after]);
        const double in_link = Rate(p_[c], u);
        const double out_link = Rate(u, p_[(c + 1) % n_]);
        const double bottleneck =
            std::min({SlowestExcept(before, a, c), bridge, in_link, out_link});
        const double sum = score_.sum - f_[before] - f_[a] - f_[c] + bridge + in_link + out_link;
        if (!Promising(bottleneck, sum)) continue;
        saved = p_;
        p_.erase(p_.begin() + static_cast<std::ptrdiff_t>(a));
        // After the erase, p[c] sits at c − 1 when it followed a.
        const size_t insert_at = c > a ? c : c + 1;
        p_.insert(p_.begin() + static_cast<std::ptrdiff_t>(insert_at), u);
        if (Accept(saved)) improved = true;
      }
    }
    return improved;
  }

  const Matrix& rates_;
  const size_t n_;
  std::vector<size_t> p_;
  Score score_;
  std::vector<double> f_;    // f_[k]: rate of link p[k] → p[k+1]
  std::vector<double> b_;    // b_[k]: rate of the reverse, p[k+1] → p[k]
  std::vector<double> pre_;  // pre_[k]: slowest of f_[0..k)
  std::vector<double> suf_;  // suf_[k]: slowest of f_[k..n)
  std::array<std::pair<double, size_t>, 4> slowest_;
};

// No ring can beat its members' fastest links: every member needs a way out and a way in.
double UpperBound(const Matrix& rates) {
  const size_t n = rates.size();
  double bound = kInf;
  for (size_t i = 0; i < n; ++i) {
    double out = 0;
    double in = 0;
    for (size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      out = std::max(out, rates[i][j]);
      in = std::max(in, rates[j][i]);
    }
    bound = std::min({bound, out, in});
  }
  return bound;
}

// Depth-first search from member 0 for a ring whose slowest link beats the best known: only
// links faster than that are followed, fastest first, and each ring found raises the bar. Exact
// when it runs to the end; it stops early at the upper bound or after kMaxSearchSteps links.
class BottleneckSearch {
 public:
  BottleneckSearch(const Matrix& rates, const std::vector<std::vector<size_t>>& by_rate,
                   std::vector<size_t> best, double upper_bound)
      : rates_(rates),
        by_rate_(by_rate),
        n_(rates.size()),
        best_(std::move(best)),
        best_bottleneck_(ScoreOf(rates_, best_).bottleneck),
        upper_bound_(upper_bound),
        used_(n_, false) {}

  std::vector<size_t> Run() {
    path_ = {0};
    used_[0] = true;
    Visit(0, kInf);
    return best_;
  }

 private:
  void Visit(size_t at, double slowest) {
    if (slowest <= best_bottleneck_) return;  // the bar rose since this path was started
    if (path_.size() == n_) {
      const double ring = std::min(slowest, rates_[at][0]);
      if (ring > best_bottleneck_) {
        best_bottleneck_ = ring;
        best_ = path_;
        stop_ = ring >= upper_bound_;
      }
      return;
    }
    for (size_t next : by_rate_[at]) {
      if (stop_ || --steps_left_ < 0) {
        stop_ = true;
        return;
      }
      const double rate = rates_[at][next];
      if (rate <= best_bottleneck_) return;  // the rest are no faster
      if (used_[next]) continue;
      used_[next] = true;
      path_.push_back(next);
      Visit(next, std::min(slowest, rate));
      path_.pop_back();
      used_[next] = false;
    }
  }

  const Matrix& rates_;
  const std::vector<std::vector<size_t>>& by_rate_;
  const size_t n_;
  std::vector<size_t> best_;
  double best_bottleneck_;
  const double upper_bound_;
  std::vector<bool> used_;
  std::vector<size_t> path_;
  int64_t steps_left_ = kMaxSearchSteps;
  bool stop_ = false;
};

std::vector<size_t> Heuristic(const Matrix& rates) {
  const size_t n = rates.size();
  // Start from the best of the given order and a greedy tour from every member.
  const std::vector<std::vector<size_t>> by_rate = ByRate(rates);
  std::vector<size_t> best = Identity(n);
  Score best_score = ScoreOf(rates, best);
  for (size_t start = 0; start < n; ++start) {
    std::vector<size_t> p = Greedy(by_rate, start);
    const Score s = ScoreOf(rates, p);
    if (Better(s, best_score)) {
      best_score = s;
      best = std::move(p);
    }
  }
  std::vector<size_t> p = LocalSearch(rates, std::move(best)).Run();
  std::rotate(p.begin(), std::find(p.begin(), p.end(), size_t{0}), p.end());
  // Local search rarely removes the slowest link when every move doing so adds another slow
  // one; the bounded search looks for a better bottleneck directly, then local search raises
  // the total rate of what it found without lowering its bottleneck.
  const double upper_bound = UpperBound(rates);
  if (ScoreOf(rates, p).bottleneck < upper_bound) {
    std::vector<size_t> found = BottleneckSearch(rates, by_rate, p, upper_bound).Run();
    if (found != p) {
      p = LocalSearch(rates, std::move(found)).Run();
      std::rotate(p.begin(), std::find(p.begin(), p.end(), size_t{0}), p.end());
    }
  }
  return p;
}

}  // namespace

absl::StatusOr<std::vector<size_t>> ChooseRingOrder(const Matrix& rates) {
  const size_t n = rates.size();
  if (n < 2 || n > kMaxMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rates: ", n, " members, expected 2..", kMaxMembers));
  }
  for (size_t i = 0; i < n; ++i) {
    if (rates[i].size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("rates: row ", i, " has ", rates[i].size(), " entries, expected ", n));
    }
    for (size_t j = 0; j < n; ++j) {
      if (i != j && !(rates[i][j] >= 0 && std::isfinite(rates[i][j]))) {
        return absl::InvalidArgumentError(
            absl::StrCat("rates[", i, "][", j, "] = ", rates[i][j], " is negative or not finite"));
      }
    }
  }
  return n <= kMaxExhaustive ? Exhaustive(rates) : Heuristic(rates);
}

double RingBottleneck(const Matrix& rates, const std::vector<size_t>& order) {
  if (order.size() < 2) return 0;
  for (size_t member : order)
    TS_CHECK(member < rates.size() && rates[member].size() == rates.size());
  return ScoreOf(rates, order).bottleneck;
}

}  // namespace ts::sidecar
