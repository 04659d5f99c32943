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
#include "chain-bridge/client/grpc_status.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"
#include "common/log.h"
#include "common/status.h"
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

// Bytes of a checkpoint of `params` parameters with its momentum, without the tensor table.
uint64_t CheckpointValueBytes(uint64_t params) { return 8 * params; }

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
  return ts::bridge::ToGrpcStatus(status);
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

void WorkerService::SetCurrent(Checkpoint checkpoint, std::string root) {
  {
    absl::MutexLock lock(&status_mu_);
    root_ = root;
    config_ = checkpoint.config;
  }
  current_ = std::move(checkpoint);
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

absl::StatusOr<Checkpoint> WorkerService::ReadCheckpoint(std::string_view field,
                                                         std::string_view name, std::string* root) {
  TS_ASSIGN_OR_RETURN(std::string bytes,
                      ReadWorkFile(options_.work_dir, field, name, options_.file_bytes_max));
  auto checkpoint = DecodeCheckpoint(bytes, options_.file_bytes_max);
  if (!checkpoint.ok()) {
    return Prefixed(absl::StrCat(common::AsAbsl(field), ": ", Quoted(name), ": "),
                    checkpoint.status());
  }
  *root = CheckpointRoot(bytes);
  return checkpoint;
}

absl::StatusOr<Trainer*> WorkerService::TrainerFor(const ModelConfig& config,
                                                   const AdamWOptions& adamw) {
  if (trainer_ == nullptr || !(trainer_->config() == config) || !SameAdamW(trainer_adamw_, adamw)) {
    trainer_.reset();
    TS_ASSIGN_OR_RETURN(trainer_,
                        Trainer::Create(config, adamw, {.num_threads = options_.num_threads}));
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
  const uint64_t params = ParameterCount(config);
  if (CheckpointValueBytes(params) > options_.file_bytes_max) {
    return Invalid("spec.config", ModelConfigString(config),
                   absl::StrCat("has ", params, " parameters: its checkpoint would exceed the ",
                                "worker's file cap of ", options_.file_bytes_max, " bytes"));
  }
  TS_RETURN_IF_ERROR(ValidateWorkFileName("checkpoint_file", request.checkpoint_file()));

  Checkpoint checkpoint;
  checkpoint.config = config;
  checkpoint.params = InitParams(config, spec.seed());
  const std::string bytes = EncodeCheckpoint(checkpoint);
  const std::string root = CheckpointRoot(bytes);
  TS_RETURN_IF_ERROR(
      WriteWorkFile(options_.work_dir, "checkpoint_file", request.checkpoint_file(), bytes));
  SetCurrent(std::move(checkpoint), root);
  response->set_root(root);
  response->set_parameters(params);
  response->set_checkpoint_bytes(bytes.size());
  return absl::OkStatus();
}

absl::Status WorkerService::DoLoadCheckpoint(const pb::LoadCheckpointRequest& request,
                                             pb::LoadCheckpointResponse* response) {
  if (!request.expected_root().empty()) {
    TS_RETURN_IF_ERROR(CheckRoot("expected_root", request.expected_root()));
  }
  TS_ASSIGN_OR_RETURN(std::string bytes,
                      ReadWorkFile(options_.work_dir, "checkpoint_file", request.checkpoint_file(),
                                   options_.file_bytes_max));
  const std::string root = CheckpointRoot(bytes);
  if (!request.expected_root().empty() && root != request.expected_root()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint_file: ", Quoted(request.checkpoint_file()), " has root ",
                     absl::BytesToHexString(root), ", not the expected ",
                     absl::BytesToHexString(request.expected_root())));
  }
  auto checkpoint = DecodeCheckpoint(bytes, options_.file_bytes_max);
  if (!checkpoint.ok()) {
    return Prefixed(absl::StrCat("checkpoint_file: ", Quoted(request.checkpoint_file()), ": "),
                    checkpoint.status());
  }
  response->set_root(root);
  ModelConfigToProto(checkpoint->config, response->mutable_config());
  response->set_kind(std::string(ModelFamilyName(checkpoint->config.family)));
  response->set_parameters(checkpoint->params.size());
  response->set_has_momentum(checkpoint->momentum.has_value());
  SetCurrent(*std::move(checkpoint), root);
  return absl::OkStatus();
}

