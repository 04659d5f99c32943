#include "sidecar/shard/run_spec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "worker/client/model_spec.h"
#include "worker/model_config.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr uint32_t kBatchMax = 4096;  // sequences per inner step

absl::Status Invalid(absl::string_view field, const auto& value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("run spec: ", field, ": ", value, " ", why));
}

absl::Status CheckRange(absl::string_view field, uint64_t v, uint64_t lo, uint64_t hi) {
  if (v < lo || v > hi) return Invalid(field, v, absl::StrCat("is outside ", lo, "..", hi));
  return absl::OkStatus();
}

absl::Status CheckPositive(absl::string_view field, float v) {
  if (!std::isfinite(v) || v <= 0) return Invalid(field, v, "is not a positive finite number");
  return absl::OkStatus();
}

absl::Status CheckUnit(absl::string_view field, float v) {
  if (!std::isfinite(v) || v < 0 || v >= 1) return Invalid(field, v, "is outside [0, 1)");
  return absl::OkStatus();
}

// The data section against the model's vocabulary and context.
absl::Status ValidateData(const pb::DataSpec& d, const worker::ModelConfig& c) {
  if (d.corpus() == "packed") {
    // A dataset packed from the user's text (docs/training.md "Data"): pinned by its root, found
    // among the members' dataset artifacts; the packing options are the pack's, not the spec's.
    if (d.dataset_root().size() != 32) {
      return Invalid("data.dataset_root", absl::StrCat(d.dataset_root().size(), " bytes"),
                     "must be the packed dataset's 32-byte root (trainshard data show)");
    }
    if (d.files() != 0 || d.shard_tokens() != 0 || d.eval_every() != 0) {
      return Invalid("data", "files, shard_tokens and eval_every",
                     "are the fortunes corpus's; a packed dataset has its own");
    }
    if (d.vocab() != c.vocab) {
      return Invalid("data.vocab", d.vocab(), absl::StrCat("is not model.config.vocab ", c.vocab));
    }
    TS_RETURN_IF_ERROR(CheckRange("data.vocab", d.vocab(), 8, 65536));
  } else if (d.corpus() == "fortunes") {
    TS_RETURN_IF_ERROR(CheckRange("data.files", d.files(), 1, 41));
    if (d.vocab() != c.vocab) {
      return Invalid("data.vocab", d.vocab(), absl::StrCat("is not model.config.vocab ", c.vocab));
    }
    TS_RETURN_IF_ERROR(CheckRange("data.vocab", d.vocab(), 8, 65536));
    TS_RETURN_IF_ERROR(CheckRange("data.shard_tokens", d.shard_tokens(), c.context + 1, 1u << 24));
    TS_RETURN_IF_ERROR(CheckRange("data.eval_every", d.eval_every(), 2, 1000));
    if (!d.dataset_root().empty() && d.dataset_root().size() != 32) {
      return Invalid("data.dataset_root", absl::StrCat(d.dataset_root().size(), " bytes"),
                     "is not 32 bytes");
    }
  } else {
    return Invalid("data.corpus", absl::StrCat("\"", d.corpus(), "\""),
                   "is not a known corpus (known: fortunes, packed)");
  }
  return absl::OkStatus();
}

// The aggregator named, or for "auto" the trimmed mean (RoundAggregate sets its trim).
absl::StatusOr<AggregateSpec> AggregateSpecOf(std::string_view name) {
  if (name == "auto") return AggregateSpec{.kind = Aggregator::kTrimmedMean};
  TS_ASSIGN_OR_RETURN(Aggregator kind, ParseAggregator(name));
  return AggregateSpec{.kind = kind};
}

// Whether a run commits before it reveals: asked for, or implied by an aggregation that gathers
// (every one but the ring mean).
bool Commits(const pb::RunSpec& spec) {
  return spec.verification().commitments() || spec.aggregation() != "mean";
}

