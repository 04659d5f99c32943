// The simulated host's worker (a tiny model in plain C++) and artifact store (sim_world.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/status.h"
#include "tests/sim/sim_world.h"

namespace ts::sim {
namespace {

constexpr size_t kParams = 8;
constexpr int64_t kInnerStepsMs = 400;
constexpr int64_t kStalledInnerStepsMs = 6000;
constexpr int64_t kModelCallMs = 10;
constexpr int64_t kStoreCallMs = 3;
constexpr float kOuterLr = 0.7F;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("sim: no file ", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

absl::Status WriteFile(const std::string& path, std::string_view bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("sim: cannot write ", path));
  return absl::OkStatus();
}

using Params = std::vector<float>;

std::string Bytes(const Params& p) {
  return std::string(reinterpret_cast<const char*>(p.data()), p.size() * sizeof(float));
}
absl::StatusOr<Params> ParamsOf(std::string_view bytes) {
  if (bytes.size() != kParams * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("sim: ", bytes.size(), " bytes, not a model"));
  }
  Params p(kParams);
  std::memcpy(p.data(), bytes.data(), bytes.size());
  return p;
}
float Target(size_t i) { return 0.1F * static_cast<float>(i + 1); }
float Loss(const Params& p) {
  float l = 0;
  for (size_t i = 0; i < p.size(); ++i) l += (p[i] - Target(i)) * (p[i] - Target(i));
  return l / static_cast<float>(p.size());
}

// The model after H steps of plain SGD towards the target from `base`.
Params SgdSteps(const Params& base, uint32_t steps) {
  Params p = base;
  for (uint32_t s = 0; s < std::min<uint32_t>(steps, 50); ++s) {
    for (size_t i = 0; i < kParams; ++i) p[i] -= 0.05F * (p[i] - Target(i));
  }
  return p;
}

// H inner steps as a pure function of the base, the round's data seed and the host: plain SGD
// towards the target, plus the host's own noise.
Params DeltaOf(const Params& base, const std::string& seed, const std::string& host,
               uint32_t steps) {
  const Params p = SgdSteps(base, steps);
  const std::string noise = common::Sha256(absl::StrCat(seed, "/", host));
  Params delta(kParams);
  for (size_t i = 0; i < kParams; ++i) {
    const float jitter = (static_cast<unsigned char>(noise[i]) - 128) / 12800.0F;
    delta[i] = base[i] - p[i] + jitter;
  }
  return delta;
}

// What the attacker commits instead of its honest Δ `honest` (round_sim.h, Attack).
Params Tampered(SimHostState& me, const Params& base, const std::string& seed,
                const std::string& host, uint32_t steps, const Params& honest) {
  const bool have_aggregate = me.aggregate.size() == kParams;
  switch (me.attack) {
    case Attack::kFreeRider:
      return Params(kParams, 0.0F);
    case Attack::kCopier:
      return have_aggregate ? me.aggregate : Params(kParams, 0.0F);
    case Attack::kLazy:
      return DeltaOf(base, seed, host, std::max<uint32_t>(1, steps / 4));
    case Attack::kNoise: {
      const std::string noise = common::Sha256(absl::StrCat("noise/", seed));
      Params out = honest;
      for (size_t i = 0; i < kParams; ++i) {
        out[i] += (static_cast<unsigned char>(noise[i]) - 128) / 256.0F;
      }
      return out;
    }
    case Attack::kScaled: {
      Params out = honest;
      for (float& v : out) v *= 100.0F;
      return out;
    }
    case Attack::kSignFlip: {
      Params out = honest;
      for (float& v : out) v = -v;
      return out;
    }
    case Attack::kAlie: {
      if (!have_aggregate) return honest;
      Params out(kParams);
      for (size_t i = 0; i < kParams; ++i) {
        const float mu = (honest[i] + me.aggregate[i]) / 2;
        out[i] = mu - 1.5F * std::fabs(honest[i] - me.aggregate[i]) / 2;
      }
      return out;
    }
    case Attack::kStale:
      return me.own.size() == kParams ? me.own : honest;
    case Attack::kWrongData:
      return DeltaOf(base, absl::StrCat("another round's data ", seed), host, steps);
    case Attack::kNone:
    case Attack::kLyingValidator:
    case Attack::kLyingEvaluator:
    case Attack::kLyingScorer:
      break;
  }
  return honest;
}

class SimWorker final : public sidecar::RunWorker {
 public:
  SimWorker(SimNet* net, std::string self, std::string work_dir)
      : net_(*net), self_(std::move(self)), dir_(std::move(work_dir)) {}

