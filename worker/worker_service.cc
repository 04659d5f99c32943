#include "worker/worker_service.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"
#include "common/log.h"
#include "common/process.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "worker/bytes.h"
#include "worker/client/model_spec.h"
#include "worker/client/work_dir.h"
#include "worker/corpus.h"
#include "worker/data_shard.h"
#include "worker/model_config.h"
#include "worker/outer_step.h"
#include "worker/tokenizer.h"

namespace ts::worker {
namespace {

constexpr char kPreparedFile[] = "prepared.pb";
constexpr uint64_t kPreparedBytesMax = 1u << 20;

// What a prepared data set depends on: this worker's code, the request and the corpus bytes.
std::string PreparedKey(const pb::PrepareDataRequest& request,
                        const std::vector<std::string>& documents) {
  common::Sha256Hasher h;
  auto field = [&](std::string_view v) {
    h.Update(absl::StrCat(v.size(), ":"));
    h.Update(v);
  };
  field(kWorkerVersion);
  field(request.corpus());
  field(absl::StrCat(request.files(), ",", request.vocab(), ",", request.shard_tokens(), ",",
                     request.eval_every()));
  for (const std::string& d : documents) field(d);
  return h.Finish();
}

// True when work_dir/name (a valid name: ReadWorkFile checks it) holds bytes `id_of` maps to
// `want`.
bool FileIs(const std::string& work_dir, const std::string& name, uint64_t bytes_max,
            std::string (*id_of)(std::string_view), std::string_view want) {
  auto bytes = ReadWorkFile(work_dir, "prepared file", name, bytes_max);
  return bytes.ok() && id_of(*bytes) == want;
}

// True, with *response filled in, when `manifest` was written for `key` and every file it names
// is still what it was; a missing, stale or damaged set is rebuilt by the caller.
bool ReusePrepared(const std::string& work_dir, const std::string& manifest, const std::string& key,
                   uint64_t bytes_max, pb::PrepareDataResponse* response) {
  auto raw = ReadWorkFile(work_dir, "prepared", manifest, kPreparedBytesMax);
  pb::PreparedData prepared;
  if (!raw.ok() || !prepared.ParseFromString(*raw) || prepared.key() != key) return false;
  const pb::PrepareDataResponse& r = prepared.response();
  if (r.shard_files_size() != r.shard_ids_size() || r.shard_files_size() == 0) return false;
  for (int i = 0; i < r.shard_files_size(); ++i) {
    if (!FileIs(work_dir, r.shard_files(i), bytes_max, DataShardId, r.shard_ids(i))) return false;
  }
  if (!FileIs(work_dir, r.eval_file(), bytes_max, DataShardId, r.eval_id()) ||
      !FileIs(work_dir, r.tokenizer_file(), bytes_max, common::Sha256,
              prepared.tokenizer_sha256())) {
    return false;
  }
  *response = r;
  response->set_reused(true);
  return true;
}

constexpr std::string_view kComponent = "ts_worker";

absl::Status Invalid(absl::string_view field, const auto& value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " ", why));
}

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

std::string Quoted(std::string_view s) {
  return absl::StrCat("\"", absl::CHexEscape(absl::string_view(s.data(), s.size())), "\"");
}

absl::Status CheckFinite(absl::string_view field, float v) {
  if (!std::isfinite(v)) return Invalid(field, v, "is not finite");
  return absl::OkStatus();
}

absl::StatusOr<AdamWOptions> AdamWFromProto(const pb::InnerStepsRequest& request) {
  if (!request.has_adamw()) return absl::InvalidArgumentError("adamw: missing");
  const pb::AdamWSpec& a = request.adamw();
  TS_RETURN_IF_ERROR(CheckFinite("adamw.lr", a.lr()));
  if (a.lr() <= 0 || a.lr() > 1) return Invalid("adamw.lr", a.lr(), "is outside (0, 1]");
  TS_RETURN_IF_ERROR(CheckFinite("adamw.beta1", a.beta1()));
  if (a.beta1() < 0 || a.beta1() >= 1) {
    return Invalid("adamw.beta1", a.beta1(), "is outside [0, 1)");
  }
  TS_RETURN_IF_ERROR(CheckFinite("adamw.beta2", a.beta2()));
  if (a.beta2() < 0 || a.beta2() >= 1) {
    return Invalid("adamw.beta2", a.beta2(), "is outside [0, 1)");
  }
  TS_RETURN_IF_ERROR(CheckFinite("adamw.eps", a.eps()));
  if (a.eps() <= 0 || a.eps() > 1) return Invalid("adamw.eps", a.eps(), "is outside (0, 1]");
  TS_RETURN_IF_ERROR(CheckFinite("adamw.weight_decay", a.weight_decay()));
  if (a.weight_decay() < 0 || a.weight_decay() > 1) {
    return Invalid("adamw.weight_decay", a.weight_decay(), "is outside [0, 1]");
  }
  TS_RETURN_IF_ERROR(CheckFinite("adamw.grad_clip_norm", a.grad_clip_norm()));
  return AdamWOptions{.lr = a.lr(),
                      .beta1 = a.beta1(),
                      .beta2 = a.beta2(),
                      .eps = a.eps(),
                      .weight_decay = a.weight_decay(),
                      .grad_clip_norm = a.grad_clip_norm()};
}

bool SameAdamW(const AdamWOptions& a, const AdamWOptions& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.grad_clip_norm == b.grad_clip_norm;
}

absl::Status CheckRoot(absl::string_view field, absl::string_view root) {
  if (root.size() != common::kSha256Size) {
    return Invalid(field, absl::StrCat(root.size(), " bytes"),
                   absl::StrCat("is not a ", common::kSha256Size, "-byte root"));
  }
  return absl::OkStatus();
}

}  // namespace

WorkerService::WorkerService(WorkerServiceOptions options) : options_(std::move(options)) {}
WorkerService::~WorkerService() = default;