absl::Status ValidateVerification(const pb::RunSpec& spec) {
  const pb::VerificationSpec& v = spec.verification();
  TS_RETURN_IF_ERROR(CheckRange("verification.replay_rate_bps", v.replay_rate_bps(), 0, 10000));
  TS_RETURN_IF_ERROR(CheckRange("verification.marked_replay_rate_bps", v.marked_replay_rate_bps(),
                                v.replay_rate_bps(), 10000));
  TS_RETURN_IF_ERROR(
      CheckRange("verification.exclude_after_marks", v.exclude_after_marks(), 1, 1000));
  // Replays and scores are compared with what a member committed to, before any Δ was seen.
  const bool commits = Commits(spec);
  if (v.replay_rate_bps() > 0 && !commits) {
    return Invalid("verification.replay_rate_bps", v.replay_rate_bps(),
                   "needs verification.commitments (or a robust aggregation): a replay is "
                   "compared with the member's commitment");
  }
  if (v.replay_rate_bps() > 0 && spec.requirements().device() != "cpu") {
    return Invalid(
        "verification.replay_rate_bps", v.replay_rate_bps(),
        absl::StrCat("needs requirements.device \"cpu\", not \"", spec.requirements().device(),
                     "\": a replay reproduces a member's steps bit for bit only within "
                     "one determinism class (no GPU tolerance is calibrated yet)"));
  }
  if (v.replay_rate_bps() > 0 && spec.overlap()) {
    return Invalid("verification.replay_rate_bps", v.replay_rate_bps(),
                   "cannot be used with overlap (a member's steps then start from its own Δ in "
                   "flight)");
  }
  TS_RETURN_IF_ERROR(CheckRange("verification.score_windows", v.score_windows(), 1, 1024));
  TS_RETURN_IF_ERROR(CheckRange("verification.score_margin_micro", v.score_margin_micro(), 1,
                                static_cast<uint64_t>(kScoreMicroLimit)));
  if (v.scoring() != "off" && v.scoring() != "drop" && v.scoring() != "record") {
    return Invalid("verification.scoring", absl::StrCat("\"", v.scoring(), "\""),
                   "is not drop, record or off");
  }
  if (v.scoring() != "off" && (spec.overlap() || !commits)) {
    return Invalid("verification.scoring", absl::StrCat("\"", v.scoring(), "\""),
                   "needs commitments and no overlap (a score travels with the commitment, and a "
                   "replay checks it)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRunSpec(const pb::RunSpec& spec) {
  if (spec.version() != 1) return Invalid("version", spec.version(), "is not 1");
  auto model = worker::ModelConfigFromSpec(spec.model(), "model.");
  if (!model.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("run spec: ", model.status().message()));
  }
  const worker::ModelConfig& c = *model;
  TS_RETURN_IF_ERROR(ValidateData(spec.data(), c));
  TS_RETURN_IF_ERROR(CheckRange("rounds", spec.rounds(), 1, 100000));
  TS_RETURN_IF_ERROR(CheckRange("inner_steps", spec.inner_steps(), 1, 100000));
  TS_RETURN_IF_ERROR(CheckRange("batch_size", spec.batch_size(), 1, kBatchMax));
  if (auto training = worker::TrainingFromSpec(spec.training(), spec.batch_size(),
                                               uint64_t{spec.rounds()} * spec.inner_steps());
      !training.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("run spec: ", training.status().message()));
  }
  TS_RETURN_IF_ERROR(CheckPositive("inner.lr", spec.inner().lr()));
  TS_RETURN_IF_ERROR(CheckUnit("inner.beta1", spec.inner().beta1()));
  TS_RETURN_IF_ERROR(CheckUnit("inner.beta2", spec.inner().beta2()));
  TS_RETURN_IF_ERROR(CheckPositive("inner.eps", spec.inner().eps()));
  if (!std::isfinite(spec.inner().weight_decay()) || spec.inner().weight_decay() < 0) {
    return Invalid("inner.weight_decay", spec.inner().weight_decay(), "is negative or not finite");
  }
  if (!std::isfinite(spec.inner().grad_clip_norm())) {
    return Invalid("inner.grad_clip_norm", spec.inner().grad_clip_norm(), "is not finite");
  }
  TS_RETURN_IF_ERROR(CheckPositive("outer.lr", spec.outer().lr()));
  TS_RETURN_IF_ERROR(CheckUnit("outer.momentum", spec.outer().momentum()));
  if (auto codec = ParseCompression(spec.codec()); !codec.ok() || *codec == Compression::kTopK) {
    return Invalid("codec", absl::StrCat("\"", spec.codec(), "\""),
                   "is not one of fp32, fp32-zstd, fp16, bf16, int8, int8-zstd");
  }
  if (!AggregateSpecOf(spec.aggregation()).ok()) {
    return Invalid("aggregation", absl::StrCat("\"", spec.aggregation(), "\""),
                   "is not one of auto, mean, median, trimmed_mean, centered_clip");
  }
  TS_RETURN_IF_ERROR(CheckRange("eval_every", spec.eval_every(), 1, 100000));
  TS_RETURN_IF_ERROR(CheckRange("eval_batch_size", spec.eval_batch_size(), 1, 4096));
  TS_RETURN_IF_ERROR(CheckRange("join_window_ms", spec.join_window_ms(), 100, 600000));
  TS_RETURN_IF_ERROR(CheckRange("planner_timeout_ms", spec.planner_timeout_ms(), 100, 600000));
  TS_RETURN_IF_ERROR(CheckRange("exchange_timeout_ms", spec.exchange_timeout_ms(), 1000, 3600000));
  if (spec.inner_timeout_ms() != 0) {
    TS_RETURN_IF_ERROR(
        CheckRange("inner_timeout_ms", spec.inner_timeout_ms(), 1000, 30ull * 24 * 3600 * 1000));
  }
  const std::string& device = spec.requirements().device();
  if (!device.empty() && device != "any" && device != "cpu" && device != "cuda") {
    return Invalid("requirements.device", absl::StrCat("\"", device, "\""),
                   "is not one of any, cpu, cuda");
  }
  return ValidateVerification(spec);
}

