// The Worker gRPC service (proto/gonka/trainshard/v1/worker.proto, docs/worker.md "Worker
// protocol"): the worker process's side. It holds the current checkpoint (parameters and outer
// momentum) and one Trainer (whose AdamW state persists across rounds), reads its inputs from
// and writes its outputs to the work directory, and checks every request field before any
// libtorch code runs. Errors are absl::Status inside, converted to grpc::Status at the edge;
// exceptions (c10::Error, std::bad_alloc) are caught at the edge and answered INTERNAL.
//
// Thread-safety: thread-safe. Model calls run one at a time (torch::set_num_threads is
// process-wide and the state is shared); Status answers while a model call runs.
#ifndef TS_WORKER_WORKER_SERVICE_H_
#define TS_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gonka/trainshard/v1/worker.grpc.pb.h"
#include "worker/checkpoint.h"
#include "worker/trainer.h"

namespace ts::worker {

namespace pb = ::gonka::trainshard::v1;

inline constexpr char kWorkerVersion[] = "ts_worker 0.1.0";
inline constexpr uint32_t kStepsMax = 100'000;
inline constexpr uint32_t kBatchSizeMax = 4096;
inline constexpr uint32_t kShardFilesMax = 4096;
inline constexpr uint32_t kSampleTokensMax = 4096;
inline constexpr uint32_t kPromptTokensMax = 65536;
inline constexpr size_t kDataSeedBytesMax = 64;
inline constexpr size_t kHostBytesMax = 128;
inline constexpr uint64_t kTokenizerBytesMax = uint64_t{64} << 20;

struct WorkerServiceOptions {
  std::string work_dir;  // every file name in a request is relative to it
  int num_threads = 2;   // torch::set_num_threads for every model call
  // Cap on any one file the worker reads (checkpoint, data shard, Δ); a model whose checkpoint
  // with momentum would exceed it is refused at InitModel.
  uint64_t file_bytes_max = kCheckpointBytesMax;
};

class WorkerService final : public pb::Worker::Service {
 public:
  explicit WorkerService(WorkerServiceOptions options);
  ~WorkerService() override;

  grpc::Status InitModel(grpc::ServerContext* context, const pb::InitModelRequest* request,
                         pb::InitModelResponse* response) override;
  grpc::Status LoadCheckpoint(grpc::ServerContext* context,
                              const pb::LoadCheckpointRequest* request,
                              pb::LoadCheckpointResponse* response) override;
  grpc::Status InnerSteps(grpc::ServerContext* context, const pb::InnerStepsRequest* request,
                          pb::InnerStepsResponse* response) override;
  grpc::Status OuterStep(grpc::ServerContext* context, const pb::OuterStepRequest* request,
                         pb::OuterStepResponse* response) override;
  grpc::Status Evaluate(grpc::ServerContext* context, const pb::EvaluateRequest* request,
                        pb::EvaluateResponse* response) override;
  grpc::Status Sample(grpc::ServerContext* context, const pb::SampleRequest* request,
                      pb::SampleResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context, const pb::WorkerStatusRequest* request,
                      pb::WorkerStatusResponse* response) override;
  grpc::Status PrepareData(grpc::ServerContext* context, const pb::PrepareDataRequest* request,
                           pb::PrepareDataResponse* response) override;

  // True while a model call runs.
  bool busy() const { return busy_.load(); }

 private:
  template <typename Fn>
  grpc::Status Serve(const char* call, Fn&& fn);

  absl::Status DoInitModel(const pb::InitModelRequest& request, pb::InitModelResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DoLoadCheckpoint(const pb::LoadCheckpointRequest& request,
                                pb::LoadCheckpointResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DoInnerSteps(const pb::InnerStepsRequest& request, pb::InnerStepsResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DoOuterStep(const pb::OuterStepRequest& request, pb::OuterStepResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DoEvaluate(const pb::EvaluateRequest& request, pb::EvaluateResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DoPrepareData(const pb::PrepareDataRequest& request,
                             pb::PrepareDataResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DoSample(const pb::SampleRequest& request, pb::SampleResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // FAILED_PRECONDITION without a current checkpoint, or when base_root is not its root.
  absl::Status CheckBase(std::string_view base_root) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Δ file of the current model's size, every value finite.
  absl::StatusOr<std::vector<float>> ReadDeltaFile(const char* field, const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads and decodes a checkpoint file of the work dir; sets *root to its root.
  absl::StatusOr<Checkpoint> ReadCheckpoint(std::string_view field, std::string_view name,
                                            std::string* root);
  // The trainer for `config` with `adamw`: kept when both match, else made anew (fresh AdamW).
  absl::StatusOr<Trainer*> TrainerFor(const ModelConfig& config, const AdamWOptions& adamw)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetCurrent(Checkpoint checkpoint, std::string root) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerServiceOptions options_;
  absl::Mutex mu_;  // one model call at a time
  std::optional<Checkpoint> current_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Trainer> trainer_ ABSL_GUARDED_BY(mu_);
  AdamWOptions trainer_adamw_ ABSL_GUARDED_BY(mu_);

  // What Status reports, readable while a model call holds mu_.
  absl::Mutex status_mu_;
  std::string root_ ABSL_GUARDED_BY(status_mu_);
  std::optional<ModelConfig> config_ ABSL_GUARDED_BY(status_mu_);
  std::atomic<uint64_t> calls_{0};
  std::atomic<bool> busy_{false};
};

}  // namespace ts::worker

#endif  // TS_WORKER_WORKER_SERVICE_H_
