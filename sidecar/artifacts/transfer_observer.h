// TransferObserver: what a host's artifact traffic tells whoever counts it (the host's metrics,
// sidecar/host/host_metrics.h; docs/stats.md): chunk bytes served to each member, and each
// publish and fetch with its duration, its outcome and the bytes each peer delivered. The
// artifact services call it when set and work the same without one.
//
// Thread-safety: implementations must be thread-safe; the services call them from gRPC's and
// the chunk stream's threads.
#ifndef TS_SIDECAR_ARTIFACTS_TRANSFER_OBSERVER_H_
#define TS_SIDECAR_ARTIFACTS_TRANSFER_OBSERVER_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "gonka/trainshard/v1/shard.pb.h"

namespace ts::sidecar {

// The ways chunks leave a host.
inline constexpr std::string_view kServedOverGrpc = "grpc";
inline constexpr std::string_view kServedOverChunkStream = "chunk_stream";
// The operations the operator service times.
inline constexpr std::string_view kTransferFetch = "fetch";
inline constexpr std::string_view kTransferPublish = "publish";

class TransferObserver {
 public:
  virtual ~TransferObserver() = default;
  // `bytes` of one chunk sent to `peer` (the request's signer, checked) by `way`.
  virtual void ChunkServed(const std::string& peer, std::string_view way, uint64_t bytes) = 0;
  // A publish or fetch (`kind`) began.
  virtual void TransferStarted(std::string_view kind) = 0;
  // It ended after `seconds`; `result` is its final progress when it succeeded (a fetch's
  // bytes_by_peer), nullptr when it failed.
  virtual void TransferEnded(std::string_view kind, double seconds,
                             const ::gonka::trainshard::v1::ArtifactProgress* result) = 0;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_TRANSFER_OBSERVER_H_