template <typename Fn>
grpc::Status WorkerService::Serve(const char* call, Fn&& fn) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    busy_ = true;
    const auto start = std::chrono::steady_clock::now();
    try {
      status = fn();
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat(call, ": ", e.what()));
    } catch (...) {
      status = absl::InternalError(absl::StrCat(call, ": unknown exception"));
    }
    busy_ = false;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    common::Log(status.ok() ? common::LogLevel::kInfo : common::LogLevel::kWarn, kComponent, call,
                {{"code", absl::StatusCodeToString(status.code())},
                 {"ms", absl::StrCat(ms)},
                 {"error", std::string(status.message())}});
  }
  ++calls_;
  return ts::ToGrpcStatus(status);
}

grpc::Status WorkerService::InitModel(grpc::ServerContext*, const pb::InitModelRequest* request,
                                      pb::InitModelResponse* response) {
  return Serve("InitModel",
               [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return DoInitModel(*request, response); });
}
grpc::Status WorkerService::LoadCheckpoint(grpc::ServerContext*,
                                           const pb::LoadCheckpointRequest* request,
                                           pb::LoadCheckpointResponse* response) {
  return Serve("LoadCheckpoint", [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return DoLoadCheckpoint(*request, response);
  });
}
grpc::Status WorkerService::InnerSteps(grpc::ServerContext*, const pb::InnerStepsRequest* request,
                                       pb::InnerStepsResponse* response) {
  return Serve("InnerSteps",
               [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return DoInnerSteps(*request, response); });
}
grpc::Status WorkerService::OuterStep(grpc::ServerContext*, const pb::OuterStepRequest* request,
                                      pb::OuterStepResponse* response) {
  return Serve("OuterStep",
               [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return DoOuterStep(*request, response); });
}
grpc::Status WorkerService::Evaluate(grpc::ServerContext*, const pb::EvaluateRequest* request,
                                     pb::EvaluateResponse* response) {
  return Serve("Evaluate",
               [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return DoEvaluate(*request, response); });
}
grpc::Status WorkerService::Sample(grpc::ServerContext*, const pb::SampleRequest* request,
                                   pb::SampleResponse* response) {
  return Serve("Sample",
               [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return DoSample(*request, response); });
}

grpc::Status WorkerService::PrepareData(grpc::ServerContext*, const pb::PrepareDataRequest* request,
                                        pb::PrepareDataResponse* response) {
  return Serve("PrepareData",
               [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return DoPrepareData(*request, response); });
}

grpc::Status WorkerService::Status(grpc::ServerContext*, const pb::WorkerStatusRequest*,
                                   pb::WorkerStatusResponse* response) {
  response->set_version(kWorkerVersion);
  response->set_pid(::getpid());
  response->set_threads(static_cast<uint32_t>(options_.num_threads));
  response->set_device(std::string(DeviceName(options_.device.device)));
  response->set_device_name(options_.device.name);
  response->set_device_memory_bytes(options_.device.memory_bytes);
  response->set_calls(calls_.load());
  response->set_busy(busy_.load());
  absl::MutexLock lock(&status_mu_);
  response->set_loaded(config_.has_value());
  response->set_root(root_);
  if (config_) {
    ModelConfigToProto(*config_, response->mutable_config());
    response->set_kind(std::string(ModelFamilyName(config_->family)));
  }
  return grpc::Status::OK;
}

namespace {

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

absl::Status WorkerService::SetCurrent(const ModelConfig& config, bool has_momentum,
                                       std::string_view name, std::string root) {
  // The file stays where the sidecar named it (a hard link of the worker's own would make it
  // unpublishable: the artifact store refuses hard-linked files); its identity is kept so that a
  // file replaced or rewritten under the name is noticed.
  const std::string path = absl::StrCat(options_.work_dir, "/", common::AsAbsl(name));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return absl::InternalError(
        absl::StrCat("checkpoint_file: ", Quoted(name), ": stat: ", std::strerror(errno)));
  }
  current_ = Current{.config = config,
                     .has_momentum = has_momentum,
                     .name = std::string(name),
                     .device = static_cast<uint64_t>(st.st_dev),
                     .inode = static_cast<uint64_t>(st.st_ino),
                     .size = static_cast<uint64_t>(st.st_size),
                     .mtime_ns = MtimeNs(st)};
  absl::MutexLock lock(&status_mu_);
  root_ = std::move(root);
  config_ = config;
  return absl::OkStatus();
}

