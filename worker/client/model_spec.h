// A run spec's model section (ModelSpec: a family, a preset or a config, a seed) as the worker's
// ModelConfig, and back: one translation, used by the worker when it creates a model and by the
// shard process when it checks a run spec, so both refuse the same specs with the same words.
//
// Thread-safety: pure functions.
#ifndef TS_WORKER_CLIENT_MODEL_SPEC_H_
#define TS_WORKER_CLIENT_MODEL_SPEC_H_

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

}  // namespace ts::worker

#endif  // TS_WORKER_CLIENT_MODEL_SPEC_H_
