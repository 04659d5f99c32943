// RunPreparation: everything a run does before its first round, and again after its worker
// died (docs/training.md "Preparation"): starts the worker process, prepares the run's data
// through it — built from a corpus (the same bytes on every host, checked against the spec's
// pinned root, then published as the shard's dataset artifact) or a packed dataset found among
// the members' artifacts, fetched and checked — starts the collective transport once, makes the
// round-0 checkpoint and its evaluation, and restores the certified state from the records
// (the checkpoint loaded when it is still on disk; fetched by catch-up otherwise).
//
// Owns whether the data set is published; writes the context's worker, data, transport,
// parameters and certified state.
//
// Thread-safety: the run thread's.
#ifndef TS_SIDECAR_SHARD_RUN_PREPARATION_H_
#define TS_SIDECAR_SHARD_RUN_PREPARATION_H_

#include "absl/status/status.h"
#include "sidecar/shard/run_context.h"
#include "worker/dataset_manifest.h"

namespace ts::sidecar {

class RunPreparation {
 public:
  explicit RunPreparation(RunContext* run) : run_(*run) {}

  // Worker, data, transport, round-0 checkpoint, restore. The caller has reset the worker.
  absl::Status Prepare();
  // The run's data again (after the worker refused a shard as missing or corrupt).
  absl::Status PrepareData();

 private:
  absl::Status StartWorker();
  absl::Status StartTransport();
  absl::Status PreparePacked();
  // One dataset artifact tried as the run's: fetched from `holders` (none: already here),
  // exported and checked. NOT_FOUND when it is not the run's; UNAVAILABLE to try it later.
  absl::Status TryDataset(const std::string& id, const std::vector<std::string>& holders);
  absl::Status UsePacked(const worker::PackedDataset& dataset);
  absl::Status InitAndRestore();
  void PublishData();

  RunContext& run_;
  bool data_published_ = false;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_RUN_PREPARATION_H_
