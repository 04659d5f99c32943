#include "sidecar/cli/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace ts::sidecar {
namespace {

int64_t IntervalMs(ProgressMode mode) {
  switch (mode) {
    case ProgressMode::kTerminal:
      return kTerminalRedrawMs;
    case ProgressMode::kPlain:
      return kPlainIntervalMs;
    case ProgressMode::kJson:
      return kJsonIntervalMs;
  }
  return kPlainIntervalMs;
}

// Whole percent, never above 100 (a host may report more done than its total while it learns
// the total).
int Percent(uint64_t done, uint64_t total) {
  if (total == 0) return 0;
  double percent = 100.0 * static_cast<double>(done) / static_cast<double>(total);
  return static_cast<int>(std::min(100.0, std::floor(percent)));
}

std::string Bar(uint64_t done, uint64_t total) {
  int filled = total == 0 ? 0
                          : static_cast<int>(std::min<double>(
                                kBarWidth, std::floor(kBarWidth * static_cast<double>(done) /
                                                      static_cast<double>(total))));
  return absl::StrCat("[", std::string(static_cast<size_t>(filled), '#'),
                      std::string(static_cast<size_t>(kBarWidth - filled), '-'), "]");
}

std::string RateText(double bytes_per_s) {
  return bytes_per_s > 0 ? absl::StrCat(HumanBytes(bytes_per_s), "/s") : "--/s";
}

// "2.5 s" under a minute, "m:ss" (or "h:mm:ss") above.
std::string Elapsed(int64_t elapsed_ms) {
  if (elapsed_ms < 60000) return absl::StrFormat("%.1f s", static_cast<double>(elapsed_ms) / 1000);
  return HumanDuration(elapsed_ms / 1000);
}

// A phase name comes from the host and is drawn on a terminal: printable ASCII only, short.
std::string SafePhase(std::string_view phase) {
  constexpr size_t kPhaseMax = 32;
  std::string safe;
  for (char c : phase.substr(0, kPhaseMax)) safe += (c >= 0x20 && c < 0x7f) ? c : '?';
  return safe;
}

}  // namespace

std::string HumanBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrFormat("%.0f B", std::max(0.0, bytes));
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

std::string HumanDuration(int64_t seconds) {
  if (seconds < 0) return "--:--";
  if (seconds >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", seconds / 3600, seconds / 60 % 60, seconds % 60);
  }
  return absl::StrFormat("%d:%02d", seconds / 60, seconds % 60);
}

ProgressRenderer::ProgressRenderer(std::ostream& err, ProgressMode mode, std::string operation,
                                   common::Clock* clock)
    : err_(err),
      mode_(mode),
      operation_(std::move(operation)),
      clock_(clock),
      start_ms_(clock->MonotonicMs()) {}

ProgressRenderer::~ProgressRenderer() { Stop(); }

void ProgressRenderer::Update(const gonka::trainshard::v1::ArtifactProgress& progress) {
  if (progress.done()) return;
  Update(progress.phase(), progress.bytes_done(), progress.bytes_total());
}

void ProgressRenderer::Update(std::string_view phase, uint64_t bytes_done, uint64_t bytes_total) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  const int64_t now = clock_->MonotonicMs();
  const std::string safe_phase = SafePhase(phase);
  const bool new_phase = !started_ || safe_phase != phase_;
  started_ = true;
  if (new_phase) {
    phase_ = safe_phase;
    samples_.clear();
  }
  // A count that went back (a restarted step) makes the older samples meaningless.
  if (!samples_.empty() && bytes_done < samples_.back().second) samples_.clear();
  samples_.emplace_back(now, bytes_done);
  while (samples_.size() > 2 && now - samples_.front().first > kRateWindowMs) {
    samples_.pop_front();
  }
  if (!new_phase && now - shown_ms_ < IntervalMs(mode_)) return;
  shown_ms_ = now;
  const Rate rate = RateNow(bytes_done, bytes_total);
  const int64_t elapsed_ms = now - start_ms_;
  switch (mode_) {
    case ProgressMode::kTerminal:
      Emit(TerminalLine(phase_, bytes_done, bytes_total, rate, /*final_line=*/false, elapsed_ms));
      break;
    case ProgressMode::kPlain:
      Emit(PlainLine(phase_, bytes_done, bytes_total, rate, /*final_line=*/false, elapsed_ms));
      break;
    case ProgressMode::kJson:
      Emit(JsonLine(phase_, bytes_done, bytes_total, rate, /*final_line=*/false, elapsed_ms));
      break;
  }
}

