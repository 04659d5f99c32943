#include "common/clock.h"

#include <chrono>
#include <thread>

namespace ts::common {
namespace {

class RealClock final : public Clock {
 public:
  int64_t NowUnixMs() override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  int64_t MonotonicMs() override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void SleepMs(int64_t ms) override { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
};

}  // namespace

Clock& SystemClock() {
  static RealClock* clock = new RealClock();
  return *clock;
}

}  // namespace ts::common
