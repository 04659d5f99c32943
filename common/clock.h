// Clock: the only way code reads time, so tests can drive it. SystemClock is the real one.
// Implementations are thread-safe.
#ifndef TS_COMMON_CLOCK_H_
#define TS_COMMON_CLOCK_H_

#include <cstdint>

namespace ts::common {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time, milliseconds since the Unix epoch.
  virtual int64_t NowUnixMs() = 0;
  // Monotonic time in milliseconds from an arbitrary origin, for deadlines and intervals.
  virtual int64_t MonotonicMs() = 0;
  virtual void SleepMs(int64_t ms) = 0;
};

// Returns a process-wide real clock (stateless).
Clock& SystemClock();

}  // namespace ts::common

#endif  // TS_COMMON_CLOCK_H_