int64_t InnerStepsTimeoutMs(const pb::RunSpec& spec) {
  constexpr int64_t kDayMs = 24 * 3600 * 1000;
  if (spec.inner_timeout_ms() != 0) {
    return static_cast<int64_t>(std::min<uint64_t>(spec.inner_timeout_ms(), 30 * kDayMs));
  }
  const auto model = worker::ModelConfigFromSpec(spec.model());
  if (!model.ok()) return 600'000;
  const double tokens = static_cast<double>(spec.inner_steps()) * spec.batch_size() *
                        static_cast<double>(model->context);
  const double flops = 6.0 * static_cast<double>(worker::ParameterCount(*model)) * tokens;
  const double ms = 600'000.0 + flops / 1e6;  // 1 GFLOP/s = 1e6 FLOP a millisecond
  return static_cast<int64_t>(std::min(ms, static_cast<double>(30 * kDayMs)));
}

absl::StatusOr<ParsedRunSpec> ParseRunSpec(std::string_view document) {
  if (document.size() > kRunSpecBytesMax) {
    return Invalid("document", absl::StrCat(document.size(), " bytes"),
                   absl::StrCat("is larger than ", kRunSpecBytesMax));
  }
  ParsedRunSpec out;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(document.data(), document.size()), &out.spec, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("run spec: not a RunSpec document: ", std::string(parsed.message())));
  }
  pb::RunSpec& spec = out.spec;
  if (spec.join_window_ms() == 0) spec.set_join_window_ms(kDefaultJoinWindowMs);
  if (spec.planner_timeout_ms() == 0) spec.set_planner_timeout_ms(kDefaultPlannerTimeoutMs);
  if (spec.exchange_timeout_ms() == 0) spec.set_exchange_timeout_ms(kDefaultExchangeTimeoutMs);
  if (spec.codec().empty()) spec.set_codec("fp32");
  if (spec.aggregation().empty()) spec.set_aggregation("auto");
  const bool verification_given = spec.has_verification();
  pb::VerificationSpec& v = *spec.mutable_verification();
  if (v.marked_replay_rate_bps() == 0) v.set_marked_replay_rate_bps(10000);
  if (v.exclude_after_marks() == 0) v.set_exclude_after_marks(kDefaultExcludeAfterMarks);
  // Without a verification section a run that commits (and has no overlap) replays at the
  // default rate. Replays reproduce a member's steps bit for bit only within one determinism
  // class, which the CPU is (docs/verification.md "Replay"; no GPU tolerance is calibrated
  // yet): a run that replays, by default or as its section says, and names no device trains on
  // CPUs, and one that names another device does not replay by default.
  const std::string& device = spec.requirements().device();
  if (!verification_given && Commits(spec) && !spec.overlap() &&
      (device.empty() || device == "cpu")) {
    v.set_replay_rate_bps(kDefaultReplayRateBps);
  }
  if (device.empty() && v.replay_rate_bps() > 0) spec.mutable_requirements()->set_device("cpu");
  if (v.score_windows() == 0) v.set_score_windows(kDefaultScoreWindows);
  if (v.score_margin_micro() == 0) v.set_score_margin_micro(kDefaultScoreMarginMicro);
  if (v.scoring().empty()) v.set_scoring(v.replay_rate_bps() > 0 ? "record" : "off");
  TS_RETURN_IF_ERROR(ValidateRunSpec(spec));
  out.hash = common::Sha256(document);
  out.codec.kind = *ParseCompression(spec.codec());
  out.aggregate = *AggregateSpecOf(spec.aggregation());
  out.aggregate_auto = spec.aggregation() == "auto";
  out.commitments = Commits(spec);
  return out;
}