absl::Status WorkerService::CheckBase(std::string_view base_root) {
  if (!current_) {
    return absl::FailedPreconditionError(
        "no checkpoint is loaded: call InitModel or LoadCheckpoint first");
  }
  TS_RETURN_IF_ERROR(CheckRoot("base_root", common::AsAbsl(base_root)));
  absl::MutexLock lock(&status_mu_);
  if (base_root != root_) {
    return absl::FailedPreconditionError(
        absl::StrCat("base_root: ", absl::BytesToHexString(common::AsAbsl(base_root)),
                     " is not the current checkpoint ", absl::BytesToHexString(root_)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointFileReader>> WorkerService::OpenCheckpoint(
    std::string_view field, std::string_view name) {
  TS_ASSIGN_OR_RETURN(OpenedWorkFile file, OpenWorkFile(options_.work_dir, field, name));
  return CheckpointFileReader::Open(file.fd, file.size, file.description);
}

absl::StatusOr<std::unique_ptr<CheckpointFileReader>> WorkerService::OpenCurrent() {
  TS_CHECK(current_.has_value());
  TS_ASSIGN_OR_RETURN(OpenedWorkFile file,
                      OpenWorkFile(options_.work_dir, "current checkpoint", current_->name));
  struct stat st {};
  const bool same =
      ::fstat(file.fd, &st) == 0 && static_cast<uint64_t>(st.st_dev) == current_->device &&
      static_cast<uint64_t>(st.st_ino) == current_->inode &&
      static_cast<uint64_t>(st.st_size) == current_->size && MtimeNs(st) == current_->mtime_ns;
  if (!same) {
    ::close(file.fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "the current checkpoint ", Quoted(current_->name),
        " was replaced or changed since it was checked; load it again (LoadCheckpoint)"));
  }
  return CheckpointFileReader::Open(file.fd, file.size, file.description);
}

absl::StatusOr<std::unique_ptr<RawValuesReader>> WorkerService::OpenDelta(const char* field,
                                                                          const std::string& name) {
  TS_ASSIGN_OR_RETURN(OpenedWorkFile file, OpenWorkFile(options_.work_dir, field, name));
  return RawValuesReader::Open(file.fd, file.size, ParameterCount(current_->config),
                               file.description);
}

absl::Status WorkerService::CheckMemory(std::string_view field, const ModelConfig& config) const {
  uint64_t cap = options_.memory_bytes_max;
  if (cap == 0) cap = common::PhysicalMemoryBytes();
  const uint64_t need = TrainingStateBytes(config);
  if (cap != 0 && need > cap) {
    return absl::ResourceExhaustedError(
        absl::StrCat(common::AsAbsl(field), ": ", ModelConfigString(config), " needs ", need,
                     " bytes of fp32 training state (16 per parameter), more than the ", cap,
                     " bytes this worker may use"));
  }
  return absl::OkStatus();
}

absl::Status WorkerService::CheckTrainingMemory(const ModelConfig& config,
                                                const ActivationShape& shape) {
  const std::string key = absl::StrCat(ModelConfigString(config), " ", shape.rows, "x", shape.cols,
                                       " ", shape.checkpointing, shape.bf16, shape.fused_attention);
  if (key == memory_checked_) return absl::OkStatus();
  const uint64_t state = TrainingStateBytes(config);
  const uint64_t activations = ActivationBytes(config, shape);
  uint64_t available = options_.memory_bytes_max;
  std::string what = "this worker may use (--memory-bytes-max)";
  if (available == 0 && options_.device.device == Device::kCuda) {
    TS_ASSIGN_OR_RETURN(DeviceInfo now, ProbeDevice(Device::kCuda));
    // What the trainer for this model holds already is free for it.
    const bool held = trainer_ != nullptr && trainer_->config() == config;
    available = now.free_bytes + (held ? state : 0);
    what = absl::StrCat("free on cuda (", now.name, ")");
  } else if (available == 0) {
    available = common::PhysicalMemoryBytes();
    what = "of the machine's memory";
  }
  if (available != 0 && state + activations > available) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "inner steps: ", ModelConfigString(config), " needs ", state + activations,
        " bytes (training state ", state, ", activations ", activations, " for passes of ",
        shape.rows, " x ", shape.cols, " tokens), more than the ", available, " bytes ", what));
  }
  memory_checked_ = key;
  return absl::OkStatus();
}

absl::StatusOr<Trainer*> WorkerService::AnyTrainerFor(const ModelConfig& config,
                                                      std::unique_ptr<Trainer>* other,
                                                      int threads) {
  if (threads == 0) threads = options_.num_threads;
  if (trainer_ != nullptr && trainer_->config() == config && threads == options_.num_threads) {
    return trainer_.get();
  }
  TS_ASSIGN_OR_RETURN(*other,
                      Trainer::Create(config, AdamWOptions{},
                                      {.num_threads = threads, .device = options_.device.device}));
  return other->get();
}

absl::StatusOr<Trainer*> WorkerService::TrainerFor(const ModelConfig& config,
                                                   const AdamWOptions& adamw) {
  if (trainer_ == nullptr || !(trainer_->config() == config) || !SameAdamW(trainer_adamw_, adamw)) {
    trainer_.reset();
    TS_ASSIGN_OR_RETURN(trainer_, Trainer::Create(config, adamw,
                                                  {.num_threads = options_.num_threads,
                                                   .device = options_.device.device}));
    trainer_adamw_ = adamw;
  }
  return trainer_.get();
}

absl::Status WorkerService::DoInitModel(const pb::InitModelRequest& request,
                                        pb::InitModelResponse* response) {
  if (!request.has_spec()) return absl::InvalidArgumentError("spec: missing");
  const pb::ModelSpec& spec = request.spec();
  if (!spec.has_config()) return absl::InvalidArgumentError("spec.config: missing");
  TS_ASSIGN_OR_RETURN(const ModelConfig config, ModelConfigFromSpec(spec, "spec."));
  TS_RETURN_IF_ERROR(CheckMemory("spec.config", config));
  TS_RETURN_IF_ERROR(ValidateWorkFileName("checkpoint_file", request.checkpoint_file()));

  // The initial parameters are made once (plain C++), written straight to the file.
  const std::vector<float> params = InitParams(config, spec.seed());
  TS_ASSIGN_OR_RETURN(
      WorkFileCreator file,
      WorkFileCreator::Create(options_.work_dir, "checkpoint_file", request.checkpoint_file()));
  FileByteWriter out(file.TakeFd(), file.description());
  const std::string header = EncodeCheckpointHeader(config, /*has_momentum=*/false);
  TS_RETURN_IF_ERROR(out.WriteBytes(header.data(), header.size()));
  FileValueWriter values(&out, params.size());
  TS_RETURN_IF_ERROR(values.Write(params));
  TS_ASSIGN_OR_RETURN(const std::string root, out.Close());
  const uint64_t bytes = out.written();
  TS_RETURN_IF_ERROR(file.Commit());
  TS_RETURN_IF_ERROR(SetCurrent(config, false, request.checkpoint_file(), root));
  response->set_root(root);
  response->set_parameters(params.size());
  response->set_checkpoint_bytes(bytes);
  return absl::OkStatus();
}

