// RunWorker: the model calls a run makes (docs/training.md "The run's pieces") — prepare the
// data, make, load, step and evaluate checkpoints — and the life of what answers them. The real
// one is the ts_worker process over its Unix socket (WorkerProcess and WorkerClient: libtorch,
// crash-isolated); a test or a simulation gives a RunWorkerStarter that makes its own. Files
// named in requests are relative to the run's work directory, which the worker shares.
//
// Thread-safety: the model calls are thread-safe (an evaluation on a gRPC thread may overlap
// the run thread's calls); Stop and Kill are the run thread's.
#ifndef TS_SIDECAR_SHARD_RUN_WORKER_H_
#define TS_SIDECAR_SHARD_RUN_WORKER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/worker.pb.h"
#include "worker/client/worker_client.h"

namespace ts::sidecar {

class RunWorker {
 public:
  virtual ~RunWorker() = default;
  // As WorkerClient's calls (worker_client.h): errors name the worker and the call;
  // UNAVAILABLE when it is not serving. timeout_ms 0: the default.
  virtual absl::StatusOr<::gonka::trainshard::v1::PrepareDataResponse> PrepareData(
      const ::gonka::trainshard::v1::PrepareDataRequest& request) = 0;
  virtual absl::StatusOr<::gonka::trainshard::v1::InitModelResponse> InitModel(
      const ::gonka::trainshard::v1::InitModelRequest& request) = 0;
  virtual absl::StatusOr<::gonka::trainshard::v1::LoadCheckpointResponse> LoadCheckpoint(
      const ::gonka::trainshard::v1::LoadCheckpointRequest& request) = 0;
  virtual absl::StatusOr<::gonka::trainshard::v1::InnerStepsResponse> InnerSteps(
      const ::gonka::trainshard::v1::InnerStepsRequest& request, int64_t timeout_ms) = 0;
  virtual absl::StatusOr<::gonka::trainshard::v1::OuterStepResponse> OuterStep(
      const ::gonka::trainshard::v1::OuterStepRequest& request) = 0;
  virtual absl::StatusOr<::gonka::trainshard::v1::EvaluateResponse> Evaluate(
      const ::gonka::trainshard::v1::EvaluateRequest& request) = 0;
  virtual absl::StatusOr<::gonka::trainshard::v1::WorkerStatusResponse> Status() = 0;

  // Whether it still serves (a process not exited).
  virtual bool Running() = 0;
  // Ends it; OK after a clean end, ABORTED describing a crash. Idempotent.
  virtual absl::Status Stop() = 0;
  // The process to signal when the run stops (0: none).
  virtual pid_t pid() const = 0;
};

// Starts a worker with these options (the binary, socket, work dir, threads and flags).
using RunWorkerStarter = std::function<absl::StatusOr<std::shared_ptr<RunWorker>>(
    const worker::WorkerProcessOptions& options)>;

// The ts_worker process: WorkerProcess::Start, its client's calls.
absl::StatusOr<std::shared_ptr<RunWorker>> StartWorkerProcess(
    const worker::WorkerProcessOptions& options);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_RUN_WORKER_H_
