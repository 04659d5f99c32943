// Checkpoint publishing (docs/training.md "Checkpoints"): after a round is certified each member
// publishes the new checkpoint (with the run's tokenizer, so whoever fetches it can turn text
// into tokens and back) as an artifact of the shard's store; then the members all-gather their
// artifact ids over the round's mesh and adopt the first member's (all its chunks are already
// in their stores), so a joining host fetches one artifact from every member at once. Older
// checkpoint artifacts are dropped. A failed publish is reported and does not fail the round:
// the certificate stands, and the next round publishes again.
//
// Thread-safety: the run thread's (or the exchange's, with overlap).
#ifndef TS_SIDECAR_SHARD_CHECKPOINT_PUBLISHING_H_
#define TS_SIDECAR_SHARD_CHECKPOINT_PUBLISHING_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "sidecar/collective/collective.h"
#include "sidecar/shard/run_context.h"

namespace ts::sidecar {

// Publishes the checkpoint of the certified `round` and adopts the first member's artifact;
// `self` is this host's index in `group`. Sets the context's checkpoint_artifact while `round`
// is the certified one.
void PublishCheckpoint(RunContext& run, uint64_t round, Collective* collective,
                       const GroupSpec& group, size_t self, int64_t deadline);

// After a restart with the certified checkpoint of `round` still on disk: names the artifact
// that holds it (the one in the store, or published again), so members catching up from this
// host can fetch it.
void RepublishCheckpoint(RunContext& run, uint64_t round);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_CHECKPOINT_PUBLISHING_H_