absl::Status WorkerService::DoLoadCheckpoint(const pb::LoadCheckpointRequest& request,
                                             pb::LoadCheckpointResponse* response) {
  if (!request.expected_root().empty()) {
    TS_RETURN_IF_ERROR(CheckRoot("expected_root", request.expected_root()));
  }
  // Every value is read and checked and the root taken on the way; nothing is kept.
  TS_ASSIGN_OR_RETURN(auto reader, OpenCheckpoint("checkpoint_file", request.checkpoint_file()));
  const CheckpointHeader header = reader->header();
  TS_RETURN_IF_ERROR(CheckMemory("checkpoint_file", header.config));
  TS_ASSIGN_OR_RETURN(const std::string root, reader->Finish());
  if (!request.expected_root().empty() && root != request.expected_root()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint_file: ", Quoted(request.checkpoint_file()), " has root ",
                     absl::BytesToHexString(root), ", not the expected ",
                     absl::BytesToHexString(request.expected_root())));
  }
  response->set_root(root);
  ModelConfigToProto(header.config, response->mutable_config());
  response->set_kind(std::string(ModelFamilyName(header.config.family)));
  response->set_parameters(ParameterCount(header.config));
  response->set_has_momentum(header.has_momentum);
  return SetCurrent(header.config, header.has_momentum, request.checkpoint_file(), root);
}

namespace {

constexpr uint32_t kReplayThreadsMax = 1024;
// A score's held-out windows at most, and per forward pass.
constexpr uint32_t kScoreWindowsMax = 1024;
constexpr uint32_t kScoreBatch = 16;

// The fields of an InnerSteps request that need no state to check.
absl::Status CheckInnerStepsFields(const pb::InnerStepsRequest& request) {
  if (request.shard_files().empty()) return absl::InvalidArgumentError("shard_files: missing");
  if (static_cast<uint32_t>(request.shard_files_size()) > kShardFilesMax) {
    return Invalid("shard_files", absl::StrCat(request.shard_files_size(), " files"),
                   absl::StrCat("is more than ", kShardFilesMax));
  }
  for (int i = 0; i < request.shard_files_size(); ++i) {
    TS_RETURN_IF_ERROR(
        ValidateWorkFileName(absl::StrCat("shard_files[", i, "]"), request.shard_files(i)));
  }
  if (request.data_seed().empty() || request.data_seed().size() > kDataSeedBytesMax) {
    return Invalid("data_seed", absl::StrCat(request.data_seed().size(), " bytes"),
                   absl::StrCat("is outside 1..", kDataSeedBytesMax));
  }
  if (request.host().empty() || request.host().size() > kHostBytesMax) {
    return Invalid("host", Quoted(request.host().substr(0, kHostBytesMax)),
                   absl::StrCat("must hold 1..", kHostBytesMax, " bytes"));
  }
  if (request.steps() < 1 || request.steps() > kStepsMax) {
    return Invalid("steps", request.steps(), absl::StrCat("is outside 1..", kStepsMax));
  }
  if (request.batch_size() < 1 || request.batch_size() > kBatchSizeMax) {
    return Invalid("batch_size", request.batch_size(),
                   absl::StrCat("is outside 1..", kBatchSizeMax));
  }
  if (uint64_t{request.steps()} * request.batch_size() > kAssignmentWindowsMax) {
    return Invalid("steps x batch_size", uint64_t{request.steps()} * request.batch_size(),
                   absl::StrCat("is more than ", kAssignmentWindowsMax, " windows"));
  }
  return absl::OkStatus();
}

// Micro-batches, schedule, checkpointing and precision of an InnerSteps request.
absl::StatusOr<InnerOptions> InnerOptionsOf(const pb::InnerStepsRequest& request) {
  TS_ASSIGN_OR_RETURN(
      TrainingChoice training,
      TrainingFromSpec(request.training(), request.batch_size(),
                       std::max(request.total_steps(), request.first_step() + request.steps())));
  InnerOptions inner;
  inner.micro_batch = training.micro_batch;
  inner.first_step = request.first_step();
  inner.schedule.warmup_steps = training.warmup_steps;
  inner.schedule.total_steps = training.cosine ? request.total_steps() : 0;
  inner.schedule.min_lr_ratio = training.cosine ? training.min_lr_ratio : 1.0f;
  inner.activation_checkpointing = training.activation_checkpointing;
  inner.bf16 = training.bf16;
  if (training.cosine && request.total_steps() < training.warmup_steps) {
    return Invalid("total_steps", request.total_steps(),
                   absl::StrCat("is below training.warmup_steps ", training.warmup_steps));
  }
  return inner;
}

}  // namespace

absl::StatusOr<std::vector<TokenBatch>> WorkerService::AssignedBatches(
    const pb::InnerStepsRequest& request, const ModelConfig& config,
    pb::InnerStepsResponse* response) {
  std::vector<DataShard> shards;
  AssignmentRequest assign{.data_seed = request.data_seed(),
                           .round = request.round(),
                           .host = request.host(),
                           .shards = {},
                           .steps = request.steps(),
                           .batch_size = request.batch_size(),
                           .context = config.context};
  for (int i = 0; i < request.shard_files_size(); ++i) {
    const std::string field = absl::StrCat("shard_files[", i, "]");
    TS_ASSIGN_OR_RETURN(
        std::string bytes,
        ReadWorkFile(options_.work_dir, field, request.shard_files(i), options_.file_bytes_max));
    auto shard = DecodeDataShard(bytes);
    if (!shard.ok()) {
      return Prefixed(absl::StrCat(field, ": ", Quoted(request.shard_files(i)), ": "),
                      shard.status());
    }
    if (shard->vocab != config.vocab) {
      return Invalid(field, Quoted(request.shard_files(i)),
                     absl::StrCat("has vocab ", shard->vocab, ", the model's is ", config.vocab));
    }
    std::string id = DataShardId(bytes);
    response->add_shard_ids(id);
    assign.shards.push_back({.id = std::move(id), .tokens = shard->tokens.size()});
    shards.push_back(*std::move(shard));
  }
  TS_ASSIGN_OR_RETURN(Assignment assignment, AssignBatches(assign));
  return GatherBatches(assignment, shards);
}

