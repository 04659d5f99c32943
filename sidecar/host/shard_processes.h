// ShardProcesses: the host sidecar's side of its shard processes (docs/architecture.md, "Shard
// process"). Each shard this host trains in runs in a `ts_shard` process of its own, which
// drives the run's worker, carries the collective's traffic and keeps the run's records in a
// database of its own; a crash there leaves the sidecar and the other shards running.
//
// This class starts a shard's process when the operator starts its run (and, after a restart of
// the sidecar, for every shard whose process it recorded), watches it, starts it again with
// exponential backoff when it dies (the run resumes from its records), stops it once its run has
// been done for idle_stop_ms (and starts it again when it is needed), and stops every process
// with SIGTERM when the sidecar stops. It serves ShardRunOperator to the operator and ShardRound
// to peers by forwarding each call to the shard's process over its Unix socket, with a deadline
// no later than the caller's and at most kForwardTimeoutMs (kEvaluateTimeoutMs for Evaluate);
// the process checks every request itself (peer signatures, audience, expiry, membership). The
// processes themselves reach the sidecar through its Unix socket (sidecar/shard/host_link.h).
//
// Thread-safety: thread-safe. Processes are spawned on the supervisor's own thread, which lives
// until StopAll, so their death signal (PR_SET_PDEATHSIG) is tied to the sidecar's life. That
// signal is SIGKILL: a sidecar that dies takes its shard processes along at once, as the host's
// own death would, and no run goes on without the sidecar that signs for it (a sidecar that
// stops cleanly sends SIGTERM first).
#ifndef TS_SIDECAR_HOST_SHARD_PROCESSES_H_
#define TS_SIDECAR_HOST_SHARD_PROCESSES_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gonka/trainshard/v1/training.grpc.pb.h"
#include "state/db.h"

