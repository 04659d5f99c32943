#include "worker/device.h"

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"

namespace ts::worker {

std::string_view DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
    case Device::kAuto:
      return "auto";
  }
  return "cpu";
}

absl::StatusOr<Device> ParseDevice(std::string_view field, std::string_view name) {
  for (Device d : {Device::kCpu, Device::kCuda, Device::kAuto}) {
    if (name == DeviceName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(field), ": \"",
                                                 common::AsAbsl(name),
                                                 "\" is not a device (cpu, cuda or auto)"));
}

}  // namespace ts::worker