absl::StatusOr<Trainer*> WorkerService::InnerStepsTrainer(const pb::InnerStepsRequest& request,
                                                          const ModelConfig& config,
                                                          const AdamWOptions& adamw,
                                                          std::unique_ptr<Trainer>* replayer) {
  if (request.replay_checkpoint_file().empty()) {
    TS_ASSIGN_OR_RETURN(Trainer * trainer, TrainerFor(config, adamw));
    if (request.reset_optimizer()) trainer->ResetOptimizer();
    return trainer;
  }
  // A replay trains on a trainer of its own, so the host's own state stays as it was.
  const int threads = request.replay_threads() > 0 ? static_cast<int>(request.replay_threads())
                                                   : options_.num_threads;
  TS_ASSIGN_OR_RETURN(
      *replayer,
      Trainer::Create(config, adamw, {.num_threads = threads, .device = options_.device.device}));
  return replayer->get();
}

absl::StatusOr<ModelConfig> WorkerService::InnerStepsConfig(const pb::InnerStepsRequest& request) {
  if (request.replay_checkpoint_file().empty()) {
    TS_RETURN_IF_ERROR(CheckBase(request.base_root()));
    return current_->config;
  }
  TS_RETURN_IF_ERROR(CheckRoot("base_root", request.base_root()));
  if (!request.rebase_delta_file().empty()) {
    return Invalid("rebase_delta_file", Quoted(request.rebase_delta_file()),
                   "cannot be combined with replay_checkpoint_file");
  }
  if (request.replay_threads() > kReplayThreadsMax) {
    return Invalid("replay_threads", request.replay_threads(),
                   absl::StrCat("is more than ", kReplayThreadsMax));
  }
  TS_ASSIGN_OR_RETURN(auto reader,
                      OpenCheckpoint("replay_checkpoint_file", request.replay_checkpoint_file()));
  TS_RETURN_IF_ERROR(CheckMemory("replay_checkpoint_file", reader->header().config));
  return reader->header().config;
}

absl::StatusOr<WorkerService::InnerStepsBase> WorkerService::OpenInnerStepsBase(
    const pb::InnerStepsRequest& request) {
  InnerStepsBase base;
  if (!request.replay_checkpoint_file().empty()) {
    TS_ASSIGN_OR_RETURN(base.global,
                        OpenCheckpoint("replay_checkpoint_file", request.replay_checkpoint_file()));
  } else {
    TS_ASSIGN_OR_RETURN(base.global, OpenCurrent());
  }
  base.reader = base.global.get();
  if (!request.rebase_delta_file().empty()) {
    TS_ASSIGN_OR_RETURN(base.own, OpenDelta("rebase_delta_file", request.rebase_delta_file()));
    base.difference = std::make_unique<DifferenceReader>(base.global.get(), base.own.get());
    base.reader = base.difference.get();
  }
  return base;
}

absl::Status WorkerService::CheckReplayRoot(const pb::InnerStepsRequest& request,
                                            InnerStepsBase& base) {
  if (request.replay_checkpoint_file().empty()) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const std::string root, base.global->Finish());
  if (root != request.base_root()) {
    return Invalid("replay_checkpoint_file", Quoted(request.replay_checkpoint_file()),
                   absl::StrCat("has root ", absl::BytesToHexString(root), ", not base_root ",
                                absl::BytesToHexString(request.base_root())));
  }
  return absl::OkStatus();
}

absl::Status WorkerService::DoInnerSteps(const pb::InnerStepsRequest& request,
                                         pb::InnerStepsResponse* response) {
  TS_ASSIGN_OR_RETURN(const ModelConfig config, InnerStepsConfig(request));
  TS_RETURN_IF_ERROR(CheckInnerStepsFields(request));
  TS_ASSIGN_OR_RETURN(AdamWOptions adamw, AdamWFromProto(request));
  TS_ASSIGN_OR_RETURN(const InnerOptions inner, InnerOptionsOf(request));
  TS_RETURN_IF_ERROR(ValidateWorkFileName("delta_file", request.delta_file()));
  if (!request.rebase_delta_file().empty()) {
    // Checked before the data and the steps: the same file is read again for the Δ.
    TS_RETURN_IF_ERROR(OpenDelta("rebase_delta_file", request.rebase_delta_file()).status());
  }
  TS_ASSIGN_OR_RETURN(std::vector<TokenBatch> batches, AssignedBatches(request, config, response));
  std::optional<DataShard> score_set;
  if (!request.score_file().empty()) {
    if (request.score_windows() < 1 || request.score_windows() > kScoreWindowsMax) {
      return Invalid("score_windows", request.score_windows(),
                     absl::StrCat("is outside 1..", kScoreWindowsMax));
    }
    TS_ASSIGN_OR_RETURN(score_set, ReadHeldOut("score_file", request.score_file(), config.vocab));
  }
  const EvalOptions score_options{.batch_size = kScoreBatch,
                                  .windows_max = request.score_windows(),
                                  .first_window = request.score_first_window()};

  const uint32_t rows = inner.micro_batch == 0 ? request.batch_size()
                                               : std::min(inner.micro_batch, request.batch_size());
  TS_RETURN_IF_ERROR(
      CheckTrainingMemory(config, {.rows = rows,
                                   .cols = uint64_t{config.context} + 1,
                                   .checkpointing = inner.activation_checkpointing,
                                   .bf16 = inner.bf16 && options_.device.device == Device::kCuda,
                                   .fused_attention = FusedAttention()}));
  std::unique_ptr<Trainer> replayer;
  TS_ASSIGN_OR_RETURN(Trainer * trainer, InnerStepsTrainer(request, config, adamw, &replayer));
  {
    TS_ASSIGN_OR_RETURN(InnerStepsBase base, OpenInnerStepsBase(request));
    TS_RETURN_IF_ERROR(trainer->Load(*base.reader));
    TS_RETURN_IF_ERROR(CheckReplayRoot(request, base));
  }
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  double score_seconds = 0;
  if (score_set) {
    const auto t = std::chrono::steady_clock::now();
    TS_ASSIGN_OR_RETURN(const double loss, trainer->EvaluateLoaded(*score_set, score_options));
    response->set_score_base_loss(loss);
    score_seconds += since(t);
  }
  const auto start = std::chrono::steady_clock::now();
  TS_ASSIGN_OR_RETURN(std::vector<float> losses, trainer->Steps(batches, inner));
  const double seconds = since(start);
  if (score_set) {
    const auto t = std::chrono::steady_clock::now();
    TS_ASSIGN_OR_RETURN(const double loss, trainer->EvaluateLoaded(*score_set, score_options));
    response->set_score_loss(loss);
    TS_ASSIGN_OR_RETURN(const double assigned, trainer->BatchLossLoaded(batches.front()));
    response->set_assigned_loss(assigned);
    score_seconds += since(t);
    response->set_score_seconds(score_seconds);
  }

  // Δ = base − θ, streamed from the base file and the model's tensors to the Δ file.
  const uint64_t count = ParameterCount(config);
  TS_ASSIGN_OR_RETURN(WorkFileCreator file, WorkFileCreator::Create(options_.work_dir, "delta_file",
                                                                    request.delta_file()));
  FileByteWriter out(file.TakeFd(), file.description());
  FileValueWriter values(&out, count);
  {
    TS_ASSIGN_OR_RETURN(InnerStepsBase base, OpenInnerStepsBase(request));
    TS_RETURN_IF_ERROR(trainer->WritePseudoGradient(*base.reader, values));
    TS_RETURN_IF_ERROR(CheckReplayRoot(request, base));
  }
  TS_ASSIGN_OR_RETURN(const std::string sha, out.Close());
  TS_RETURN_IF_ERROR(file.Commit());
  response->set_delta_sha256(sha);
  response->set_delta_bytes(count * sizeof(float));
  for (float loss : losses) response->add_losses(loss);
  response->set_seconds(seconds);
  return absl::OkStatus();
}

