// RoundPeers: how a run reaches the other members of its shard — the ShardRound calls one
// member makes to another (Announce to a planner, GetCertificates to catch up). The run signs
// its requests itself; a RoundPeers only carries them, with a deadline, to the endpoint the
// shard directory names. GrpcRoundPeers is the real one (a channel per endpoint that reconnects
// fast after a member restarts); a simulation or a test gives its own.
//
// Thread-safety: implementations are thread-safe (a run calls from its thread and from the
// short-lived thread that pre-announces it).
#ifndef TS_SIDECAR_SHARD_ROUND_PEERS_H_
#define TS_SIDECAR_SHARD_ROUND_PEERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/training.pb.h"

namespace ts::sidecar {

class RoundPeers {
 public:
  virtual ~RoundPeers() = default;
  // Errors name the call and the endpoint; a member that does not answer in `timeout_ms` is
  // UNAVAILABLE or DEADLINE_EXCEEDED.
  virtual absl::StatusOr<::gonka::trainshard::v1::AnnounceResponse> Announce(
      const std::string& endpoint, const ::gonka::trainshard::v1::AnnounceRequest& request,
      int64_t timeout_ms) = 0;
  virtual absl::StatusOr<::gonka::trainshard::v1::GetCertificatesResponse> GetCertificates(
      const std::string& endpoint, const ::gonka::trainshard::v1::GetCertificatesRequest& request,
      int64_t timeout_ms) = 0;
  // Sends each (endpoint, request) best effort, without waiting for the answers; what it
  // returns (a thread, or nothing when it sent at once) is joined when it goes out of scope.
  virtual std::jthread AnnounceInBackground(
      std::vector<std::pair<std::string, ::gonka::trainshard::v1::AnnounceRequest>> sends,
      int64_t timeout_ms) = 0;
};

// ShardRound over gRPC, one channel per endpoint kept for the run's life. With `pinned`, each
// channel talks TLS and accepts only the certificate whose SHA-256 pinned(endpoint) returns
// (sidecar/peer/peer_tls.h; the member's reservation); without, plaintext.
std::unique_ptr<RoundPeers> MakeGrpcRoundPeers(
    std::function<std::string(const std::string& endpoint)> pinned = {});

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_ROUND_PEERS_H_
