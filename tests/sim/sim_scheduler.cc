#include "tests/sim/sim_scheduler.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ts::sim {

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The calling thread's place in a simulation: its id, and its leaving when the thread ends.
struct ThreadToken {
  SimScheduler* scheduler = nullptr;
  int id = 0;
  ~ThreadToken() {
    if (scheduler != nullptr) scheduler->Leave(id);
  }
};
thread_local ThreadToken token;

SimScheduler::SimScheduler(uint64_t seed) : rng_(seed) {}

SimScheduler::~SimScheduler() {
  absl::MutexLock lock(&mu_);
  if (!threads_.empty()) {
    std::fprintf(stderr, "sim: the scheduler ends with %zu threads in it\n", threads_.size());
    std::abort();
  }
}

int64_t SimScheduler::now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

uint64_t SimScheduler::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

bool SimScheduler::Enter() {
  if (token.scheduler == this) return true;
  absl::MutexLock lock(&mu_);
  if (!expecting_ || token.scheduler != nullptr) return false;
  const int id = next_id_++;
  token.scheduler = this;
  token.id = id;
  threads_[id] = Waiting{.wake = now_};
  expecting_ = false;
  auto mine = [this, id]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return running_ == id; };
  mu_.Await(absl::Condition(&mine));
  return true;
}

void SimScheduler::Sleep(int64_t ms) {
  if (!Enter()) return;
  const int id = token.id;
  absl::MutexLock lock(&mu_);
  threads_[id].wake = now_ + (ms < 0 ? 0 : ms);
  running_ = 0;
  auto mine = [this, id]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return running_ == id; };
  mu_.Await(absl::Condition(&mine));
}

void SimScheduler::Leave(int id) {
  absl::MutexLock lock(&mu_);
  threads_.erase(id);
  if (running_ == id) running_ = 0;
}

int SimScheduler::StartThread(const std::function<void()>& start) {
  {
    absl::MutexLock lock(&mu_);
    expecting_ = true;
  }
  start();
  absl::MutexLock lock(&mu_);
  auto joined = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !expecting_; };
  mu_.Await(absl::Condition(&joined));
  return next_id_ - 1;
}

bool SimScheduler::Has(int id) const {
  absl::MutexLock lock(&mu_);
  return threads_.contains(id);
}

void SimScheduler::AdvanceTo(int64_t ms) {
  absl::MutexLock lock(&mu_);
  int64_t wake = INT64_MAX;
  for (const auto& [id, w] : threads_) wake = std::min(wake, w.wake);
  now_ = std::max(now_, std::min(ms, wake));
}

bool SimScheduler::Step() {
  absl::MutexLock lock(&mu_);
  if (threads_.empty()) return false;
  int64_t wake = INT64_MAX;
  for (const auto& [id, w] : threads_) wake = std::min(wake, w.wake);
  std::vector<int> due;
  for (const auto& [id, w] : threads_) {
    if (w.wake == wake) due.push_back(id);
  }
  const int chosen = due[due.size() == 1 ? 0 : rng_.Below(due.size())];
  if (wake > now_) now_ = wake;
  ++events_;
  running_ = chosen;
  auto back = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return running_ == 0; };
  mu_.Await(absl::Condition(&back));
  return true;
}

int64_t SimScheduler::NextWake() const {
  absl::MutexLock lock(&mu_);
  int64_t wake = INT64_MAX;
  for (const auto& [id, w] : threads_) wake = std::min(wake, w.wake);
  return wake;
}

size_t SimScheduler::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

int64_t SimClock::NowUnixMs() { return 1'800'000'000'000 + MonotonicMs(); }
int64_t SimClock::MonotonicMs() {
  scheduler_.Enter();
  return scheduler_.now();
}
void SimClock::SleepMs(int64_t ms) { scheduler_.Sleep(ms); }

}  // namespace ts::sim
