// RunStarter: the host starts, by itself, the training run of every shard it holds a place in
// once the shard is RUNNING, with the run spec document the shard's spec carries on chain
// (ShardSpec.run_spec, whose SHA-256 the chain checked against run_spec_hash). No operator hands
// the run over; a shard without a run spec document still waits for `trainshard shard run`.
//
// It reads the host's records (which shards are RUNNING with this host a member) after each
// height the follower processed, and the shard's spec from the chain; a run that will not start
// (the shard process refuses it, the chain cannot be reached) is tried again with exponential
// backoff, and its error is logged once per distinct error and kept for Snapshot. A shard whose
// run the host already knows (started before, by the operator or by this class, or recorded
// before a restart) is left to ShardProcesses, which resumes it.
//
// Thread-safety: Start and Stop from one thread; Pass runs on the starter's own thread (or, in
// tests, on the caller's while the thread is not started); Snapshot is thread-safe.
#ifndef TS_SIDECAR_HOST_RUN_STARTER_H_
#define TS_SIDECAR_HOST_RUN_STARTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/client/chain_client.h"
#include "sidecar/host/host_store.h"

namespace ts::sidecar {

struct RunStarterOptions {
  int64_t poll_interval_ms = 500;
  int64_t retry_min_ms = 2'000;
  int64_t retry_max_ms = 300'000;
};

class RunStarter {
 public:
  // Whether the host already knows the shard's run (it has or had a process for it).
  using KnownFn = std::function<bool(uint64_t shard_id)>;
  // Starts the shard's run with the document; OK also when it was already running.
  using StartFn = std::function<absl::Status(uint64_t shard_id, const std::string& run_spec)>;

  // `store` and `chain` are not owned and outlive this.
  RunStarter(const HostStore* store, bridge::ChainClient* chain, KnownFn known, StartFn start,
             RunStarterOptions options = {});
  ~RunStarter();  // Stop()
  RunStarter(const RunStarter&) = delete;
  RunStarter& operator=(const RunStarter&) = delete;

  void Start();
  void Stop();  // idempotent; waits for a start in progress to return

  // One look at the records at monotonic time `now_ms`: starts what is due. Returns how many
  // runs it started.
  int Pass(int64_t now_ms);

  struct ShardState {
    bool started = false;  // this class started it, or found it known
    bool left_alone =
        false;  // no run spec on chain (the operator's `shard run`) or no longer RUNNING
    uint32_t attempts = 0;
    int64_t next_try_ms = 0;
    std::string last_error;
  };
  std::map<uint64_t, ShardState> Snapshot() const;

 private:
  void Loop();
  // Starts one shard's run, or records why not.
  bool TryStart(uint64_t shard_id, ShardState& state, int64_t now_ms);

  const HostStore* const store_;
  bridge::ChainClient* const chain_;
  const KnownFn known_;
  const StartFn start_;
  const RunStarterOptions options_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, ShardState> shards_ ABSL_GUARDED_BY(mu_);
  int64_t last_cursor_ = -1;  // the starter thread's
  std::thread thread_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_RUN_STARTER_H_
