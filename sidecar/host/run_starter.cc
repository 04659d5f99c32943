#include "sidecar/host/run_starter.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"

namespace ts::sidecar {
namespace {

constexpr std::string_view kComponent = "host";

}  // namespace

RunStarter::RunStarter(const HostStore* store, bridge::ChainClient* chain, KnownFn known,
                       StartFn start, RunStarterOptions options)
    : store_(store),
      chain_(chain),
      known_(std::move(known)),
      start_(std::move(start)),
      options_(options) {}

RunStarter::~RunStarter() { Stop(); }

void RunStarter::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RunStarter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::map<uint64_t, RunStarter::ShardState> RunStarter::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return shards_;
}

void RunStarter::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                           absl::Milliseconds(options_.poll_interval_ms));
      if (stopping_) return;
    }
    Pass(common::SystemClock().MonotonicMs());
  }
}

int RunStarter::Pass(int64_t now_ms) {
  // The records change only when the follower processes a height; between heights only the
  // retries that fall due need a look.
  auto cursor = store_->CursorHeight();
  if (!cursor.ok()) return 0;
  bool retry_due = false;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, state] : shards_) {
      if (!state.started && !state.left_alone && state.next_try_ms <= now_ms) retry_due = true;
    }
  }
  if (*cursor == last_cursor_ && !retry_due) return 0;
  last_cursor_ = *cursor;
  auto records = store_->ListShards(std::numeric_limits<size_t>::max());
  if (!records.ok()) return 0;
  int started = 0;
  for (const pb::HostShardRecord& rec : *records) {
    if (rec.status() != pb::SHARD_STATUS_RUNNING || !rec.reserved()) continue;
    ShardState state;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return started;
      state = shards_[rec.shard_id()];
    }
    if (state.started || state.left_alone || state.next_try_ms > now_ms) continue;
    if (TryStart(rec.shard_id(), state, now_ms)) ++started;
    absl::MutexLock lock(&mu_);
    shards_[rec.shard_id()] = state;
  }
  return started;
}

bool RunStarter::TryStart(uint64_t shard_id, ShardState& state, int64_t now_ms) {
  if (known_(shard_id)) {
    state.started = true;
    return false;
  }
  absl::Status result;
  auto shard = chain_->Shard(shard_id);
  if (!shard.ok()) {
    result = shard.status();
  } else if (shard->status() != pb::SHARD_STATUS_RUNNING) {
    // Settled or expired meanwhile: nothing to start (the records will say so shortly).
    state.left_alone = true;
    return false;
  } else if (shard->spec().run_spec().empty()) {
    state.left_alone = true;
    common::Log(common::LogLevel::kInfo, kComponent,
                "shard is running without a run spec on chain; waiting for the operator's "
                "`shard run`",
                {{"shard", absl::StrCat(shard_id)}});
    return false;
  } else {
    result = start_(shard_id, shard->spec().run_spec());
  }
  ++state.attempts;
  if (result.ok()) {
    state.started = true;
    state.last_error.clear();
    common::Log(common::LogLevel::kInfo, kComponent, "started the shard's run from its chain spec",
                {{"shard", absl::StrCat(shard_id)}, {"attempts", absl::StrCat(state.attempts)}});
    return true;
  }
  const int64_t backoff = std::min(
      options_.retry_max_ms, options_.retry_min_ms << std::min<uint32_t>(state.attempts - 1, 20));
  state.next_try_ms = now_ms + backoff;
  std::string error = absl::StrCat(absl::StatusCodeToString(result.code()), ": ", result.message());
  if (error != state.last_error) {
    common::Log(common::LogLevel::kWarn, kComponent, "cannot start the shard's run; will retry",
                {{"shard", absl::StrCat(shard_id)},
                 {"error", error},
                 {"retry_in_ms", absl::StrCat(backoff)}});
  }
  state.last_error = std::move(error);
  return false;
}

}  // namespace ts::sidecar