void ProgressRenderer::Finish(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  ended_ = true;
  const int64_t elapsed_ms = std::max<int64_t>(0, clock_->MonotonicMs() - start_ms_);
  Rate rate;
  rate.eta_s = 0;
  if (elapsed_ms > 0) rate.bytes_per_s = static_cast<double>(bytes) * 1000.0 / elapsed_ms;
  switch (mode_) {
    case ProgressMode::kTerminal:
      Emit(TerminalLine("done", bytes, bytes, rate, /*final_line=*/true, elapsed_ms));
      EndTerminalLine();
      break;
    case ProgressMode::kPlain:
      Emit(PlainLine("done", bytes, bytes, rate, /*final_line=*/true, elapsed_ms));
      break;
    case ProgressMode::kJson:
      Emit(JsonLine("done", bytes, bytes, rate, /*final_line=*/true, elapsed_ms));
      break;
  }
}

void ProgressRenderer::Stop() {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  ended_ = true;
  EndTerminalLine();
}

ProgressRenderer::Rate ProgressRenderer::RateNow(uint64_t bytes_done, uint64_t bytes_total) const {
  Rate rate;
  if (samples_.size() >= 2) {
    const int64_t span_ms = samples_.back().first - samples_.front().first;
    const uint64_t moved = samples_.back().second - samples_.front().second;
    if (span_ms > 0 && moved > 0) rate.bytes_per_s = static_cast<double>(moved) * 1000.0 / span_ms;
  }
  if (bytes_total > 0 && bytes_done >= bytes_total) {
    rate.eta_s = 0;
  } else if (bytes_total > 0 && rate.bytes_per_s > 0) {
    rate.eta_s = static_cast<int64_t>(
        std::ceil(static_cast<double>(bytes_total - bytes_done) / rate.bytes_per_s));
  }
  return rate;
}

std::string ProgressRenderer::TerminalLine(const std::string& phase, uint64_t done, uint64_t total,
                                           const Rate& rate, bool final_line,
                                           int64_t elapsed_ms) const {
  std::string line = absl::StrCat(operation_, " ", phase);
  if (final_line) {
    absl::StrAppend(&line, " ", Bar(1, 1), " 100%  ", HumanBytes(static_cast<double>(done)), "  ",
                    RateText(rate.bytes_per_s), "  in ", Elapsed(elapsed_ms));
  } else if (total > 0) {
    absl::StrAppend(&line, " ", Bar(done, total), absl::StrFormat(" %3d%%  ", Percent(done, total)),
                    HumanBytes(static_cast<double>(done)), "/",
                    HumanBytes(static_cast<double>(total)), "  ", RateText(rate.bytes_per_s),
                    "  ETA ", HumanDuration(rate.eta_s));
  } else if (done > 0) {
    absl::StrAppend(&line, "  ", HumanBytes(static_cast<double>(done)), "  ",
                    RateText(rate.bytes_per_s));
  }
  if (line.size() > kTerminalLineMax) line.resize(kTerminalLineMax);
  return line;
}

std::string ProgressRenderer::PlainLine(const std::string& phase, uint64_t done, uint64_t total,
                                        const Rate& rate, bool final_line,
                                        int64_t elapsed_ms) const {
  if (final_line) {
    return absl::StrCat(operation_, ": done, ", HumanBytes(static_cast<double>(done)), " in ",
                        Elapsed(elapsed_ms), " (", RateText(rate.bytes_per_s), ")");
  }
  std::string line = absl::StrCat(operation_, ": ", phase);
  if (total > 0) {
    absl::StrAppend(&line, " ", Percent(done, total), "% ", HumanBytes(static_cast<double>(done)),
                    " / ", HumanBytes(static_cast<double>(total)), ", ", RateText(rate.bytes_per_s),
                    ", ETA ", HumanDuration(rate.eta_s));
  } else if (done > 0) {
    absl::StrAppend(&line, " ", HumanBytes(static_cast<double>(done)), ", ",
                    RateText(rate.bytes_per_s));
  }
  return line;
}

std::string ProgressRenderer::JsonLine(const std::string& phase, uint64_t done, uint64_t total,
                                       const Rate& rate, bool final_line,
                                       int64_t elapsed_ms) const {
  nlohmann::ordered_json line = {
      {"operation", operation_},
      {"phase", phase},
      {"done", final_line},
      {"bytes_done", done},
      {"bytes_total", total},
      {"rate_bytes_per_s", static_cast<uint64_t>(std::llround(rate.bytes_per_s))},
      {"eta_s",
       rate.eta_s < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(rate.eta_s)},
      {"elapsed_ms", elapsed_ms},
  };
  return line.dump();
}

void ProgressRenderer::Emit(const std::string& line) {
  if (mode_ != ProgressMode::kTerminal) {
    err_ << line << "\n" << std::flush;
    return;
  }
  // Blank out the tail of a longer line drawn before.
  std::string padded = line;
  if (padded.size() < line_width_) padded.append(line_width_ - padded.size(), ' ');
  line_width_ = line.size();
  err_ << "\r" << padded << std::flush;
  line_open_ = true;
}

void ProgressRenderer::EndTerminalLine() {
  if (!line_open_) return;
  err_ << "\n" << std::flush;
  line_open_ = false;
}

}  // namespace ts::sidecar
