#include "worker/client/model_spec.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"

namespace ts::worker {
namespace pb = ::gonka::trainshard::v1;
namespace {

absl::Status Invalid(const std::string& field, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " ", why));
}

std::string Quoted(const std::string& s) { return absl::StrCat("\"", absl::CHexEscape(s), "\""); }

// The message's fields as a config of `family`, unchecked.
ModelConfig ConfigOf(ModelFamily family, const pb::WorkerModelConfig& c) {
  return ModelConfig{.family = family,
                     .layers = c.layers(),
                     .d_model = c.d_model(),
                     .heads = c.heads(),
                     .context = c.context(),
                     .vocab = c.vocab(),
                     .mlp_ratio = c.mlp_ratio(),
                     .kv_heads = c.kv_heads(),
                     .mlp_hidden = c.mlp_hidden(),
                     .rope_theta = c.rope_theta(),
                     .norm_eps = c.norm_eps(),
                     .tie_embeddings = c.tie_embeddings()};
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromSpec(const pb::ModelSpec& spec,
                                                const std::string& prefix) {
  const pb::WorkerModelConfig& c = spec.config();
  const std::string config_prefix = prefix + "config.";
  if (spec.kind().empty()) return absl::InvalidArgumentError(prefix + "kind: missing");
  ModelConfig config;
  if (spec.kind() == "gpt") {
    if (!spec.preset().empty()) {
      return Invalid(prefix + "preset", Quoted(spec.preset()),
                     "is a llama size; the gpt family takes its config in full");
    }
    config = ConfigOf(ModelFamily::kGpt, c);
  } else if (spec.kind() == "llama") {
    if (!spec.preset().empty()) {
      // A preset fixes the shape; the spec gives what the data decides.
      const bool shape_given = c.layers() != 0 || c.d_model() != 0 || c.heads() != 0 ||
                               c.mlp_ratio() != 0 || c.kv_heads() != 0 || c.mlp_hidden() != 0 ||
                               c.rope_theta() != 0 || c.norm_eps() != 0 || c.tie_embeddings();
      if (shape_given) {
        return Invalid(prefix + "preset", Quoted(spec.preset()),
                       absl::StrCat("fixes the model's shape: ", config_prefix,
                                    " may give only vocab and context with it"));
      }
      auto preset = PresetConfig(spec.preset(), c.vocab(), c.context());
      if (absl::IsNotFound(preset.status())) {
        return absl::InvalidArgumentError(absl::StrCat(prefix, preset.status().message()));
      }
      if (!preset.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(config_prefix, preset.status().message()));
      }
      return *preset;
    }
    config = ConfigOf(ModelFamily::kLlama, c);
  } else {
    return Invalid(prefix + "kind", Quoted(spec.kind()),
                   "is not a known model (known: gpt, llama)");
  }
  if (absl::Status valid = ValidateModelConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config_prefix, valid.message()));
  }
  return config;
}

absl::StatusOr<TrainingChoice> TrainingFromSpec(const pb::TrainingSpec& spec, uint32_t batch_size,
                                                uint64_t total_steps, const std::string& prefix) {
  TrainingChoice out;
  if (spec.micro_batch() != 0 &&
      (spec.micro_batch() > batch_size || batch_size % spec.micro_batch() != 0)) {
    return Invalid(prefix + "micro_batch", absl::StrCat(spec.micro_batch()),
                   absl::StrCat("does not divide batch_size ", batch_size));
  }
  out.micro_batch = spec.micro_batch();
  if (spec.schedule().empty() || spec.schedule() == "constant") {
    if (spec.min_lr_ratio() != 0) {
      return Invalid(prefix + "min_lr_ratio", absl::StrCat(spec.min_lr_ratio()),
                     "is for the \"cosine\" schedule only");
    }
  } else if (spec.schedule() == "cosine") {
    out.cosine = true;
  } else {
    return Invalid(prefix + "schedule", Quoted(spec.schedule()),
                   "is not \"constant\" or \"cosine\"");
  }
  // NaN fails both comparisons.
  if (!(spec.min_lr_ratio() >= 0 && spec.min_lr_ratio() <= 1)) {
    return Invalid(prefix + "min_lr_ratio", absl::StrCat(spec.min_lr_ratio()), "is outside 0..1");
  }
  out.min_lr_ratio = spec.min_lr_ratio();
  if (spec.warmup_steps() > total_steps) {
    return Invalid(prefix + "warmup_steps", absl::StrCat(spec.warmup_steps()),
                   absl::StrCat("is more than the run's ", total_steps, " inner steps"));
  }
  out.warmup_steps = spec.warmup_steps();
  out.activation_checkpointing = spec.activation_checkpointing();
  if (spec.precision().empty() || spec.precision() == "fp32") {
    out.bf16 = false;
  } else if (spec.precision() == "bf16") {
    out.bf16 = true;
  } else {
    return Invalid(prefix + "precision", Quoted(spec.precision()), "is not \"fp32\" or \"bf16\"");
  }
  return out;
}

void ModelConfigToProto(const ModelConfig& c, pb::WorkerModelConfig* out) {
  out->Clear();
  out->set_layers(c.layers);
  out->set_d_model(c.d_model);
  out->set_heads(c.heads);
  out->set_context(c.context);
  out->set_vocab(c.vocab);
  out->set_mlp_ratio(c.mlp_ratio);
  out->set_kv_heads(c.kv_heads);
  out->set_mlp_hidden(c.mlp_hidden);
  out->set_rope_theta(c.rope_theta);
  out->set_norm_eps(c.norm_eps);
  out->set_tie_embeddings(c.tie_embeddings);
}

}  // namespace ts::worker
