#include "sidecar/collective/aggregate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"

namespace ts::sidecar {
namespace {

constexpr uint32_t kMaxClipIterations = 100;
constexpr char kCommitDomain[] = "gonka-trainshard/v1/collective_commit";

// A float's bits mapped to an integer that orders like the value (−0 just below +0), so sorting
// is a total order: the median of the same values is the same bits whatever their order.
int32_t OrderKey(float x) {
  const int32_t b = std::bit_cast<int32_t>(x);
  return b >= 0 ? b : b ^ 0x7fffffff;
}

float FromOrderKey(int32_t k) { return std::bit_cast<float>(k >= 0 ? k : k ^ 0x7fffffff); }

// Fills keys[0..n) with the sorted order keys of coordinate j.
void SortedColumn(std::span<const std::span<const float>> xs, size_t j, int32_t* keys) {
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) keys[i] = OrderKey(xs[i][j]);
  std::sort(keys, keys + n);
}

// Coordinate-wise median. Even n: the mean of the two middle values, as 0.5·a + 0.5·b, which is
// (a + b) / 2 exactly except that it cannot overflow.
void Median(std::span<const std::span<const float>> xs, std::span<float> out) {
  const size_t n = xs.size();
  std::vector<int32_t> keys(n);
  for (size_t j = 0; j < out.size(); ++j) {
    SortedColumn(xs, j, keys.data());
    if (n % 2 == 1) {
      out[j] = FromOrderKey(keys[n / 2]);
    } else {
      out[j] = 0.5f * FromOrderKey(keys[n / 2 - 1]) + 0.5f * FromOrderKey(keys[n / 2]);
    }
  }
}

// Plain mean: per coordinate, fp32 sum left to right in contribution order, then one division.
void Mean(std::span<const std::span<const float>> xs, std::span<float> out) {
  const float count = static_cast<float>(xs.size());
  std::copy(xs[0].begin(), xs[0].end(), out.begin());
  for (size_t i = 1; i < xs.size(); ++i) {
    const float* __restrict x = xs[i].data();
    float* __restrict o = out.data();
    for (size_t j = 0; j < out.size(); ++j) o[j] += x[j];
  }
  for (float& v : out) v /= count;
}

// Weighted mean: per coordinate, the contributions times their share of the weight, summed in
// contribution order.
void WeightedMean(std::span<const std::span<const float>> xs, std::span<const double> weights,
                  std::span<float> out) {
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t i = 0; i < xs.size(); ++i) {
    const auto share = static_cast<float>(weights[i] / total);
    const float* __restrict x = xs[i].data();
    float* __restrict o = out.data();
    for (size_t j = 0; j < out.size(); ++j) o[j] += share * x[j];
  }
}

// Trimmed mean: the kept values summed in ascending order, then divided by their count.
void TrimmedMean(std::span<const std::span<const float>> xs, size_t trim, std::span<float> out) {
  const size_t n = xs.size();
  const float count = static_cast<float>(n - 2 * trim);
  std::vector<int32_t> keys(n);
  for (size_t j = 0; j < out.size(); ++j) {
    SortedColumn(xs, j, keys.data());
    float sum = 0.0f;
    for (size_t i = trim; i < n - trim; ++i) sum += FromOrderKey(keys[i]);
    out[j] = sum / count;
  }
}

double DistanceTo(std::span<const float> x, const std::vector<double>& v) {
  double sum = 0.0;
  for (size_t j = 0; j < v.size(); ++j) {
    const double d = static_cast<double>(x[j]) - v[j];
    sum += d * d;
  }
  return std::sqrt(sum);
}

double MedianOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * values[n / 2 - 1] + 0.5 * values[n / 2];
}

