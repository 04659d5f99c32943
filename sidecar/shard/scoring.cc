#include "sidecar/shard/scoring.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "sidecar/shard/run_context.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

// The fall from `before` to `after` in micro-nats, within ±kScoreMicroMax; a loss that is not
// finite or beyond any model's (a diverged one's) counts as the largest rise.
int64_t FallMicro(double before, double after) {
  constexpr double kLossMax = 1e9;  // nats: 1e15 micro-nats, far inside int64
  if (!(std::fabs(before) < kLossMax && std::fabs(after) < kLossMax)) return -kScoreMicroMax;
  return std::clamp(LossMicroOf(before) - LossMicroOf(after), -kScoreMicroMax, kScoreMicroMax);
}

void PutBigEndian(int64_t v, std::string* out) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

int64_t GetBigEndian(std::string_view in) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<uint8_t>(in[static_cast<size_t>(i)]);
  return static_cast<int64_t>(u);
}

}  // namespace

bool Scores(const ParsedRunSpec& spec) { return spec.spec.verification().scoring() != "off"; }

void AddScoreRequest(const ParsedRunSpec& spec, const std::string& eval_file,
                     pb::InnerStepsRequest* request) {
  if (!Scores(spec)) return;
  const uint32_t windows = spec.spec.verification().score_windows();
  request->set_score_file(eval_file);
  request->set_score_windows(windows);
  request->set_score_first_window(request->round() * windows);
}

StepScore StepScoreOf(const pb::InnerStepsResponse& done) {
  const double first = done.losses().empty() ? 0 : done.losses(0);
  return {.held_out_micro = FallMicro(done.score_base_loss(), done.score_loss()),
          .assigned_micro = FallMicro(first, done.assigned_loss())};
}

StepScore StepScoreOf(const pb::Contribution& c) {
  return {.held_out_micro = c.score_micro(), .assigned_micro = c.assigned_score_micro()};
}

std::string EncodeScoreClaim(const StepScore& score) {
  std::string out;
  PutBigEndian(score.held_out_micro, &out);
  PutBigEndian(score.assigned_micro, &out);
  return out;
}

absl::StatusOr<StepScore> DecodeScoreClaim(std::string_view block, std::string_view who) {
  if (block.size() != kScoreClaimBytes) {
    return absl::InvalidArgumentError(absl::StrCat("score claim of ", std::string(who), ": ",
                                                   block.size(), " bytes, want ",
                                                   kScoreClaimBytes));
  }
  const StepScore score{.held_out_micro = GetBigEndian(block.substr(0, 8)),
                        .assigned_micro = GetBigEndian(block.substr(8, 8))};
  for (int64_t v : {score.held_out_micro, score.assigned_micro}) {
    if (v > kScoreMicroMax || v < -kScoreMicroMax) {
      return absl::InvalidArgumentError(absl::StrCat("score claim of ", std::string(who), ": ", v,
                                                     " is beyond ±", kScoreMicroMax));
    }
  }
  return score;
}

std::vector<bool> LeftOut(const pb::VerificationSpec& verification,
                          const std::vector<StepScore>& scores) {
  if (verification.scoring() != "drop" || scores.empty()) return {};
  std::vector<int64_t> held_out;
  for (const StepScore& s : scores) held_out.push_back(s.held_out_micro);
  std::sort(held_out.begin(), held_out.end());
  // Scores are within ±2^40 and the margin within 2^40 (run_spec.cc): no overflow.
  const int64_t median = held_out[(held_out.size() - 1) / 2];
  const int64_t floor =
      median - static_cast<int64_t>(verification.score_margin_micro()) - std::abs(median) / 2;
  std::vector<bool> out;
  bool any = false;
  for (const StepScore& s : scores) {
    out.push_back(s.held_out_micro < floor);
    any = any || out.back();
  }
  if (!any) out.clear();
  return out;
}

}  // namespace ts::sidecar
