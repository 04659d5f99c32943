// The host's peer-facing listener (config key shard_listen): the ArtifactTransfer service the
// other members of a shard call to fetch this host's artifacts. Peer requests are signed over
// the chain id, which the host learns on its first contact with the chain; until Activate is
// called with it, every call is answered UNAVAILABLE. So the listener (and <data_dir>/shard.addr)
// exist from the start whether or not the chain can be reached, and a port already taken is a
// start-up error, not a later surprise.
//
// Thread-safety: thread-safe.
#ifndef TS_SIDECAR_HOST_SHARD_SERVER_H_
#define TS_SIDECAR_HOST_SHARD_SERVER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/tls_identity.h"
#include "sidecar/artifacts/chunk_stream.h"
#include "sidecar/artifacts/transfer.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/peer/shard_directory.h"

namespace ts::sidecar {

class ShardServer {
 public:
  // Binds `listen` ("host:port", port 0 = any free port) with SO_REUSEPORT off, so a second
  // process asking for the same port fails here instead of silently sharing it (peers would
  // reach either host at random). With `chunk_stream`, also binds the chunk stream
  // (chunk_stream.h) on the same host and a port the kernel picks, which GetChunkStream
  // announces. `extra_services` (the training runs' ShardRound) are served on the same listener
  // and check their own requests. With `tls`, the listener serves TLS with that identity
  // (sidecar/peer/peer_tls.h); without, plaintext. The pointers are not owned and must outlive
  // the server. UNAVAILABLE naming the address if it cannot be bound.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(
      const std::string& listen, StoreRegistry* stores, ShardDirectory* directory,
      std::string self_address, common::Clock* clock, bool chunk_stream = true,
      TransferServiceOptions options = {}, const std::vector<grpc::Service*>& extra_services = {},
      const common::TlsIdentity* tls = nullptr);
  ~ShardServer();  // Shutdown()s with no grace period if not done yet.
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // "host:port" with the port actually bound.
  const std::string& address() const { return address_; }
  // The chunk stream's port; 0 when not served.
  uint16_t chunk_stream_port() const;

  // Starts serving peers of `chain_id`: creates the request verifier, whose start time is now
  // (requests issued earlier are refused, see peer_auth.h). Later calls are ignored.
  void Activate(const std::string& chain_id);
  bool active() const;

  // Stops accepting calls; calls in flight get until `deadline`. Idempotent.
  void Shutdown(std::chrono::system_clock::time_point deadline);

 private:
  class Gate;
  ShardServer(StoreRegistry* stores, ShardDirectory* directory, std::string self_address,
              common::Clock* clock, TransferServiceOptions options);

  StoreRegistry* const stores_;
  ShardDirectory* const directory_;
  const std::string self_address_;
  common::Clock* const clock_;
  TransferServiceOptions options_;  // set in Start
  std::string address_;
  std::unique_ptr<Gate> gate_;
  std::unique_ptr<grpc::Server> server_;
  mutable absl::Mutex mu_;
  std::unique_ptr<PeerRequestVerifier> verifier_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ArtifactTransferService> service_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Set in Start; declared last so it is destroyed (its threads joined) before the service.
  std::unique_ptr<ChunkStreamServer> chunk_stream_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_SHARD_SERVER_H_
