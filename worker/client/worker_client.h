// What a shard process uses to drive its worker (docs/worker.md "Worker protocol"): WorkerClient,
// typed calls of the Worker service over a local Unix socket, each with a deadline; and
// WorkerProcess, which starts a `ts_worker` binary (fork/exec), waits until it serves, and stops
// it (SIGTERM, then SIGKILL after a grace period, then reaps it). A worker that crashes is seen
// by its caller only as UNAVAILABLE naming the worker: nothing of it runs in the caller's
// process. No libtorch: every compiler builds this library.
//
// Thread-safety: a WorkerClient is thread-safe (the worker itself runs one model call at a time
// and queues the others). A WorkerProcess has one owner.
#ifndef TS_WORKER_CLIENT_WORKER_CLIENT_H_
#define TS_WORKER_CLIENT_WORKER_CLIENT_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/worker.grpc.pb.h"

namespace ts::worker {

namespace pb = ::gonka::trainshard::v1;

// The largest message either side accepts. Tensors travel as files, so messages stay small: the
// largest are loss curves and samples.
inline constexpr int kWorkerMessageBytesMax = 4 << 20;

// Serves `service` (a Worker service, or one standing in for it) on the Unix socket
// `socket_path`, replacing a socket a killed worker left there, with the worker protocol's
// message caps; null when the socket cannot be bound. The caller owns both.
std::unique_ptr<grpc::Server> ServeWorker(const std::string& socket_path, grpc::Service* service);

struct WorkerClientOptions {
  int64_t call_timeout_ms = 30'000;    // Status, LoadCheckpoint, InitModel, Sample
  int64_t train_timeout_ms = 600'000;  // InnerSteps, OuterStep, Evaluate
};

class WorkerClient {
 public:
  // `socket_path` is the worker's socket (without "unix:"). Connects lazily.
  WorkerClient(std::string socket_path, WorkerClientOptions options = {});

  // Each call returns the worker's answer or its error with the message prefixed by the worker
  // and the call ("worker unix:/run/w.sock: Worker/InnerSteps: ..."). UNAVAILABLE: the worker
  // is not serving (not started, crashed, killed); DEADLINE_EXCEEDED: no answer within the
  // timeout (timeout_ms, or the options' default when 0). Other codes are the worker's:
  // INVALID_ARGUMENT (a request field, named), NOT_FOUND (a work dir file), FAILED_PRECONDITION
  // (no checkpoint loaded or a base root that is not the current one), INTERNAL.
  absl::StatusOr<pb::InitModelResponse> InitModel(const pb::InitModelRequest& request,
                                                  int64_t timeout_ms = 0);
  absl::StatusOr<pb::LoadCheckpointResponse> LoadCheckpoint(
      const pb::LoadCheckpointRequest& request, int64_t timeout_ms = 0);
  absl::StatusOr<pb::InnerStepsResponse> InnerSteps(const pb::InnerStepsRequest& request,
                                                    int64_t timeout_ms = 0);
  absl::StatusOr<pb::OuterStepResponse> OuterStep(const pb::OuterStepRequest& request,
                                                  int64_t timeout_ms = 0);
  absl::StatusOr<pb::EvaluateResponse> Evaluate(const pb::EvaluateRequest& request,
                                                int64_t timeout_ms = 0);
  absl::StatusOr<pb::SampleResponse> Sample(const pb::SampleRequest& request,
                                            int64_t timeout_ms = 0);
  absl::StatusOr<pb::PrepareDataResponse> PrepareData(const pb::PrepareDataRequest& request,
                                                      int64_t timeout_ms = 0);
  // With wait_for_ready, a worker that is starting is waited for (up to the timeout) instead
  // of answering UNAVAILABLE at once.
  absl::StatusOr<pb::WorkerStatusResponse> Status(int64_t timeout_ms = 0,
                                                  bool wait_for_ready = false);

  // "unix:<socket_path>".
  const std::string& target() const { return target_; }

 private:
  std::string target_;
  WorkerClientOptions options_;
  std::unique_ptr<pb::Worker::Stub> stub_;
};

struct WorkerProcessOptions {
  std::string binary = {};       // the ts_worker executable
  std::string socket_path = {};  // at most 107 bytes (sockaddr_un)
  std::string work_dir = {};
  int threads = 2;
  std::vector<std::string> extra_args = {};  // more flags, e.g. --file-bytes-max
  std::string log_file = {};                 // the worker's stdout and stderr; empty: inherited
  int64_t start_timeout_ms = 30'000;
  int64_t stop_grace_ms = 5'000;  // SIGTERM to SIGKILL
  WorkerClientOptions client = {};
};

class WorkerProcess {
 public:
  // Forks and execs the worker (which gets SIGTERM if the caller dies) and waits until it
  // answers Status. The SIGTERM is tied to the calling thread (PR_SET_PDEATHSIG), so call this
  // from a thread that outlives the worker. INVALID_ARGUMENT for bad options; UNAVAILABLE naming
  // the exit status when the worker exits before serving (a bad flag, say), DEADLINE_EXCEEDED when
  // it does not serve within start_timeout_ms (it is then killed); INTERNAL when fork fails.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Start(WorkerProcessOptions options);
  ~WorkerProcess();  // Stop() if still running.
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // SIGTERM, wait up to stop_grace_ms, then SIGKILL; reaps. OK after a clean exit (status 0);
  // ABORTED describing the exit otherwise (a non-zero code, a signal, or the SIGKILL it took).
  // Idempotent: later calls return the first result.
  absl::Status Stop();
  // SIGKILL and reap, as a crash would look.
  void Kill();
  // True while the process has not been reaped and has not exited.
  bool Running();

  pid_t pid() const { return pid_; }
  WorkerClient& client() { return *client_; }

 private:
  WorkerProcess(WorkerProcessOptions options, pid_t pid);
  // Waits up to timeout_ms for the child to exit; true and the description when it did.
  bool Reap(int64_t timeout_ms, std::string* how);

  WorkerProcessOptions options_;
  pid_t pid_;
  bool reaped_ = false;
  absl::Status stop_status_;
  std::unique_ptr<WorkerClient> client_;
};

}  // namespace ts::worker

#endif  // TS_WORKER_CLIENT_WORKER_CLIENT_H_
