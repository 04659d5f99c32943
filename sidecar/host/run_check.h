// RunSpecSkipReason: whether this host can run the run spec a shard pins on chain, asked before
// the host reserves a place in it (docs/host-sidecar.md, "Reservation policy"). A host that
// reserved a run it cannot train would stall the shard's rounds and forfeit its pay; it says no,
// with the reason, before any weight is frozen.
//
// Thread-safety: pure function over its arguments, except that it looks at the filesystem for
// the embedded corpus; thread-safe.
#ifndef TS_SIDECAR_HOST_RUN_CHECK_H_
#define TS_SIDECAR_HOST_RUN_CHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

#include "gonka/trainshard/v1/chain.pb.h"
#include "worker/device.h"

namespace ts::sidecar {

struct RunCheckLimits {
  // The memory a worker of this host may use for a run's training state and activations; 0:
  // the device's (the GPU's memory for CUDA workers, the machine's for CPU ones).
  uint64_t worker_memory_bytes_max = 0;
  // Where this host's workers train, as `ts_worker --probe-device` found it.
  worker::DeviceInfo device;
  // Where the embedded `fortunes` corpus must be for a run that trains on it.
  std::string fortunes_dir;
};

// Empty when the host can run the shard's run spec, or when the spec carries no run spec
// document (the hosts' operators then hand one over, `shard run`, and check it themselves).
// Otherwise why not, naming the field and value: a document that does not parse or check
// (ParseRunSpec's error: an unknown model family, a bad shape), a device requirement this host's
// workers do not meet (requirements.device), a model whose training state and activations
// (ActivationBytes for the spec's micro-batch) need more than the memory the host declares or
// its device has, or a corpus the host does not have. A packed
// dataset is fetched from the shard's members once they are known, so only its root's form is
// checked here; a member that cannot find it fails the run's preparation, visibly, in its status.
std::string RunSpecSkipReason(const ::gonka::trainshard::v1::ShardSpec& spec,
                              const RunCheckLimits& limits);

// Where this host's workers will train for the config's `device` ("cpu", "cuda", "auto"). The
// CPU is known without asking; otherwise `ts_worker --probe-device` answers (libtorch decides
// what is visible), writing its one line to `scratch_file`, within 120 s. FAILED_PRECONDITION
// naming worker_device when the worker cannot give the device (no CUDA in its libtorch, no
// GPU visible), with the worker's own words.
absl::StatusOr<worker::DeviceInfo> ProbeWorkerDevice(const std::string& worker_binary,
                                                     const std::string& device,
                                                     const std::string& scratch_file);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_RUN_CHECK_H_