// Centered clipping. The center, the differences and the norms are kept in fp64 (IEEE, fixed
// order, so still bit-identical everywhere): an attacker's values near FLT_MAX would overflow
// fp32 differences or squared norms to Inf and turn the clip factor into NaN. In fp64 nothing
// overflows for finite fp32 input, and each update is a convex combination of the center and the
// contributions, so the result stays finite.
void CenteredClip(const AggregateSpec& spec, std::span<const std::span<const float>> xs,
                  std::span<float> out) {
  const size_t n = xs.size();
  const size_t dim = out.size();
  Median(xs, out);
  std::vector<double> v(out.begin(), out.end());
  std::vector<double> scale(n);
  for (size_t i = 0; i < n; ++i) scale[i] = DistanceTo(xs[i], v);
  const double tau = spec.clip_tau > 0 ? static_cast<double>(spec.clip_tau) : MedianOf(scale);
  std::vector<double> step(dim);
  for (uint32_t it = 0; it < spec.clip_iterations; ++it) {
    if (it > 0) {
      for (size_t i = 0; i < n; ++i) scale[i] = DistanceTo(xs[i], v);
    }
    // clip_τ(d) = d · min(1, τ / ‖d‖); a zero difference needs no clipping (and no 0/0).
    for (size_t i = 0; i < n; ++i) scale[i] = scale[i] > tau ? tau / scale[i] : 1.0;
    std::fill(step.begin(), step.end(), 0.0);
    for (size_t i = 0; i < n; ++i) {
      const float* x = xs[i].data();
      const double s = scale[i];
      for (size_t j = 0; j < dim; ++j) step[j] += (static_cast<double>(x[j]) - v[j]) * s;
    }
    for (size_t j = 0; j < dim; ++j) v[j] += step[j] / static_cast<double>(n);
  }
  for (size_t j = 0; j < dim; ++j) out[j] = static_cast<float>(v[j]);
}

void AppendBigEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

std::string_view AggregatorName(Aggregator a) {
  switch (a) {
    case Aggregator::kMean:
      return "mean";
    case Aggregator::kMedian:
      return "median";
    case Aggregator::kTrimmedMean:
      return "trimmed_mean";
    case Aggregator::kCenteredClip:
      return "centered_clip";
  }
  return "unknown";
}

absl::StatusOr<Aggregator> ParseAggregator(std::string_view name) {
  for (Aggregator a : {Aggregator::kMean, Aggregator::kMedian, Aggregator::kTrimmedMean,
                       Aggregator::kCenteredClip}) {
    if (name == AggregatorName(a)) return a;
  }
  return absl::InvalidArgumentError(absl::StrCat("aggregator: unknown value '",
                                                 common::AsAbsl(name),
                                                 "' (mean|median|trimmed_mean|centered_clip)"));
}

uint32_t EffectiveTrim(const AggregateSpec& spec, size_t n) {
  if (spec.trim != 0) return spec.trim;
  if (n < 3) return 0;
  return std::max<uint32_t>(1, static_cast<uint32_t>((n - 1) / 3));
}

namespace {

// Aggregate of the contributions spec.left_out keeps, with their weights (a mean's) and a trim
// they allow.
absl::Status AggregateKept(const AggregateSpec& spec,
                           std::span<const std::span<const float>> contributions,
                           std::span<float> out) {
  const size_t n = contributions.size();
  if (spec.left_out.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("aggregate: ", spec.left_out.size(),
                                                   " left_out flags for ", n, " contributions"));
  }
  if (!spec.weights.empty() && spec.weights.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregate: ", spec.weights.size(), " weights for ", n, " contributions"));
  }
  AggregateSpec kept_spec = spec;
  kept_spec.left_out.clear();
  kept_spec.weights.clear();
  std::vector<std::span<const float>> kept;
  for (size_t i = 0; i < n; ++i) {
    if (spec.left_out[i]) continue;
    kept.push_back(contributions[i]);
    if (spec.kind == Aggregator::kMean && !spec.weights.empty()) {
      kept_spec.weights.push_back(spec.weights[i]);
    }
  }
  if (kept.empty()) return absl::InvalidArgumentError("aggregate: every contribution left out");
  if (kept_spec.kind == Aggregator::kTrimmedMean) {
    kept_spec.trim =
        std::min<uint32_t>(EffectiveTrim(spec, n), static_cast<uint32_t>((kept.size() - 1) / 2));
    if (kept_spec.trim == 0) kept_spec.kind = Aggregator::kMean;
  }
  return Aggregate(kept_spec, kept, out);
}

}  // namespace