absl::Status WorkerService::DoOuterStep(const pb::OuterStepRequest& request,
                                        pb::OuterStepResponse* response) {
  TS_RETURN_IF_ERROR(CheckBase(request.base_root()));
  if (!request.has_outer()) return absl::InvalidArgumentError("outer: missing");
  const pb::OuterSpec& o = request.outer();
  TS_RETURN_IF_ERROR(CheckFinite("outer.lr", o.lr()));
  if (o.lr() <= 0 || o.lr() > 10) return Invalid("outer.lr", o.lr(), "is outside (0, 10]");
  TS_RETURN_IF_ERROR(CheckFinite("outer.momentum", o.momentum()));
  if (o.momentum() < 0 || o.momentum() >= 1) {
    return Invalid("outer.momentum", o.momentum(), "is outside [0, 1)");
  }
  TS_RETURN_IF_ERROR(ValidateWorkFileName("checkpoint_file", request.checkpoint_file()));
  const OuterOptions outer{.lr = o.lr(), .momentum = o.momentum(), .nesterov = o.nesterov()};
  const ModelConfig config = current_->config;
  const uint64_t count = ParameterCount(config);
  // The Δ is read and checked through once before anything is written, so a bad Δ changes
  // nothing.
  {
    TS_ASSIGN_OR_RETURN(auto delta, OpenDelta("delta_file", request.delta_file()));
    std::vector<float> chunk;
    for (uint64_t left = count; left > 0; left -= chunk.size()) {
      chunk.resize(std::min(left, kValueChunk));
      TS_RETURN_IF_ERROR(Prefixed("delta_file: ", delta->Read(chunk)));
    }
  }
  TS_ASSIGN_OR_RETURN(
      WorkFileCreator file,
      WorkFileCreator::Create(options_.work_dir, "checkpoint_file", request.checkpoint_file()));
  FileByteWriter out(file.TakeFd(), file.description());
  const std::string header = EncodeCheckpointHeader(config, /*has_momentum=*/true);
  TS_RETURN_IF_ERROR(out.WriteBytes(header.data(), header.size()));
  FileValueWriter values(&out, 2 * count);
  // The new checkpoint is the new parameters, then the new momentum: two passes over the inputs,
  // the first writing θ', the second m' (the elementwise step computed again: the same bits).
  for (int pass = 0; pass < 2; ++pass) {
    TS_ASSIGN_OR_RETURN(auto params, OpenCurrent());
    std::unique_ptr<CheckpointFileReader> momentum;
    if (current_->has_momentum) {
      TS_ASSIGN_OR_RETURN(momentum, OpenCurrent());
      TS_RETURN_IF_ERROR(momentum->SeekValue(count));
    }
    TS_ASSIGN_OR_RETURN(auto delta, OpenDelta("delta_file", request.delta_file()));
    std::vector<float> theta, m, d;
    for (uint64_t left = count; left > 0; left -= theta.size()) {
      const uint64_t take = std::min(left, kValueChunk);
      theta.resize(take);
      m.assign(take, 0.0f);
      d.resize(take);
      TS_RETURN_IF_ERROR(params->Read(theta));
      if (momentum) TS_RETURN_IF_ERROR(momentum->Read(m));
      TS_RETURN_IF_ERROR(delta->Read(d));
      TS_RETURN_IF_ERROR(Prefixed("delta_file: ", ts::worker::OuterStep(theta, m, d, outer)));
      TS_RETURN_IF_ERROR(values.Write(pass == 0 ? theta : m));
    }
  }
  TS_ASSIGN_OR_RETURN(const std::string root, out.Close());
  const uint64_t bytes = out.written();
  TS_RETURN_IF_ERROR(file.Commit());
  TS_RETURN_IF_ERROR(SetCurrent(config, /*has_momentum=*/true, request.checkpoint_file(), root));
  response->set_root(root);
  response->set_checkpoint_bytes(bytes);
  return absl::OkStatus();
}