absl::Status WorkerService::DoInnerSteps(const pb::InnerStepsRequest& request,
                                         pb::InnerStepsResponse* response) {
  TS_RETURN_IF_ERROR(CheckBase(request.base_root()));
  const ModelConfig& config = current_->config;
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
  TS_ASSIGN_OR_RETURN(AdamWOptions adamw, AdamWFromProto(request));
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
  TS_RETURN_IF_ERROR(ValidateWorkFileName("delta_file", request.delta_file()));
  std::vector<float> rebased;
  if (!request.rebase_delta_file().empty()) {
    TS_ASSIGN_OR_RETURN(rebased, ReadDeltaFile("rebase_delta_file", request.rebase_delta_file()));
    const std::vector<float>& global = current_->params;
    for (size_t i = 0; i < rebased.size(); ++i) rebased[i] = global[i] - rebased[i];
  }

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
  TS_ASSIGN_OR_RETURN(std::vector<TokenBatch> batches, GatherBatches(assignment, shards));
  shards.clear();

  TS_ASSIGN_OR_RETURN(Trainer * trainer, TrainerFor(config, adamw));
  if (request.reset_optimizer()) trainer->ResetOptimizer();
  const auto start = std::chrono::steady_clock::now();
  TS_ASSIGN_OR_RETURN(
      InnerResult result,
      trainer->InnerSteps(rebased.empty() ? current_->params : rebased, batches, inner));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string delta;
  delta.reserve(result.pseudo_gradient.size() * sizeof(float));
  internal::PutFloats(&delta, result.pseudo_gradient);
  const std::string sha = common::Sha256(delta);
  TS_RETURN_IF_ERROR(WriteWorkFile(options_.work_dir, "delta_file", request.delta_file(), delta));
  response->set_delta_sha256(sha);
  response->set_delta_bytes(delta.size());
  for (float loss : result.losses) response->add_losses(loss);
  response->set_seconds(seconds);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> WorkerService::ReadDeltaFile(const char* field,
                                                                const std::string& name) {
  TS_RETURN_IF_ERROR(ValidateWorkFileName(field, name));
  const uint64_t n = current_->params.size();
  TS_ASSIGN_OR_RETURN(std::string bytes, ReadWorkFile(options_.work_dir, field, name, 4 * n));
  if (bytes.size() != 4 * n) {
    return Invalid(field, Quoted(name),
                   absl::StrCat("holds ", bytes.size(), " bytes, not 4 x ", n, " parameters"));
  }
  std::vector<float> delta(n);
  internal::GetFloats(bytes.data(), delta);
  for (float v : delta) {
    if (!std::isfinite(v)) return Invalid(field, Quoted(name), "holds a value that is not finite");
  }
  return delta;
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
  TS_ASSIGN_OR_RETURN(std::vector<float> delta, ReadDeltaFile("delta_file", request.delta_file()));

  Checkpoint next;
  next.config = current_->config;
  next.params = current_->params;
  std::vector<float> momentum =
      current_->momentum ? *current_->momentum : std::vector<float>(delta.size(), 0.0f);
  TS_RETURN_IF_ERROR(Prefixed(
      "delta_file: ",
      ts::worker::OuterStep(next.params, momentum, delta,
                            {.lr = o.lr(), .momentum = o.momentum(), .nesterov = o.nesterov()})));
  next.momentum = std::move(momentum);
  const std::string encoded = EncodeCheckpoint(next);
  const std::string root = CheckpointRoot(encoded);
  TS_RETURN_IF_ERROR(
      WriteWorkFile(options_.work_dir, "checkpoint_file", request.checkpoint_file(), encoded));
  SetCurrent(std::move(next), root);
  response->set_root(root);
  response->set_checkpoint_bytes(encoded.size());
  return absl::OkStatus();
}

absl::Status WorkerService::DoEvaluate(const pb::EvaluateRequest& request,
                                       pb::EvaluateResponse* response) {
  TS_RETURN_IF_ERROR(ValidateWorkFileName("eval_file", request.eval_file()));
  if (request.batch_size() < 1 || request.batch_size() > kBatchSizeMax) {
    return Invalid("batch_size", request.batch_size(),
                   absl::StrCat("is outside 1..", kBatchSizeMax));
  }
  std::optional<Checkpoint> loaded;
  std::string root;
  if (!request.checkpoint_file().empty()) {
    TS_ASSIGN_OR_RETURN(loaded,
                        ReadCheckpoint("checkpoint_file", request.checkpoint_file(), &root));
  } else if (!current_) {
    return absl::FailedPreconditionError(
        "no checkpoint is loaded and checkpoint_file is empty: call InitModel or LoadCheckpoint "
        "first");
  } else {
    absl::MutexLock lock(&status_mu_);
    root = root_;
  }
  const Checkpoint& checkpoint = loaded ? *loaded : *current_;
  TS_ASSIGN_OR_RETURN(
      std::string bytes,
      ReadWorkFile(options_.work_dir, "eval_file", request.eval_file(), options_.file_bytes_max));
  auto eval = DecodeDataShard(bytes);
  if (!eval.ok()) {
    return Prefixed(absl::StrCat("eval_file: ", Quoted(request.eval_file()), ": "), eval.status());
  }
  if (eval->vocab != checkpoint.config.vocab) {
    return Invalid(
        "eval_file", Quoted(request.eval_file()),
        absl::StrCat("has vocab ", eval->vocab, ", the model's is ", checkpoint.config.vocab));
  }
  if (eval->tokens.size() < 2) {
    return Invalid("eval_file", Quoted(request.eval_file()),
                   absl::StrCat("holds ", eval->tokens.size(), " tokens, fewer than 2"));
  }
  // Keeps the training trainer (and its AdamW state) when the config matches.
  Trainer* trainer = nullptr;
  std::unique_ptr<Trainer> other;
  if (trainer_ != nullptr && trainer_->config() == checkpoint.config) {
    trainer = trainer_.get();
  } else {
    TS_ASSIGN_OR_RETURN(other, Trainer::Create(checkpoint.config, AdamWOptions{},
                                               {.num_threads = options_.num_threads}));
    trainer = other.get();
  }
  TS_ASSIGN_OR_RETURN(double loss, trainer->Evaluate(checkpoint.params, *eval,
                                                     {.batch_size = request.batch_size(),
                                                      .windows_max = request.windows_max()}));
  // The predicted tokens of the windows Trainer::Evaluate uses (trainer.h).
  const uint64_t n = eval->tokens.size(), step = checkpoint.config.context;
  uint64_t tokens = 0, windows = 0;
  for (uint64_t s = 0; s + 1 < n; s += step) {
    if (request.windows_max() != 0 && windows >= request.windows_max()) break;
    tokens += std::min<uint64_t>(step, n - 1 - s);
    ++windows;
  }
  response->set_mean_loss(loss);
  response->set_tokens(tokens);
  response->set_root(root);
  response->set_eval_id(DataShardId(bytes));
  return absl::OkStatus();
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
  const SampleOptions options{.temperature = request.temperature(), .top_k = request.top_k()};
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
  Trainer* trainer = nullptr;
  std::unique_ptr<Trainer> other;
  if (trainer_ != nullptr && trainer_->config() == config) {
    trainer = trainer_.get();
  } else {
    TS_ASSIGN_OR_RETURN(
        other, Trainer::Create(config, AdamWOptions{}, {.num_threads = options_.num_threads}));
    trainer = other.get();
  }
  TS_ASSIGN_OR_RETURN(
      std::vector<uint32_t> more,
      trainer->Sample(current_->params, prompt, request.count(), request.seed(), options));
  prompt.insert(prompt.end(), more.begin(), more.end());
  for (uint32_t t : prompt) response->add_tokens(t);
  if (tokenizer != nullptr) {
    TS_ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(prompt));
    response->set_text(std::move(text));
  }
  return absl::OkStatus();
}

}  // namespace ts::worker
