// Progress of a long transfer on stderr: `artifact publish` and `artifact fetch` (the host's
// ArtifactProgress stream), `model fetch` (a fetch and an export in this process) and
// `model export` (one call that returns only at the end: a start line and a done line).
// docs/cli.md "Progress" describes the three forms:
//
//   terminal  one line redrawn in place with '\r' (at most every kTerminalRedrawMs): the
//             operation and phase, a bar, bytes done / total in binary units, the rate over the
//             last kRateWindowMs, and the time left at that rate; finished with a newline;
//   plain     (stderr not a terminal) a line at the first update, at each new phase and then at
//             most every kPlainIntervalMs, plus the final one;
//   json      (--json) one JSON object a line, at the first update, at each new phase and then
//             at most every kJsonIntervalMs, plus the final one (done: true): bytes_done,
//             bytes_total, rate_bytes_per_s, eta_s, elapsed_ms.
//
// The command's result still goes to stdout, after the final line; only stderr carries progress.
// Time comes from the Clock given, so tests drive the renderer with a fake one.
//
// Thread-safety: thread-safe. Update, Finish and Stop may be called from any thread (a fetch in
// this process reports from its fetcher threads); an internal mutex serialises them and the
// writes to the stream, which no one else should write to while an operation runs.
#ifndef TS_SIDECAR_CLI_PROGRESS_H_
#define TS_SIDECAR_CLI_PROGRESS_H_

#include <cstdint>
#include <deque>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gonka/trainshard/v1/shard.pb.h"

namespace ts::sidecar {

enum class ProgressMode { kTerminal, kPlain, kJson };

// --json wins; otherwise a terminal on stderr gets the redrawn line and anything else plain lines.
inline ProgressMode ProgressModeFor(bool json, bool err_is_terminal) {
  if (json) return ProgressMode::kJson;
  return err_is_terminal ? ProgressMode::kTerminal : ProgressMode::kPlain;
}

inline constexpr int64_t kTerminalRedrawMs = 100;
inline constexpr int64_t kPlainIntervalMs = 5000;
inline constexpr int64_t kJsonIntervalMs = 1000;
// The rate is the bytes moved over the samples of the last kRateWindowMs (of the same phase).
inline constexpr int64_t kRateWindowMs = 5000;
inline constexpr int kBarWidth = 16;
// A redrawn line must not wrap (a wrapped line is not redrawn in place): lines are kept under the
// usual 80 columns, the rare longer one cut.
inline constexpr size_t kTerminalLineMax = 79;

// "512 B", "1.5 KiB", "3.2 MiB", "1.0 GiB", "2.3 TiB".
std::string HumanBytes(double bytes);
// "0:07", "12:34", "1:02:03"; "--:--" for a negative value (unknown).
std::string HumanDuration(int64_t seconds);

class ProgressRenderer {
 public:
  // `operation` names what runs ("publish", "fetch", "export"); `clock` must outlive this.
  ProgressRenderer(std::ostream& err, ProgressMode mode, std::string operation,
                   common::Clock* clock);
  // Ends a terminal line left open (as Stop).
  ~ProgressRenderer();
  ProgressRenderer(const ProgressRenderer&) = delete;
  ProgressRenderer& operator=(const ProgressRenderer&) = delete;

  // The operation is in `phase` with `bytes_done` of `bytes_total` (0: not known yet). Shown or
  // not by the mode's limits; a new phase is always shown and restarts the rate.
  void Update(std::string_view phase, uint64_t bytes_done, uint64_t bytes_total);
  // A host's progress message. The final one (done = true) is left to Finish, which the command
  // calls once it holds the result.
  void Update(const gonka::trainshard::v1::ArtifactProgress& progress);

  // The final line: `bytes` moved in all, the average rate since this renderer was made, and
  // the time taken; on a terminal the bar drawn full and a newline. Later calls do nothing.
  void Finish(uint64_t bytes);
  // The operation failed (its error follows on stderr): a terminal line is ended with a newline
  // as it stands; nothing else is written. Later calls do nothing.
  void Stop();

 private:
  struct Rate {
    double bytes_per_s = 0;  // 0: not known yet
    int64_t eta_s = -1;      // -1: not known
  };

  Rate RateNow(uint64_t bytes_done, uint64_t bytes_total) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string TerminalLine(const std::string& phase, uint64_t done, uint64_t total,
                           const Rate& rate, bool final_line, int64_t elapsed_ms) const;
  std::string PlainLine(const std::string& phase, uint64_t done, uint64_t total, const Rate& rate,
                        bool final_line, int64_t elapsed_ms) const;
  std::string JsonLine(const std::string& phase, uint64_t done, uint64_t total, const Rate& rate,
                       bool final_line, int64_t elapsed_ms) const;
  void Emit(const std::string& line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndTerminalLine() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::ostream& err_;
  const ProgressMode mode_;
  const std::string operation_;
  common::Clock* const clock_;
  const int64_t start_ms_;

  absl::Mutex mu_;
  std::string phase_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // (monotonic ms, bytes done) of the current phase, the last kRateWindowMs of them.
  std::deque<std::pair<int64_t, uint64_t>> samples_ ABSL_GUARDED_BY(mu_);
  int64_t shown_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // Terminal: whether a line is on screen without its newline, and its width (to blank out
  // what a shorter redraw would leave).
  bool line_open_ ABSL_GUARDED_BY(mu_) = false;
  size_t line_width_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_PROGRESS_H_
