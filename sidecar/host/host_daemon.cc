#include "sidecar/host/host_daemon.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace ts::sidecar {
namespace {

constexpr std::string_view kComponent = "host";
// A failing step is logged at most this often, so a chain outage or a full disk does not flood
// the log.
constexpr absl::Duration kErrorLogInterval = absl::Seconds(10);

}  // namespace

HostDaemon::HostDaemon(HostCore* core, int64_t poll_interval_ms, size_t max_queued_commands)
    : core_(core), poll_interval_ms_(poll_interval_ms), max_queued_(max_queued_commands) {
  snapshot_ = core_->Snapshot();
}

HostDaemon::~HostDaemon() { Stop(); }

void HostDaemon::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void HostDaemon::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& c : queue_) c->abandoned = true;
    queue_.clear();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status HostDaemon::Run(std::function<void(HostCore&)> fn, absl::Time deadline) {
  auto command = std::make_shared<Command>();
  command->fn = std::move(fn);
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the host sidecar is shutting down");
  if (queue_.size() >= max_queued_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(queue_.size(), " commands queued for the host, try again later"));
  }
  queue_.push_back(command);
  Command* c = command.get();
  mu_.AwaitWithDeadline(absl::Condition(
                            +[](Command* c) { return c->done || c->abandoned; }, c),
                        deadline);
  if (c->done) return absl::OkStatus();
  if (c->abandoned) return absl::UnavailableError("the host sidecar is shutting down");
  // Not finished in time. If it has not started, it never will, and leaves the queue now.
  c->abandoned = true;
  if (!c->started) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->get() == c) {
        queue_.erase(it);
        break;
      }
    }
  }
  return absl::DeadlineExceededError(c->started ? "the host did not finish in time"
                                                : "the host was busy; the command did not run");
}

HostStatusSnapshot HostDaemon::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

void HostDaemon::Loop() {
  absl::Time next_step = absl::Now();
  absl::Time last_error_log = absl::InfinitePast();
  std::string last_error;
  bool records_down = false;
  while (true) {
    std::shared_ptr<Command> command;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](HostDaemon* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
                                  return d->stopping_ || !d->queue_.empty();
                                },
                                this),
                            next_step);
      if (stopping_) return;
      // A due step goes first, so a steady stream of commands cannot stall the follower.
      if (absl::Now() < next_step && !queue_.empty()) {
        command = queue_.front();
        queue_.pop_front();
        if (command->abandoned) continue;
        command->started = true;
      }
    }
    if (command) {
      try {
        command->fn(*core_);
      } catch (const std::exception& e) {
        // A command must never take the owner thread down; this is the thread's edge.
        common::Log(common::LogLevel::kError, kComponent, "command threw", {{"what", e.what()}});
      }
      absl::MutexLock lock(&mu_);
      command->done = true;
      continue;
    }
    absl::Status status = core_->Step();
    next_step = absl::Now() + absl::Milliseconds(poll_interval_ms_);
    HostStatusSnapshot snapshot = core_->Snapshot();
    if (!status.ok() && !snapshot.records_error.empty()) {
      // The records refuse writes (a full disk): nothing the follower decides can be recorded,
      // so it stands still until the database recovers (state::Db does, by itself).
      if (!records_down || absl::Now() - last_error_log >= kErrorLogInterval) {
        common::Log(common::LogLevel::kError, kComponent,
                    "the host's records refuse writes: not following the chain (no reservations, "
                    "no settlement signatures) until the filesystem has room again",
                    {{"records", snapshot.records_path},
                     {"error", snapshot.records_error},
                     {"since_unix_ms", absl::StrCat(snapshot.records_error_since_unix_ms)},
                     {"cursor_height", absl::StrCat(snapshot.cursor_height)},
                     {"chain_height", absl::StrCat(snapshot.chain_height)}});
        last_error_log = absl::Now();
      }
      records_down = true;
      last_error = std::string(status.message());
    } else if (!status.ok()) {
      std::string error(status.message());
      if (error != last_error || absl::Now() - last_error_log >= kErrorLogInterval) {
        common::Log(common::LogLevel::kWarn, kComponent, "step failed; will retry",
                    {{"code", absl::StatusCodeToString(status.code())}, {"error", error}});
        last_error_log = absl::Now();
        last_error = error;
      }
    } else {
      if (records_down && snapshot.records_error.empty()) {
        common::Log(common::LogLevel::kInfo, kComponent,
                    "the host's records take writes again; following the chain",
                    {{"records", snapshot.records_path},
                     {"cursor_height", absl::StrCat(snapshot.cursor_height)},
                     {"chain_height", absl::StrCat(snapshot.chain_height)},
                     {"recoveries", absl::StrCat(snapshot.records_recoveries)}});
        records_down = false;
      }
      last_error.clear();
    }
    absl::MutexLock lock(&mu_);
    snapshot_ = std::move(snapshot);
  }
}

}  // namespace ts::sidecar
