// HostDaemon: the one owner thread of a HostCore. It polls the chain every poll_interval_ms
// (HostCore::Step) and runs the commands that gRPC handlers queue for it, one at a time, so the
// control-plane state has a single writer and no locks inside HostCore. The queue is bounded:
// a full queue answers RESOURCE_EXHAUSTED rather than letting callers pile up.
//
// A failing step is logged at most every 10 s: at warn level, or, while the records refuse
// writes (a full disk), at error level, saying that the host is not following the chain; the
// step after the records recover says so at info level.
//
// Thread-safety: Run, Snapshot and Stop are thread-safe; Start is called once.
#ifndef TS_SIDECAR_HOST_HOST_DAEMON_H_
#define TS_SIDECAR_HOST_HOST_DAEMON_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sidecar/host/host_core.h"

namespace ts::sidecar {

class HostDaemon {
 public:
  // `core` is not owned and must outlive the daemon.
  HostDaemon(HostCore* core, int64_t poll_interval_ms, size_t max_queued_commands = 64);
  ~HostDaemon();  // Stop()s
  HostDaemon(const HostDaemon&) = delete;
  HostDaemon& operator=(const HostDaemon&) = delete;

  void Start();
  // Finishes the command or step in progress, drops queued commands (their callers get
  // UNAVAILABLE) and joins the thread. Idempotent.
  void Stop();

  // Runs `fn` on the owner thread and waits for it. RESOURCE_EXHAUSTED if the queue is full;
  // DEADLINE_EXCEEDED if it has not finished by `deadline` (if it had not started, it never
  // will); UNAVAILABLE if the daemon is stopping. Otherwise OK: `fn` ran.
  absl::Status Run(std::function<void(HostCore&)> fn, absl::Time deadline);

  // The last status taken on the owner thread (after each step).
  HostStatusSnapshot Snapshot() const;

 private:
  struct Command {
    std::function<void(HostCore&)> fn;
    bool started = false;
    bool done = false;
    bool abandoned = false;
  };

  void Loop();

  HostCore* const core_;
  const int64_t poll_interval_ms_;
  const size_t max_queued_;

  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<Command>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  HostStatusSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_HOST_DAEMON_H_