AggregateSpec RoundAggregate(const ParsedRunSpec& spec, size_t shard_members, size_t members) {
  if (!spec.aggregate_auto) return spec.aggregate;
  const size_t bound = shard_members == 0 ? 0 : (shard_members - 1) / 3;
  const size_t trim = std::min(bound, members == 0 ? 0 : (members - 1) / 2);
  if (trim == 0) return AggregateSpec{.kind = Aggregator::kMean};
  return AggregateSpec{.kind = Aggregator::kTrimmedMean, .trim = static_cast<uint32_t>(trim)};
}

uint32_t MemberBatchOf(const ParsedRunSpec& spec, const ShardView& shard, std::string_view host) {
  const uint32_t batch = spec.spec.batch_size();
  const ShardMember* member = shard.Find(host);
  unsigned __int128 total = 0;
  for (const ShardMember& m : shard.members) total += m.weight;
  if (member == nullptr || total == 0) return batch;
  const uint32_t micro = std::max<uint32_t>(1, spec.spec.training().micro_batch());
  // In micro-batches, to the nearest: batch × N × weight / W. Every factor is bounded (batch
  // 4096, N and weights the chain's), so 128 bits hold the product.
  const unsigned __int128 scaled =
      static_cast<unsigned __int128>(batch) * shard.members.size() * member->weight;
  const unsigned __int128 unit = total * micro;
  const uint64_t micros = static_cast<uint64_t>((2 * scaled + unit) / (2 * unit));
  const uint64_t most = kBatchMax / micro;
  return static_cast<uint32_t>(std::clamp<uint64_t>(micros, 1, most) * micro);
}

uint64_t MemberTokensOf(const ParsedRunSpec& spec, const ShardView& shard, std::string_view host) {
  return uint64_t{spec.spec.inner_steps()} * MemberBatchOf(spec, shard, host) *
         spec.spec.model().config().context();
}

pb::InnerStepsRequest InnerStepsRequestOf(
    const ParsedRunSpec& parsed, const ShardView& shard,
    const google::protobuf::RepeatedPtrField<std::string>& shard_files, uint64_t round,
    std::string_view data_seed, std::string_view host, std::string_view base_root) {
  const pb::RunSpec& spec = parsed.spec;
  pb::InnerStepsRequest request;
  *request.mutable_shard_files() = shard_files;
  request.set_data_seed(std::string(data_seed));
  request.set_round(round);
  request.set_host(std::string(host));
  request.set_steps(spec.inner_steps());
  request.set_batch_size(MemberBatchOf(parsed, shard, host));
  *request.mutable_adamw() = spec.inner();
  request.set_base_root(std::string(base_root));
  request.set_reset_optimizer(parsed.commitments);
  // The schedule is keyed to the global inner step, so a host that rejoins at round r uses
  // the rate every other host uses there.
  *request.mutable_training() = spec.training();
  request.set_first_step((round - 1) * uint64_t{spec.inner_steps()});
  request.set_total_steps(uint64_t{spec.rounds()} * spec.inner_steps());
  return request;
}

absl::StatusOr<std::string> DeltaCommitmentOf(const ParsedRunSpec& spec, size_t index,
                                              std::span<const float> delta) {
  std::string payload;
  TS_RETURN_IF_ERROR(Encode(spec.codec, delta, &payload));
  return CommitmentOf(kDeltaOpId, static_cast<uint32_t>(index), payload);
}

}  // namespace ts::sidecar
