// SimScheduler: simulated time and a seeded scheduler for real code that runs on threads of its
// own (docs/training.md "Simulation"). Every thread of the simulation runs only while it holds
// the one baton: it gives it back whenever it waits (SimClock::SleepMs and every simulated call
// that takes time), and the driver hands it to the thread that wakes first — of those that wake
// at the same simulated time, one drawn from the seed. So a run of the same seed takes the same
// decisions in the same order, to the last byte, however the operating system schedules the
// threads; and simulated time jumps to the next wake-up, so minutes of a protocol's timeouts
// take milliseconds.
//
// A thread becomes one of the simulation's when the driver starts it (StartThread) and it makes
// its first simulated call; it leaves when it ends.
// Threads the simulation did not start (a library's own) must not make simulated calls that
// wait: Sleep returns at once for them.
//
// SimClock is the common::Clock over the scheduler.
//
// Thread-safety: thread-safe; the driver methods are called by one thread.
#ifndef TS_TESTS_SIM_SIM_SCHEDULER_H_
#define TS_TESTS_SIM_SIM_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace ts::sim {

// splitmix64: the same numbers on every platform, for every draw of a simulation.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  // Uniform in [0, n) (n > 0).
  uint64_t Below(uint64_t n) { return Next() % n; }
  // True with probability `p`.
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  int64_t Between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Below(static_cast<uint64_t>(hi - lo + 1)));
  }

 private:
  uint64_t state_;
};

class SimScheduler {
 public:
  explicit SimScheduler(uint64_t seed);
  ~SimScheduler();

  int64_t now() const;
  // The turns handed out so far.
  uint64_t events() const;

  // For the simulation's threads: true when the calling thread is one (registering it if the
  // driver started it and this is its first call, and then waiting for the baton).
  bool Enter();
  // Waits `ms` of simulated time (0: lets the others at this time run first).
  void Sleep(int64_t ms);

  // The driver: runs `start`, which starts one thread that makes a simulated call first, and
  // waits until that thread has joined; returns its id.
  int StartThread(const std::function<void()>& start);
  // Whether the thread `id` is still in the simulation (it has not ended).
  bool Has(int id) const;
  // Moves time on to `ms` when no thread wakes earlier (the driver's own timers).
  void AdvanceTo(int64_t ms);
  // Hands the baton to the next thread and waits until it is back; time moves to that thread's
  // wake-up. False when there is no thread.
  bool Step();
  // The wake-up of the next thread (INT64_MAX when none).
  int64_t NextWake() const;
  size_t threads() const;

 private:
  struct Waiting {
    int64_t wake = 0;
  };
  friend struct ThreadToken;
  void Leave(int id);

  mutable absl::Mutex mu_;
  Rng rng_ ABSL_GUARDED_BY(mu_);
  int64_t now_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, Waiting> threads_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // 0: the driver
  int next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool expecting_ ABSL_GUARDED_BY(mu_) = false;
};

class SimClock final : public common::Clock {
 public:
  explicit SimClock(SimScheduler* scheduler) : scheduler_(*scheduler) {}
  int64_t NowUnixMs() override;
  int64_t MonotonicMs() override;
  void SleepMs(int64_t ms) override;

 private:
  SimScheduler& scheduler_;
};

}  // namespace ts::sim

#endif  // TS_TESTS_SIM_SIM_SCHEDULER_H_
