// A run spec's model section (ModelSpec: a family, a preset or a config, a seed) as the worker's
// ModelConfig, and back, and its training section (TrainingSpec) checked: one translation, used
// by the worker when it creates a model or runs inner steps and by the shard process when it
// checks a run spec, so both refuse the same specs with the same words.
//
// Thread-safety: pure functions.
#ifndef TS_WORKER_CLIENT_MODEL_SPEC_H_
#define TS_WORKER_CLIENT_MODEL_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/worker.pb.h"
#include "worker/model_config.h"

namespace ts::worker {

// The model `spec` describes, validated. INVALID_ARGUMENT naming the field under `prefix`
// ("model.kind", "model.config.kv_heads", "model.preset") and the value: an unknown kind, a
// preset for the gpt family or an unknown preset, a preset with config fields other than vocab
// and context, a field of the other family, any field out of range.
absl::StatusOr<ModelConfig> ModelConfigFromSpec(const ::gonka::trainshard::v1::ModelSpec& spec,
                                                const std::string& prefix = "model.");

// The config's fields, as the proto carries them (the family goes to ModelSpec.kind).
void ModelConfigToProto(const ModelConfig& config, ::gonka::trainshard::v1::WorkerModelConfig* out);

// TrainingSpec, checked, in plain values.
struct TrainingChoice {
  uint32_t micro_batch = 0;  // 0: whole batches
  uint64_t warmup_steps = 0;
  bool cosine = false;
  float min_lr_ratio = 0;
  bool activation_checkpointing = false;
  bool bf16 = false;
};

// INVALID_ARGUMENT naming the field under `prefix` ("training.micro_batch: 3 does not divide
// batch_size 8"): a micro_batch that does not divide `batch_size` or exceeds it, a schedule other
// than "constant" or "cosine", min_lr_ratio outside 0..1 (or set without "cosine"), warmup_steps
// above total_steps, a precision other than "fp32" or "bf16".
absl::StatusOr<TrainingChoice> TrainingFromSpec(const ::gonka::trainshard::v1::TrainingSpec& spec,
                                                uint32_t batch_size, uint64_t total_steps,
                                                const std::string& prefix = "training.");

}  // namespace ts::worker

#endif  // TS_WORKER_CLIENT_MODEL_SPEC_H_