absl::Status WorkerService::DoEvaluate(const pb::EvaluateRequest& request,
                                       pb::EvaluateResponse* response) {
  TS_RETURN_IF_ERROR(ValidateWorkFileName("eval_file", request.eval_file()));
  if (request.batch_size() < 1 || request.batch_size() > kBatchSizeMax) {
    return Invalid("batch_size", request.batch_size(),
                   absl::StrCat("is outside 1..", kBatchSizeMax));
  }
  if (request.threads() > kReplayThreadsMax) {
    return Invalid("threads", request.threads(), absl::StrCat("is more than ", kReplayThreadsMax));
  }
  // The checkpoint to evaluate, streamed into a trainer of its config; its root is taken on the
  // way for a file named here, known for the current one.
  std::unique_ptr<CheckpointFileReader> reader;
  std::string root;
  if (!request.checkpoint_file().empty()) {
    TS_ASSIGN_OR_RETURN(reader, OpenCheckpoint("checkpoint_file", request.checkpoint_file()));
    TS_RETURN_IF_ERROR(CheckMemory("checkpoint_file", reader->header().config));
  } else if (!current_) {
    return absl::FailedPreconditionError(
        "no checkpoint is loaded and checkpoint_file is empty: call InitModel or LoadCheckpoint "
        "first");
  } else {
    TS_ASSIGN_OR_RETURN(reader, OpenCurrent());
    absl::MutexLock lock(&status_mu_);
    root = root_;
  }
  struct {
    ModelConfig config;
  } checkpoint{reader->header().config};
  std::string eval_id;
  TS_ASSIGN_OR_RETURN(const DataShard eval, ReadHeldOut("eval_file", request.eval_file(),
                                                        checkpoint.config.vocab, &eval_id));
  // Keeps the training trainer (and its AdamW state) when the config matches.
  std::unique_ptr<Trainer> other;
  TS_ASSIGN_OR_RETURN(Trainer * trainer, AnyTrainerFor(checkpoint.config, &other,
                                                       static_cast<int>(request.threads())));
  TS_RETURN_IF_ERROR(trainer->Load(*reader));
  if (root.empty()) {
    TS_ASSIGN_OR_RETURN(root, reader->Finish());
  }
  TS_ASSIGN_OR_RETURN(double loss,
                      trainer->EvaluateLoaded(eval, {.batch_size = request.batch_size(),
                                                     .windows_max = request.windows_max()}));
  // The predicted tokens of the windows Trainer::Evaluate uses (trainer.h).
  const uint64_t n = eval.tokens.size(), step = checkpoint.config.context;
  uint64_t tokens = 0, windows = 0;
  for (uint64_t s = 0; s + 1 < n; s += step) {
    if (request.windows_max() != 0 && windows >= request.windows_max()) break;
    tokens += std::min<uint64_t>(step, n - 1 - s);
    ++windows;
  }
  response->set_mean_loss(loss);
  response->set_tokens(tokens);
  response->set_root(root);
  response->set_eval_id(eval_id);
  return absl::OkStatus();
}

absl::StatusOr<DataShard> WorkerService::ReadHeldOut(std::string_view field,
                                                     const std::string& name, uint32_t vocab,
                                                     std::string* id) {
  TS_RETURN_IF_ERROR(ValidateWorkFileName(field, name));
  TS_ASSIGN_OR_RETURN(std::string bytes,
                      ReadWorkFile(options_.work_dir, field, name, options_.file_bytes_max));
  absl::StatusOr<DataShard> set = DecodeDataShard(bytes);
  if (!set.ok()) {
    return Prefixed(absl::StrCat(common::AsAbsl(field), ": ", Quoted(name), ": "), set.status());
  }
  if (set->vocab != vocab) {
    return Invalid(common::AsAbsl(field), Quoted(name),
                   absl::StrCat("has vocab ", set->vocab, ", the model's is ", vocab));
  }
  if (set->tokens.size() < 2) {
    return Invalid(common::AsAbsl(field), Quoted(name),
                   absl::StrCat("holds ", set->tokens.size(), " tokens, fewer than 2"));
  }
  if (id != nullptr) *id = DataShardId(bytes);
  return set;
}

absl::Status WorkerService::DoPrepareData(const pb::PrepareDataRequest& request,
                                          pb::PrepareDataResponse* response) {
  if (request.corpus() != "fortunes") {
    return Invalid("corpus", Quoted(request.corpus()), "is not a known corpus (known: fortunes)");
  }
  const auto files = DefaultFortuneFiles();
  if (request.files() < 1 || request.files() > files.size()) {
    return Invalid("files", request.files(), absl::StrCat("is outside 1..", files.size()));
  }
  if (request.vocab() < 8 || request.vocab() > 65536) {
    return Invalid("vocab", request.vocab(), "is outside 8..65536");
  }
  if (request.shard_tokens() < 16 || request.shard_tokens() > (1u << 24)) {
    return Invalid("shard_tokens", request.shard_tokens(), "is outside 16..16777216");
  }
  if (request.eval_every() < 2 || request.eval_every() > 1000) {
    return Invalid("eval_every", request.eval_every(), "is outside 2..1000");
  }
  TS_RETURN_IF_ERROR(ValidateWorkFileName("out_dir", request.out_dir()));
  const std::string dir = absl::StrCat(options_.work_dir, "/", request.out_dir());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(
        absl::StrCat("out_dir: ", Quoted(request.out_dir()), ": mkdir: ", strerror(errno)));
  }
  TS_ASSIGN_OR_RETURN(std::vector<std::string> documents,
                      ReadFortuneFiles(kFortunesDir, files.subspan(0, request.files())));
  const std::string prefix = request.out_dir() + "/";
  const std::string key = PreparedKey(request, documents);
  if (ReusePrepared(options_.work_dir, prefix + kPreparedFile, key, options_.file_bytes_max,
                    response)) {
    return absl::OkStatus();
  }
  response->Clear();
  TS_ASSIGN_OR_RETURN(std::string model,
                      TrainTokenizer(documents, {.vocab_size = request.vocab(), .seed = 1}));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(model));
  TS_ASSIGN_OR_RETURN(Dataset dataset, BuildDataset(documents, *tokenizer,
                                                    {.shard_tokens = request.shard_tokens(),
                                                     .eval_every = request.eval_every()}));
  response->set_tokenizer_file(prefix + "tokenizer.model");
  TS_RETURN_IF_ERROR(
      WriteWorkFile(options_.work_dir, "tokenizer_file", response->tokenizer_file(), model));
  uint64_t train_tokens = 0;
  for (size_t i = 0; i < dataset.train.size(); ++i) {
    std::string name = absl::StrCat(prefix, "train-", absl::Dec(i, absl::kZeroPad4), ".tsds");
    std::string bytes = EncodeDataShard(dataset.train[i]);
    TS_RETURN_IF_ERROR(WriteWorkFile(options_.work_dir, "shard_file", name, bytes));
    response->add_shard_files(name);
    response->add_shard_ids(DataShardId(bytes));
    train_tokens += dataset.train[i].tokens.size();
  }
  std::string eval_bytes = EncodeDataShard(dataset.eval);
  response->set_eval_file(prefix + "eval.tsds");
  TS_RETURN_IF_ERROR(
      WriteWorkFile(options_.work_dir, "eval_file", response->eval_file(), eval_bytes));
  response->set_eval_id(DataShardId(eval_bytes));
  response->set_train_tokens(train_tokens);
  response->set_eval_tokens(dataset.eval.tokens.size());
  response->set_documents(dataset.documents);
  // Last, after every file it names: a crash before this leaves nothing to reuse.
  pb::PreparedData prepared;
  prepared.set_key(key);
  *prepared.mutable_response() = *response;
  prepared.set_tokenizer_sha256(common::Sha256(model));
  return WriteWorkFile(options_.work_dir, "out_dir", prefix + kPreparedFile,
                       prepared.SerializeAsString());
}