absl::Status Aggregate(const AggregateSpec& spec,
                       std::span<const std::span<const float>> contributions,
                       std::span<float> out) {
  const size_t n = contributions.size();
  if (spec.kind > Aggregator::kCenteredClip) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregate: kind ", static_cast<int>(spec.kind), " is unknown"));
  }
  if (n == 0) return absl::InvalidArgumentError("aggregate: no contributions");
  if (!spec.left_out.empty()) return AggregateKept(spec, contributions, out);
  for (size_t i = 0; i < n; ++i) {
    if (contributions[i].size() != out.size()) {
      return absl::InvalidArgumentError(absl::StrCat("aggregate: contribution ", i, " has ",
                                                     contributions[i].size(),
                                                     " elements, expected ", out.size()));
    }
  }
  if (spec.kind == Aggregator::kTrimmedMean) {
    const uint32_t trim = EffectiveTrim(spec, n);
    if (n <= 2 * static_cast<size_t>(trim)) {
      return absl::InvalidArgumentError(absl::StrCat("aggregate: trim ", trim, " is too large for ",
                                                     n, " contributions (needs n > 2·trim)"));
    }
  }
  if (spec.kind == Aggregator::kCenteredClip) {
    if (spec.clip_iterations > kMaxClipIterations) {
      return absl::InvalidArgumentError(absl::StrCat(
          "aggregate: clip_iterations ", spec.clip_iterations, " exceeds ", kMaxClipIterations));
    }
    if (!(spec.clip_tau >= 0.0f) || !std::isfinite(spec.clip_tau)) {
      return absl::InvalidArgumentError(
          absl::StrCat("aggregate: clip_tau ", spec.clip_tau, " is negative or not finite"));
    }
  }
  if (!spec.weights.empty()) {
    if (spec.weights.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("aggregate: ", spec.weights.size(), " weights for ", n, " contributions"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (!(spec.weights[i] > 0) || !std::isfinite(spec.weights[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("aggregate: weight ", i, " is ", spec.weights[i], ", not positive"));
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const std::span<const float> x = contributions[i];
    for (size_t j = 0; j < x.size(); ++j) {
      if (!std::isfinite(x[j])) {
        return absl::InvalidArgumentError(absl::StrCat("aggregate: contribution ", i, " element ",
                                                       j, " is not finite (", x[j], ")"));
      }
    }
  }
  switch (spec.kind) {
    case Aggregator::kMean:
      if (std::adjacent_find(spec.weights.begin(), spec.weights.end(), std::not_equal_to<>()) ==
          spec.weights.end()) {
        Mean(contributions, out);  // no weights, or all equal: the plain mean, bit for bit
      } else {
        WeightedMean(contributions, spec.weights, out);
      }
      break;
    case Aggregator::kMedian:
      Median(contributions, out);
      break;
    case Aggregator::kTrimmedMean:
      TrimmedMean(contributions, EffectiveTrim(spec, n), out);
      break;
    case Aggregator::kCenteredClip:
      CenteredClip(spec, contributions, out);
      break;
  }
  return absl::OkStatus();
}

std::string CommitmentOf(uint64_t op_id, uint32_t member_index, std::string_view payload) {
  std::string header = kCommitDomain;
  AppendBigEndian(op_id, 8, &header);
  AppendBigEndian(member_index, 4, &header);
  common::Sha256Hasher hasher;
  hasher.Update(header);
  hasher.Update(payload);
  return hasher.Finish();
}

}  // namespace ts::sidecar
