#include "sidecar/shard/run_worker.h"

#include <utility>

#include "common/status.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

class ProcessRunWorker final : public RunWorker {
 public:
  explicit ProcessRunWorker(std::unique_ptr<worker::WorkerProcess> process)
      : process_(std::move(process)) {}

  absl::StatusOr<pb::PrepareDataResponse> PrepareData(
      const pb::PrepareDataRequest& request) override {
    return process_->client().PrepareData(request);
  }
  absl::StatusOr<pb::InitModelResponse> InitModel(const pb::InitModelRequest& request) override {
    return process_->client().InitModel(request);
  }
  absl::StatusOr<pb::LoadCheckpointResponse> LoadCheckpoint(
      const pb::LoadCheckpointRequest& request) override {
    return process_->client().LoadCheckpoint(request);
  }
  absl::StatusOr<pb::InnerStepsResponse> InnerSteps(const pb::InnerStepsRequest& request,
                                                    int64_t timeout_ms) override {
    return process_->client().InnerSteps(request, timeout_ms);
  }
  absl::StatusOr<pb::OuterStepResponse> OuterStep(const pb::OuterStepRequest& request) override {
    return process_->client().OuterStep(request);
  }
  absl::StatusOr<pb::EvaluateResponse> Evaluate(const pb::EvaluateRequest& request) override {
    return process_->client().Evaluate(request);
  }
  absl::StatusOr<pb::WorkerStatusResponse> Status() override { return process_->client().Status(); }
  bool Running() override { return process_->Running(); }
  absl::Status Stop() override { return process_->Stop(); }
  pid_t pid() const override { return process_->pid(); }

 private:
  std::unique_ptr<worker::WorkerProcess> process_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<RunWorker>> StartWorkerProcess(
    const worker::WorkerProcessOptions& options) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<worker::WorkerProcess> process,
                      worker::WorkerProcess::Start(options));
  return std::make_shared<ProcessRunWorker>(std::move(process));
}

}  // namespace ts::sidecar