absl::Status WorkerService::DoSample(const pb::SampleRequest& request,
                                     pb::SampleResponse* response) {
  if (!current_) {
    return absl::FailedPreconditionError(
        "no checkpoint is loaded: call InitModel or LoadCheckpoint first");
  }
  const ModelConfig& config = current_->config;
  if (request.count() < 1 || request.count() > kSampleTokensMax) {
    return Invalid("count", request.count(), absl::StrCat("is outside 1..", kSampleTokensMax));
  }
  TS_RETURN_IF_ERROR(CheckFinite("temperature", request.temperature()));
  if (request.temperature() <= 0 || request.temperature() > 100) {
    return Invalid("temperature", request.temperature(), "is outside (0, 100]");
  }
  if (request.top_k() > config.vocab) {
    return Invalid("top_k", request.top_k(), absl::StrCat("is more than vocab ", config.vocab));
  }
  TS_RETURN_IF_ERROR(CheckFinite("top_p", request.top_p()));
  if (request.top_p() < 0 || request.top_p() > 1) {
    return Invalid("top_p", request.top_p(), "is outside [0, 1] (0: no cut)");
  }
  const SampleOptions options{
      .temperature = request.temperature(), .top_k = request.top_k(), .top_p = request.top_p()};
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<uint32_t> prompt;
  if (!request.tokenizer_file().empty()) {
    if (!request.prompt_tokens().empty()) {
      return absl::InvalidArgumentError(
          "prompt_tokens: must be empty with tokenizer_file (use prompt_text)");
    }
    TS_ASSIGN_OR_RETURN(std::string model,
                        ReadWorkFile(options_.work_dir, "tokenizer_file", request.tokenizer_file(),
                                     kTokenizerBytesMax));
    auto loaded = Tokenizer::Load(model);
    if (!loaded.ok()) {
      return Prefixed(absl::StrCat("tokenizer_file: ", Quoted(request.tokenizer_file()), ": "),
                      loaded.status());
    }
    tokenizer = *std::move(loaded);
    if (tokenizer->vocab_size() != config.vocab) {
      return Invalid(
          "tokenizer_file", Quoted(request.tokenizer_file()),
          absl::StrCat("has vocab ", tokenizer->vocab_size(), ", the model's is ", config.vocab));
    }
    if (request.prompt_text().size() > kPromptTokensMax) {
      return Invalid("prompt_text", absl::StrCat(request.prompt_text().size(), " bytes"),
                     absl::StrCat("is more than ", kPromptTokensMax));
    }
    TS_ASSIGN_OR_RETURN(prompt, tokenizer->Encode(request.prompt_text()));
    if (prompt.empty()) prompt.push_back(tokenizer->eos_id());
  } else {
    if (!request.prompt_text().empty()) {
      return absl::InvalidArgumentError("prompt_text: needs tokenizer_file");
    }
    if (request.prompt_tokens().empty() ||
        static_cast<uint32_t>(request.prompt_tokens_size()) > kPromptTokensMax) {
      return Invalid("prompt_tokens", absl::StrCat(request.prompt_tokens_size(), " tokens"),
                     absl::StrCat("is outside 1..", kPromptTokensMax));
    }
    for (int i = 0; i < request.prompt_tokens_size(); ++i) {
      if (request.prompt_tokens(i) >= config.vocab) {
        return Invalid(absl::StrCat("prompt_tokens[", i, "]"), request.prompt_tokens(i),
                       absl::StrCat("is not below vocab ", config.vocab));
      }
    }
    prompt.assign(request.prompt_tokens().begin(), request.prompt_tokens().end());
  }
  std::unique_ptr<Trainer> other;
  TS_ASSIGN_OR_RETURN(Trainer * trainer, AnyTrainerFor(config, &other));
  {
    TS_ASSIGN_OR_RETURN(auto reader, OpenCurrent());
    TS_RETURN_IF_ERROR(trainer->Load(*reader));
  }
  TS_ASSIGN_OR_RETURN(std::vector<uint32_t> more,
                      trainer->SampleLoaded(prompt, request.count(), request.seed(), options));
  prompt.insert(prompt.end(), more.begin(), more.end());
  for (uint32_t t : prompt) response->add_tokens(t);
  if (tokenizer != nullptr) {
    TS_ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(prompt));
    response->set_text(std::move(text));
  }
  return absl::OkStatus();
}

}  // namespace ts::worker