  absl::StatusOr<pb::PrepareDataResponse> PrepareData(
      const pb::PrepareDataRequest& request) override {
    TS_RETURN_IF_ERROR(Call(kModelCallMs));
    const std::string train = "data/train-0.bin", eval = "data/eval.bin";
    TS_RETURN_IF_ERROR(WriteFile(Path(train), "sim training tokens"));
    TS_RETURN_IF_ERROR(WriteFile(Path(eval), "sim held-out tokens"));
    pb::PrepareDataResponse data;
    data.add_shard_files(train);
    data.add_shard_ids(common::Sha256("sim training tokens"));
    data.set_eval_file(eval);
    data.set_eval_id(common::Sha256("sim held-out tokens"));
    data.set_train_tokens(1000);
    data.set_eval_tokens(100);
    return data;
  }
  absl::StatusOr<pb::InitModelResponse> InitModel(const pb::InitModelRequest& request) override {
    TS_RETURN_IF_ERROR(Call(kModelCallMs));
    params_ = Params(kParams, 1.0F);
    TS_RETURN_IF_ERROR(WriteFile(Path(request.checkpoint_file()), Bytes(params_)));
    root_ = common::Sha256(Bytes(params_));
    pb::InitModelResponse made;
    made.set_root(root_);
    made.set_parameters(kParams);
    made.set_checkpoint_bytes(kParams * sizeof(float));
    return made;
  }
  absl::StatusOr<pb::LoadCheckpointResponse> LoadCheckpoint(
      const pb::LoadCheckpointRequest& request) override {
    TS_RETURN_IF_ERROR(Call(kModelCallMs));
    TS_ASSIGN_OR_RETURN(std::string bytes, ReadFile(Path(request.checkpoint_file())));
    if (common::Sha256(bytes) != request.expected_root()) {
      return absl::FailedPreconditionError("sim: the checkpoint is not at the expected root");
    }
    TS_ASSIGN_OR_RETURN(params_, ParamsOf(bytes));
    root_ = request.expected_root();
    return pb::LoadCheckpointResponse();
  }
  // What the steps from `base` report: the first step's loss and, where the run scores
  // (sidecar/shard/scoring.h), the held-out loss before and after — here the distance to the
  // target of the steps' model before the host's noise, which honest steps always lower.
  // A lying scorer claims half the held-out loss after them.
  static pb::InnerStepsResponse StepsResponse(const Params& base,
                                              const pb::InnerStepsRequest& request,
                                              bool lie = false) {
    pb::InnerStepsResponse done;
    done.add_losses(Loss(base));
    done.set_seconds(kInnerStepsMs / 1000.0);
    if (request.score_windows() > 0) {
      const float after = Loss(SgdSteps(base, request.steps()));
      done.set_score_base_loss(Loss(base));
      done.set_score_loss(lie ? after / 2 : after);
      done.set_assigned_loss(after);
    }
    return done;
  }
  absl::StatusOr<pb::InnerStepsResponse> InnerSteps(const pb::InnerStepsRequest& request,
                                                    int64_t) override {
    SimHostState* me = net_.Host(self_);
    const bool stalled = net_.scheduler().now() < me->stall_until_ms;
    TS_RETURN_IF_ERROR(Call(stalled ? kStalledInnerStepsMs : kInnerStepsMs));
    if (!request.replay_checkpoint_file().empty()) {
      // Another member's steps, from the file, leaving this worker's state alone.
      TS_ASSIGN_OR_RETURN(std::string bytes, ReadFile(Path(request.replay_checkpoint_file())));
      if (common::Sha256(bytes) != request.base_root()) {
        return absl::InvalidArgumentError("sim: the replay's checkpoint is not at base_root");
      }
      TS_ASSIGN_OR_RETURN(Params base, ParamsOf(bytes));
      Params delta = DeltaOf(base, request.data_seed(), request.host(), request.steps());
      if (me->attack == Attack::kLyingValidator) delta[0] += 1.0f;
      TS_RETURN_IF_ERROR(WriteFile(Path(request.delta_file()), Bytes(delta)));
      return StepsResponse(base, request);
    }
    if (request.base_root() != root_) {
      return absl::FailedPreconditionError(
          "sim: inner steps from a base this worker does not hold");
    }
    const Params honest = DeltaOf(params_, request.data_seed(), self_, request.steps());
    const Params delta =
        Tampered(*me, params_, request.data_seed(), self_, request.steps(), honest);
    const bool lie = me->attack == Attack::kLyingScorer && request.score_windows() > 0;
    if (delta != honest || lie) me->attacked_rounds.insert(request.round());
    me->own = honest;
    TS_RETURN_IF_ERROR(WriteFile(Path(request.delta_file()), Bytes(delta)));
    me->deltas[request.base_root() + request.data_seed()] = Bytes(delta);
    return StepsResponse(params_, request, lie);
  }
  absl::StatusOr<pb::OuterStepResponse> OuterStep(const pb::OuterStepRequest& request) override {
    TS_RETURN_IF_ERROR(Call(kModelCallMs));
    if (request.base_root() != root_) {
      return absl::FailedPreconditionError("sim: outer step from a base this worker does not hold");
    }
    TS_ASSIGN_OR_RETURN(std::string bytes, ReadFile(Path(request.delta_file())));
    TS_ASSIGN_OR_RETURN(Params aggregate, ParamsOf(bytes));
    for (size_t i = 0; i < kParams; ++i) params_[i] -= kOuterLr * aggregate[i];
    net_.Host(self_)->aggregate = aggregate;
    TS_RETURN_IF_ERROR(WriteFile(Path(request.checkpoint_file()), Bytes(params_)));
    root_ = common::Sha256(Bytes(params_));
    pb::OuterStepResponse stepped;
    stepped.set_root(root_);
    return stepped;
  }
  absl::StatusOr<pb::EvaluateResponse> Evaluate(const pb::EvaluateRequest& request) override {
    TS_RETURN_IF_ERROR(Call(kModelCallMs));
    Params p = params_;
    if (!request.checkpoint_file().empty()) {
      TS_ASSIGN_OR_RETURN(std::string bytes, ReadFile(Path(request.checkpoint_file())));
      TS_ASSIGN_OR_RETURN(p, ParamsOf(bytes));
    }
    pb::EvaluateResponse ev;
    ev.set_mean_loss(Loss(p));
    // Its own evaluations (of the current checkpoint), not its re-evaluations of others'.
    if (net_.Host(self_)->attack == Attack::kLyingEvaluator && request.checkpoint_file().empty()) {
      ev.set_mean_loss(Loss(p) / 2);
    }
    ev.set_tokens(100);
    ev.set_root(common::Sha256(Bytes(p)));
    ev.set_eval_id(common::Sha256("sim held-out tokens"));
    return ev;
  }
  absl::StatusOr<pb::WorkerStatusResponse> Status() override {
    TS_RETURN_IF_ERROR(Call(1));
    pb::WorkerStatusResponse about;
    about.set_device("sim");
    return about;
  }
  bool Running() override { return !dead_; }
  absl::Status Stop() override {
    return dead_ ? absl::AbortedError("sim: killed") : absl::OkStatus();
  }
  pid_t pid() const override { return 0; }

