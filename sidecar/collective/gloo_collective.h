// Collectives on Gloo (libgloo, Facebook's collective engine) for trusted shard meshes, and the
// peer the collective benchmark compares against. Gloo has no authentication, no robust
// aggregation and no compression: use it only where every member is trusted (docs/collective.md
// "Gloo"). Built only when Gloo is found (library ts_sidecar_collective_gloo).
//
// Rendezvous through a directory every member can read and write (Gloo's FileStore), e.g. a
// shared filesystem in tests; connections are Gloo's own TCP pairs on `bind_ip`.
//
// Thread-safety: one operation at a time per GlooCollective.
#ifndef TS_SIDECAR_COLLECTIVE_GLOO_COLLECTIVE_H_
#define TS_SIDECAR_COLLECTIVE_GLOO_COLLECTIVE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::sidecar {

struct GlooOptions {
  int rank = 0;
  int size = 0;
  std::string store_dir;  // FileStore directory (created if missing)
  std::string prefix;     // separates groups sharing a store_dir
  std::string bind_ip = "127.0.0.1";
  int64_t timeout_ms = 30000;
};

class GlooCollective {
 public:
  // Rendezvous and full-mesh connect. INVALID_ARGUMENT naming the option (rank outside
  // [0, size), size < 2, empty store_dir); UNAVAILABLE with Gloo's message when the rendezvous
  // or a connection fails or times out.
  static absl::StatusOr<std::unique_ptr<GlooCollective>> Connect(const GlooOptions& options);
  ~GlooCollective();

  // Gloo's ring allreduce (sum), in place; mean divides by size afterwards. UNAVAILABLE with
  // Gloo's message on a failure (Gloo throws; this catches).
  absl::Status AllReduce(std::span<float> data, bool mean);
  // out[i·b .. (i+1)·b) ← rank i's `mine`.
  absl::Status AllGather(std::span<const float> mine, std::span<float> out);

  struct Impl;

 private:
  explicit GlooCollective(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_GLOO_COLLECTIVE_H_