namespace ts::sidecar {

// Table in the host's database: be64(shard) -> "" for every shard whose process the sidecar runs,
// or the serialized final ShardRunStatus of a run that is done and whose process was stopped.
inline constexpr std::string_view kTableShardProcesses = "shard_processes";

inline constexpr int64_t kForwardTimeoutMs = 30'000;
inline constexpr int64_t kEvaluateTimeoutMs = 600'000;

struct ShardProcessOptions {
  std::string binary;       // the ts_shard executable
  std::string shards_dir;   // absolute: <data_dir>/shards; a shard's folder is <shards_dir>/<id>
  std::string host_socket;  // the sidecar's Unix socket, passed to the processes
  // A private folder (mode 0700) for a shard process's socket when <shards_dir>/<id>/shard.sock
  // would be longer than a Unix socket path may be.
  std::string fallback_socket_dir = "/tmp";
  std::string key_file;
  std::string chain_endpoint;
  std::string chain_profile = "trainshard";  // ts_shard --chain-profile (gonka_v0_client.h)
  std::string worker_binary;
  int worker_threads = 2;
  std::string worker_device = "cpu";     // each worker's --device
  uint64_t worker_memory_bytes_max = 0;  // each worker's --memory-bytes-max; 0: the machine's
  std::string collective_host = "127.0.0.1";
  // The processes talk TLS to the other members' round service (ts_shard --peer-tls).
  bool peer_tls = false;
  // The data dir holding the host's TLS identity (tls.key, tls.crt), for the collective's TLS.
  std::string tls_dir;
  std::string log_level = "info";
  int64_t start_timeout_ms = 30'000;  // a Start waits this long for a new process to serve
  int64_t restart_backoff_min_ms = 500;
  int64_t restart_backoff_max_ms = 30'000;
  int64_t stable_after_ms = 60'000;  // up this long: the next restart starts at the minimum
  int64_t stop_grace_ms = 20'000;    // SIGTERM to SIGKILL
  // A run "done" (its shard settled or ended on chain) this long has its process stopped; the
  // sidecar answers its Status from the last one it saw, and an Evaluate or a peer's
  // GetCertificates starts the process again. 0: never stopped.
  int64_t idle_stop_ms = 60'000;
  int64_t status_poll_ms = 2'000;  // how often each process's run state is read
};

// What this host's own records say a shard's settlement must be: the host signs a settlement
// draft only if it is byte for byte the one its certified records imply (docs/host-sidecar.md,
// "Signing settlements").
class SettlementRecords {
 public:
  virtual ~SettlementRecords() = default;
  // The draft the host's records imply for rounds 1..`rounds` (0: all the run spec's; fewer: a
  // partial settlement). FAILED_PRECONDITION when the host keeps no training records for the
  // shard or has not certified those rounds; UNAVAILABLE or DEADLINE_EXCEEDED when the records
  // cannot be read before `deadline`.
  virtual absl::StatusOr<::gonka::trainshard::v1::Settlement> CertifiedDraft(
      uint64_t shard_id, uint64_t rounds, absl::Time deadline) = 0;
};

class ShardProcesses final : public ::gonka::trainshard::v1::ShardRunOperator::Service,
                             public ::gonka::trainshard::v1::ShardRound::Service,
                             public SettlementRecords {
 public:
  // `db` is not owned, outlives this, and was opened with kTableShardProcesses.
  ShardProcesses(state::Db* db, ShardProcessOptions options);
  ~ShardProcesses() override;  // StopAll()

  // Sets the chain id and starts the supervisor: a process for every recorded shard. Later calls
  // are ignored. First moves the records of runs kept in the host's database (tables `rounds`
  // and `run_specs`, as before shard processes) into each shard's own database and records the
  // shard, so such a run resumes in its process; a shard whose move fails keeps its rows there
  // (logged) and is tried again at the next start.
  void Activate(const std::string& chain_id);
  // Stops every process (SIGTERM, then SIGKILL after stop_grace_ms) and the supervisor.
  // Idempotent.
  void StopAll();

  // Records the shard, starts its process (or finds it running), waits until it serves and
  // forwards the call. A refused run leaves no process behind unless the shard already had one.
  grpc::Status Start(grpc::ServerContext* context,
                     const ::gonka::trainshard::v1::StartShardRunRequest* request,
                     ::gonka::trainshard::v1::StartShardRunResponse* response) override;
  // Forwarded; the answer carries the process's pid and restart count. For a finished run whose
  // process was stopped, the status stored when it was stopped (pid 0).
  grpc::Status Status(grpc::ServerContext* context,
                      const ::gonka::trainshard::v1::ShardRunStatusRequest* request,
                      ::gonka::trainshard::v1::ShardRunStatus* response) override;
  // Forwarded, the process of a finished run started first; while a new process prepares its
  // worker and data (UNAVAILABLE) the call is made again, until the deadline.
  grpc::Status Evaluate(grpc::ServerContext* context,
                        const ::gonka::trainshard::v1::EvaluateCheckpointRequest* request,
                        ::gonka::trainshard::v1::EvaluateCheckpointResponse* response) override;
  // Forwarded to the shard's process (started first if its run is done), as CertifiedDraft.
  grpc::Status DraftSettlement(grpc::ServerContext* context,
                               const ::gonka::trainshard::v1::DraftSettlementRequest* request,
                               ::gonka::trainshard::v1::DraftSettlementResponse* response) override;
  grpc::Status Announce(grpc::ServerContext* context,
                        const ::gonka::trainshard::v1::AnnounceRequest* request,
                        ::gonka::trainshard::v1::AnnounceResponse* response) override;
  grpc::Status GetCertificates(grpc::ServerContext* context,
                               const ::gonka::trainshard::v1::GetCertificatesRequest* request,
                               ::gonka::trainshard::v1::GetCertificatesResponse* response) override;

  // SettlementRecords: asks the shard's process (started again if its run is done and it was
  // stopped) for the draft its records imply; while a new process starts (UNAVAILABLE) it asks
  // again until the deadline. FAILED_PRECONDITION for a shard without a process on this host.
  absl::StatusOr<::gonka::trainshard::v1::Settlement> CertifiedDraft(uint64_t shard_id,
                                                                     uint64_t rounds,
                                                                     absl::Time deadline) override;

  // Start for the host itself (sidecar/host/run_starter.h): the run of `shard_id` with the run
  // spec document the chain pins. Errors as Start's, as absl::Status.
  absl::StatusOr<::gonka::trainshard::v1::StartShardRunResponse> StartRun(
      uint64_t shard_id, const std::string& run_spec);

  // The socket a shard's process serves on.
  std::string SocketPath(uint64_t shard_id) const;

  // What the supervisor knows of a shard's process; nullopt for a shard without one here.
  struct ProcessInfo {
    pid_t pid = 0;          // 0 while none runs (between a death and the next start)
    bool serving = false;   // its socket is connected to
    uint32_t restarts = 0;  // starts after the first
    std::string last_exit;  // how the previous process ended
    bool finished = false;  // its run is done and its process stopped
  };
  std::optional<ProcessInfo> Info(uint64_t shard_id) const;

 private:
  struct Child {
    pid_t pid = 0;
    int64_t started_ms = 0;
    int64_t next_start_ms = 0;
    int64_t backoff_ms = 0;
    uint32_t starts = 0;
    uint32_t restarts() const { return starts > 0 ? starts - 1 : 0; }
    std::string last_exit;       // how the previous process ended
    bool stop = false;           // asked to stop; not started again
    bool being_stopped = false;  // the supervisor is stopping its process (outside the lock)
    bool finished = false;       // its run is done and its process stopped (not restarted)
    std::string final_status;    // then: its last ShardRunStatus, serialized
    int64_t done_since_ms = 0;   // when its run was first seen done (0: not done)
    std::shared_ptr<::gonka::trainshard::v1::ShardRunOperator::Stub> operator_stub;
    std::shared_ptr<::gonka::trainshard::v1::ShardRound::Stub> round_stub;
  };
  struct Stubs {
    std::shared_ptr<::gonka::trainshard::v1::ShardRunOperator::Stub> operator_stub;
    std::shared_ptr<::gonka::trainshard::v1::ShardRound::Stub> round_stub;
    pid_t pid = 0;
    uint32_t restarts = 0;
  };

  void Loop();
  // Reads each serving process's run state; stops the processes of runs done for idle_stop_ms.
  void PollRuns();
  // A finished shard's process is started again; waits until it serves (up to
  // start_timeout_ms). Then as Find.
  absl::StatusOr<Stubs> Wake(uint64_t shard_id);
  void MoveRunRecords();
  void Supervise(uint64_t shard_id, Child& child, int64_t now_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stubs of the shard's serving process: NOT_FOUND for a shard without one on this host,
  // UNAVAILABLE (with its last exit) while its process starts.
  absl::StatusOr<Stubs> Find(uint64_t shard_id) const;
  template <typename Request, typename Response, typename Method>
  grpc::Status ForwardRound(const grpc::ServerContext& context, const Request& request,
                            Response* response, Method method, bool wake);

  state::Db* const db_;
  const ShardProcessOptions options_;
  mutable absl::Mutex mu_;
  std::string chain_id_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Child> children_ ABSL_GUARDED_BY(mu_);
  std::thread supervisor_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_SHARD_PROCESSES_H_
