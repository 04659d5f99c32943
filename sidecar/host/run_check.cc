#include "sidecar/host/run_check.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/process.h"
#include "common/status.h"
#include "sidecar/shard/run_spec.h"
#include "worker/client/model_spec.h"
#include "worker/model_config.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

std::string RunSpecSkipReason(const ::gonka::trainshard::v1::ShardSpec& spec,
                              const RunCheckLimits& limits) {
  if (spec.run_spec().empty()) return std::string();
  auto parsed = ParseRunSpec(spec.run_spec());
  if (!parsed.ok()) return absl::StrCat("run spec: ", parsed.status().message());
  auto model = worker::ModelConfigFromSpec(parsed->spec.model(), "model.");
  if (!model.ok()) return absl::StrCat("run spec: ", model.status().message());
  const pb::RunSpec& run = parsed->spec;
  const bool cuda = limits.device.device == worker::Device::kCuda;
  const std::string device_name(worker::DeviceName(limits.device.device));
  const std::string& required = run.requirements().device();
  if ((required == "cuda" && !cuda) || (required == "cpu" && cuda)) {
    return absl::StrCat("run spec: requirements.device \"", required,
                        "\" is not where this host's workers train (", device_name, ")");
  }
  uint64_t memory = limits.worker_memory_bytes_max;
  std::string what = "of worker_memory_bytes_max";
  if (memory == 0) {
    memory = cuda ? limits.device.memory_bytes : common::PhysicalMemoryBytes();
    what = cuda ? absl::StrCat("of ", limits.device.name) : "of this machine's memory";
  }
  const uint64_t state = worker::TrainingStateBytes(*model);
  if (memory != 0 && state > memory) {
    return absl::StrCat("run spec: model ", worker::ModelConfigString(*model), " needs ", state,
                        " bytes of fp32 training state (16 per parameter), more than the ", memory,
                        " bytes ", what);
  }
  auto training = worker::TrainingFromSpec(run.training(), run.batch_size(),
                                           uint64_t{run.rounds()} * run.inner_steps());
  const uint32_t rows =
      training.ok() && training->micro_batch != 0 ? training->micro_batch : run.batch_size();
  const uint64_t activations = worker::ActivationBytes(
      *model, {.rows = rows,
               .cols = uint64_t{model->context} + 1,
               .checkpointing = training.ok() && training->activation_checkpointing,
               .bf16 = cuda && training.ok() && training->bf16,
               .fused_attention = cuda});
  if (memory != 0 && state + activations > memory) {
    return absl::StrCat("run spec: model ", worker::ModelConfigString(*model), " needs ",
                        state + activations, " bytes (training state ", state, ", activations ",
                        activations, " for passes of ", rows, " x ", model->context + 1,
                        " tokens), more than the ", memory, " bytes ", what);
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

absl::StatusOr<worker::DeviceInfo> ProbeWorkerDevice(const std::string& worker_binary,
                                                     const std::string& device,
                                                     const std::string& scratch_file) {
  TS_ASSIGN_OR_RETURN(worker::Device choice, worker::ParseDevice("worker_device", device));
  if (choice == worker::Device::kCpu) {
    return worker::DeviceInfo{.device = worker::Device::kCpu,
                              .name = "cpu",
                              .memory_bytes = common::PhysicalMemoryBytes(),
                              .free_bytes = common::AvailableMemoryBytes()};
  }
  std::filesystem::remove(scratch_file);
  TS_ASSIGN_OR_RETURN(pid_t pid, common::SpawnProcess(
                                     {.args = {worker_binary, "--probe-device", "--device", device},
                                      .log_file = scratch_file}));
  std::string how;
  if (!common::ReapProcess(pid, /*timeout_ms=*/120'000, &how)) {
    how = common::StopProcess(pid, /*grace_ms=*/2000);
  }
  std::string out;
  {
    std::ifstream in(scratch_file);
    out.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::filesystem::remove(scratch_file);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (!how.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("worker_device: \"", device,
                                                      "\": ", worker_binary, " --probe-device ",
                                                      how, ": ", out.substr(0, 500)));
  }
  const std::string line =
      out.substr(out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1);
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("device") || !j["device"].is_string() ||
      !j.value("memory_bytes", nlohmann::json()).is_number_unsigned()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker_device: ", worker_binary, " --probe-device printed ", line.substr(0, 200)));
  }
  worker::DeviceInfo info;
  TS_ASSIGN_OR_RETURN(info.device,
                      worker::ParseDevice("probe.device", j["device"].get<std::string>()));
  info.name = j.value("name", std::string());
  info.memory_bytes = j["memory_bytes"].get<uint64_t>();
  info.free_bytes = j.value("free_bytes", uint64_t{0});
  return info;
}

}  // namespace ts::sidecar
