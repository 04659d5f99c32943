// The Worker gRPC service (proto/gonka/trainshard/v1/worker.proto, docs/worker.md "Worker
// protocol"): the worker process's side. It knows the current checkpoint (a file of its own in
// the work directory, never a copy in memory) and holds one Trainer (the model and its AdamW
// state, which persists across rounds); it streams checkpoints and Δ files between the trainer
// and the work directory a chunk at a time (value_stream.h), so the model is in memory once,
// and checks every request field before any libtorch code runs. Errors are absl::Status inside,
// converted to grpc::Status at the edge; exceptions (c10::Error, std::bad_alloc) are caught at the
// edge and answered INTERNAL.
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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gonka/trainshard/v1/worker.grpc.pb.h"
#include "worker/checkpoint.h"
#include "worker/data_shard.h"
#include "worker/trainer.h"
#include "worker/value_stream.h"

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
  // Cap on the small files the worker reads whole (data shards, the eval set, a tokenizer).
  // Checkpoints and Δ files are streamed and must be exactly the size their model implies.
  uint64_t file_bytes_max = kCheckpointBytesMax;
  // Memory the model's fp32 training state (16 bytes a parameter) may take; a model that needs
  // more is refused at InitModel and LoadCheckpoint naming both numbers. 0: the machine's
  // physical memory.
  uint64_t memory_bytes_max = 0;
  // Where the models train: kCpu or kCuda, as ProbeDevice resolved the process's --device.
  DeviceInfo device;
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

  // The current checkpoint: its config, the work dir file holding it, and that file's identity
  // when it was checked (device, inode, size, modification time), so a file replaced or changed
  // under the name since is refused instead of trained from.
  struct Current {
    ModelConfig config;
    bool has_momentum = false;
    std::string name;
    uint64_t device = 0, inode = 0, size = 0;
    int64_t mtime_ns = 0;
  };

  // A held-out set (data shard format) from the work dir file `name`, named `field` in errors:
  // decoded and checked against the model's vocab; its DataShardId into *id when given.
  absl::StatusOr<DataShard> ReadHeldOut(std::string_view field, const std::string& name,
                                        uint32_t vocab, std::string* id = nullptr);
  // The config an InnerSteps request trains: the current checkpoint's (base_root must be its
  // root), or a replay's checkpoint file's (docs/verification.md).
  absl::StatusOr<ModelConfig> InnerStepsConfig(const pb::InnerStepsRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The batches of an InnerSteps request's assignment, cut from its shard files (each checked
  // against the model's vocab); the shards' ids go into `response`.
  absl::StatusOr<std::vector<TokenBatch>> AssignedBatches(const pb::InnerStepsRequest& request,
                                                          const ModelConfig& config,
                                                          pb::InnerStepsResponse* response);
  // The trainer an InnerSteps request trains on: the worker's own (its moments reset when the
  // request says so), or for a replay a fresh one in `replayer` with the member's threads.
  absl::StatusOr<Trainer*> InnerStepsTrainer(const pb::InnerStepsRequest& request,
                                             const ModelConfig& config, const AdamWOptions& adamw,
                                             std::unique_ptr<Trainer>* replayer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The values an InnerSteps request's steps start from: the current checkpoint (a replay's
  // checkpoint file), or with a rebase Δ that minus this host's own Δ in flight. Opened once to
  // load the model and once more for Δ = base − θ after the steps.
  struct InnerStepsBase {
    std::unique_ptr<CheckpointFileReader> global;
    std::unique_ptr<RawValuesReader> own;
    std::unique_ptr<DifferenceReader> difference;
    ValueReader* reader = nullptr;
  };
  absl::StatusOr<InnerStepsBase> OpenInnerStepsBase(const pb::InnerStepsRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a pass over a replay's base file: its root is the request's base_root.
  static absl::Status CheckReplayRoot(const pb::InnerStepsRequest& request, InnerStepsBase& base);
  // FAILED_PRECONDITION without a current checkpoint, or when base_root is not its root.
  absl::Status CheckBase(std::string_view base_root) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reader of a checkpoint file of the work dir (header checked, size exact).
  absl::StatusOr<std::unique_ptr<CheckpointFileReader>> OpenCheckpoint(std::string_view field,
                                                                       std::string_view name);
  // A reader of the current checkpoint's values.
  absl::StatusOr<std::unique_ptr<CheckpointFileReader>> OpenCurrent()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reader of a Δ file of the current model's size (every value finite).
  absl::StatusOr<std::unique_ptr<RawValuesReader>> OpenDelta(const char* field,
                                                             const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `config`'s fp32 training state exceeds the memory cap.
  absl::Status CheckMemory(std::string_view field, const ModelConfig& config) const;
  // Before the first steps of a model and pass shape: its training state and activations
  // (ActivationBytes) against --memory-bytes-max, or else the device's free memory (CUDA) or
  // the machine's (CPU). RESOURCE_EXHAUSTED naming both numbers.
  absl::Status CheckTrainingMemory(const ModelConfig& config, const ActivationShape& shape)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The trainer for `config` with `adamw`: kept when both match, else made anew (fresh AdamW).
  absl::StatusOr<Trainer*> TrainerFor(const ModelConfig& config, const AdamWOptions& adamw)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The training trainer when its config is `config` (its AdamW state kept) and `threads` is 0
  // or the worker's, else a new one in `other` with `threads` (0: the worker's).
  absl::StatusOr<Trainer*> AnyTrainerFor(const ModelConfig& config, std::unique_ptr<Trainer>* other,
                                         int threads = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the work dir file `name` (a checkpoint of `config` with root `root`) current.
  absl::Status SetCurrent(const ModelConfig& config, bool has_momentum, std::string_view name,
                          std::string root) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerServiceOptions options_;
  absl::Mutex mu_;  // one model call at a time
  std::optional<Current> current_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Trainer> trainer_ ABSL_GUARDED_BY(mu_);
  AdamWOptions trainer_adamw_ ABSL_GUARDED_BY(mu_);
  std::string memory_checked_ ABSL_GUARDED_BY(mu_);  // the model and shape last checked

  // What Status reports, readable while a model call holds mu_.
  absl::Mutex status_mu_;
  std::string root_ ABSL_GUARDED_BY(status_mu_);
  std::optional<ModelConfig> config_ ABSL_GUARDED_BY(status_mu_);
  std::atomic<uint64_t> calls_{0};
  std::atomic<bool> busy_{false};
};

}  // namespace ts::worker

#endif  // TS_WORKER_WORKER_SERVICE_H_
