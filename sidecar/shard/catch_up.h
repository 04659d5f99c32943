// RunCatchUp: how a member that fell behind (restarted, left out of a plan, slower than the
// others) rejoins (docs/training.md "Catching up"): it asks a member for the round certificates
// past its own (GetCertificates, signed, at most kCertificatesPerCallMax a call), checks that
// each continues the chain it holds (round and base root) and carries more than 2/3 of the
// shard's weight, stores them, and then fetches the latest checkpoint the member names — as an
// artifact, from every member that holds it — exports it and has the worker load it at the
// certified root.
//
// Owns nothing of its own; moves the context's certified state and `loaded`.
//
// Thread-safety: the run thread's.
#ifndef TS_SIDECAR_SHARD_CATCH_UP_H_
#define TS_SIDECAR_SHARD_CATCH_UP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "sidecar/shard/run_context.h"

namespace ts::sidecar {

class RunCatchUp {
 public:
  explicit RunCatchUp(RunContext* run) : run_(*run) {}

  // Certificates and checkpoint from `peer`, a member.
  absl::Status CatchUp(const std::string& peer);
  // Asks every member for certificates past ours; catches up from the first that has some.
  void CatchUpFromAnyone();
  // When `peer` holds a certificate of `round` from a later attempt than this host's, at another
  // root (this host certified an attempt the others abandoned): replaces this host's records
  // from that round with it, and the worker's checkpoint is to be fetched again. True when it
  // did (docs/training.md "Why this is safe").
  bool Supersede(const std::string& peer, uint64_t round);

 private:
  absl::Status FetchCheckpoint(const std::string& artifact_id, uint64_t round,
                               const std::string& root, const ShardView& view);

  RunContext& run_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_CATCH_UP_H_