  void Kill() { dead_ = true; }

 private:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // A call's time; UNAVAILABLE when the worker died meanwhile.
  absl::Status Call(int64_t ms) {
    if (dead_) return absl::UnavailableError("sim: worker dead");
    net_.scheduler().Sleep(ms);
    if (dead_) return absl::UnavailableError("sim: worker died");
    return absl::OkStatus();
  }

  SimNet& net_;
  const std::string self_;
  const std::string dir_;
  Params params_;
  std::string root_;
  bool dead_ = false;
};

class SimArtifacts final : public sidecar::ShardArtifacts {
 public:
  SimArtifacts(SimNet* net, std::string self) : net_(*net), self_(std::move(self)) {}

  absl::StatusOr<std::string> Publish(uint64_t shard_id, const std::string& source_dir,
                                      std::string_view kind, uint64_t round) override {
    net_.scheduler().Sleep(kStoreCallMs);
    std::map<std::string, std::string> files;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(source_dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      TS_ASSIGN_OR_RETURN(std::string bytes, ReadFile(it->path().string()));
      files[std::filesystem::relative(it->path(), source_dir).string()] = std::move(bytes);
    }
    if (ec || files.empty())
      return absl::NotFoundError(absl::StrCat("sim: nothing in ", source_dir));
    std::string digest = absl::StrCat(std::string(kind), "/", round, "/", self_);
    for (const auto& [name, bytes] : files)
      absl::StrAppend(&digest, "/", name, "=", common::Sha256(bytes));
    const std::string id = common::Sha256(digest);
    SimHostState& me = *net_.Host(self_);
    me.artifacts[id] = std::move(files);
    pb::ArtifactSummary& s = me.summaries[id];
    s.set_artifact_id(id);
    s.set_shard_id(shard_id);
    s.set_round(round);
    s.set_kind(std::string(kind));
    s.set_publisher(self_);
    s.set_complete(true);
    return id;
  }
  absl::StatusOr<pb::ArtifactProgress> Fetch(uint64_t, const std::string& artifact_id,
                                             const std::vector<std::string>& peers,
                                             const std::function<bool()>&) override {
    net_.scheduler().Sleep(kStoreCallMs + net_.Delay());
    SimHostState& me = *net_.Host(self_);
    if (me.artifacts.contains(artifact_id)) return Done(artifact_id, {});
    for (const std::string& peer : peers) {
      SimHostState* from = net_.Host(peer);
      if (from == nullptr || !net_.Reachable(self_, peer) ||
          !from->artifacts.contains(artifact_id)) {
        continue;
      }
      me.artifacts[artifact_id] = from->artifacts[artifact_id];
      me.summaries[artifact_id] = from->summaries[artifact_id];
      return Done(artifact_id, peer);
    }
    return absl::UnavailableError("sim: no member could serve the artifact");
  }
  absl::Status Export(uint64_t, const std::string& artifact_id,
                      const std::string& out_dir) override {
    net_.scheduler().Sleep(kStoreCallMs);
    SimHostState& me = *net_.Host(self_);
    auto it = me.artifacts.find(artifact_id);
    if (it == me.artifacts.end()) return absl::NotFoundError("sim: artifact not held");
    for (const auto& [name, bytes] : it->second) {
      TS_RETURN_IF_ERROR(WriteFile(out_dir + "/" + name, bytes));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<pb::ArtifactSummary>> List(uint64_t) override {
    net_.scheduler().Sleep(kStoreCallMs);
    std::vector<pb::ArtifactSummary> out;
    for (const auto& [id, s] : net_.Host(self_)->summaries) out.push_back(s);
    return out;
  }
  absl::Status Drop(uint64_t, const std::vector<std::string>& artifact_ids) override {
    SimHostState& me = *net_.Host(self_);
    for (const auto& id : artifact_ids) {
      me.artifacts.erase(id);
      me.summaries.erase(id);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<pb::FindArtifactsResponse> Find(uint64_t, std::string_view kind) override {
    net_.scheduler().Sleep(kStoreCallMs + net_.Delay());
    pb::FindArtifactsResponse found;
    std::map<std::string, pb::FoundArtifact*> by_id;
    for (auto& [address, host] : net_.hosts()) {
      if (address == self_) continue;
      if (!net_.Reachable(self_, address)) {
        found.add_unanswered(absl::StrCat(address, ": unreachable"));
        continue;
      }
      for (const auto& [id, s] : host.summaries) {
        if (s.kind() != kind) continue;
        pb::FoundArtifact*& f = by_id[id];
        if (f == nullptr) {
          f = found.add_artifacts();
          *f->mutable_summary() = s;
        }
        f->add_holders(address);
      }
    }
    return found;
  }

 private:
  static pb::ArtifactProgress Done(const std::string& id, const std::string& from) {
    pb::ArtifactProgress p;
    p.set_done(true);
    p.set_artifact_id(id);
    if (!from.empty()) (*p.mutable_bytes_by_peer())[from] = 32;
    return p;
  }

  SimNet& net_;
  const std::string self_;
};

}  // namespace

std::shared_ptr<sidecar::RunWorker> MakeSimWorker(SimNet* net, const std::string& self,
                                                  const std::string& work_dir) {
  return std::make_shared<SimWorker>(net, self, work_dir);
}

std::unique_ptr<sidecar::ShardArtifacts> MakeSimArtifacts(SimNet* net, const std::string& self) {
  return std::make_unique<SimArtifacts>(net, self);
}

void KillSimWorker(sidecar::RunWorker* worker) { static_cast<SimWorker*>(worker)->Kill(); }

}  // namespace ts::sim
