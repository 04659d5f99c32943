#include "sidecar/host/run_check.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "sidecar/shard/run_spec.h"
#include "worker/client/model_spec.h"
#include "worker/model_config.h"

namespace ts::sidecar {

std::string RunSpecSkipReason(const ::gonka::trainshard::v1::ShardSpec& spec,
                              const RunCheckLimits& limits) {
  if (spec.run_spec().empty()) return std::string();
  auto parsed = ParseRunSpec(spec.run_spec());
  if (!parsed.ok()) return absl::StrCat("run spec: ", parsed.status().message());
  auto model = worker::ModelConfigFromSpec(parsed->spec.model(), "model.");
  if (!model.ok()) return absl::StrCat("run spec: ", model.status().message());
  uint64_t memory = limits.worker_memory_bytes_max;
  if (memory == 0) memory = common::PhysicalMemoryBytes();
  const uint64_t need = worker::TrainingStateBytes(*model);
  if (memory != 0 && need > memory) {
    return absl::StrCat("run spec: model ", worker::ModelConfigString(*model), " needs ", need,
                        " bytes of fp32 training state (16 per parameter), more than the ", memory,
                        " bytes of worker_memory_bytes_max");
  }
  if (parsed->spec.data().corpus() == "fortunes") {
    std::error_code ec;
    if (!std::filesystem::is_directory(limits.fortunes_dir, ec)) {
      return absl::StrCat("run spec: data.corpus \"fortunes\" needs ", limits.fortunes_dir,
                          ", which this host does not have (apt-get install fortunes)");
    }
  }
  return std::string();
}

}  // namespace ts::sidecar
