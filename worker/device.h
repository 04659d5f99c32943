// Where a worker trains: the device choice of `ts_worker --device`, a host's `worker_device` and
// a run spec's `requirements.device`, and what a worker found when it looked (ProbeDevice in
// trainer.h). Plain C++ without libtorch, so the sidecar and the CLI parse the same names.
//
// Thread-safety: pure functions and values.
#ifndef TS_WORKER_DEVICE_H_
#define TS_WORKER_DEVICE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ts::worker {

enum class Device {
  kCpu,   // always; the deterministic choice
  kCuda,  // FAILED_PRECONDITION where no CUDA device is visible to libtorch
  kAuto,  // CUDA where available, else CPU
};

// "cpu", "cuda", "auto".
std::string_view DeviceName(Device device);
// The inverse of DeviceName; INVALID_ARGUMENT naming `field` and the value otherwise.
absl::StatusOr<Device> ParseDevice(std::string_view field, std::string_view name);

// What a worker found on its machine for a device choice.
struct DeviceInfo {
  Device device = Device::kCpu;  // the resolved choice: kCpu or kCuda, never kAuto
  std::string name;              // "cpu", or the GPU's name ("NVIDIA H200")
  uint64_t memory_bytes = 0;     // the device's memory (the machine's on the CPU)
  uint64_t free_bytes = 0;       // free now (MemAvailable on the CPU); 0 if it cannot be told
};

}  // namespace ts::worker

#endif  // TS_WORKER_DEVICE_H_
