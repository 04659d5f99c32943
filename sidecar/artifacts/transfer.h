// Artifact transfer between shard hosts: the ArtifactTransfer gRPC service a host serves to its
// peers, and the multi-peer fetcher a host runs to get an artifact from them.
//
// Service: every request is authenticated (PeerRequestVerifier: signed, audience, expiry; the
// signer a member of the shard, as the ShardDirectory says; then the nonce, so a request of a
// host outside the shard leaves no state). GetChunks serves at most
// max_chunks_per_request chunks, each named by the artifact's manifest, one message each, in
// request order; at most max_concurrent_streams calls stream at once (RESOURCE_EXHAUSTED beyond).
//
// Fetcher: gets the manifest from the first peer that has it and verifies it (VerifyManifest,
// then the publisher's membership), starts or resumes the fetch in the store (BeginFetch: quota,
// incomplete index row), then asks for the missing chunks from all peers at once:
// a few streams per peer — each peer's chunk stream (chunk_stream.h) where it offers one,
// GetChunks calls otherwise — each for up to chunks_per_request chunks taken from a shared
// queue, each with a deadline. Every chunk is verified as it arrives (ArtifactStore::
// VerifyChunk: size and SHA-256) and then written durably by its stream's writer thread while
// the stream receives the next (nothing unverified is buffered beyond the one chunk being
// read). A peer that sends a chunk failing verification is reported (corrupt) and
// dropped; a peer whose call fails (unreachable, deadline, refused) is retried once and then
// dropped; the chunks it held go back to the queue for the others. A chunk stream call that
// fails before its first chunk (refused, reset, closed, deadline) is not held against the peer:
// the batch is asked of it again at once over GetChunks, which it is fetched from for the rest
// of the fetch (reported in ArtifactProgress.stream_fallbacks and logged). The fetch fails with
// UNAVAILABLE naming every dropped peer and its reason when no usable peer is left, and is then
// resumable. Channels cap received messages at kMaxChunkSize + 64 KiB (chunks) and
// kMaxManifestBytes + 64 KiB (manifests).
//
// Thread-safety: the service is thread-safe (gRPC calls it from many threads). FetchArtifact
// runs on the caller's thread plus its own stream threads; several may run at once.
#ifndef TS_SIDECAR_ARTIFACTS_TRANSFER_H_
#define TS_SIDECAR_ARTIFACTS_TRANSFER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/tls_session.h"
#include "common/status.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/artifacts/store.h"
#include "sidecar/artifacts/transfer_observer.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/peer/shard_directory.h"

namespace ts::sidecar {

inline constexpr std::string_view kMethodGetManifest =
    "/gonka.trainshard.v1.ArtifactTransfer/GetManifest";
inline constexpr std::string_view kMethodGetChunks =
    "/gonka.trainshard.v1.ArtifactTransfer/GetChunks";
inline constexpr std::string_view kMethodListArtifacts =
    "/gonka.trainshard.v1.ArtifactTransfer/ListArtifacts";
inline constexpr std::string_view kMethodGetChunkStream =
    "/gonka.trainshard.v1.ArtifactTransfer/GetChunkStream";
// What a chunk stream request (chunk_stream.h) is signed for: not a gRPC method, a name of its
// own so a request signed for one path is never valid on the other.
inline constexpr std::string_view kMethodChunkStream =
    "/gonka.trainshard.v1.ArtifactTransfer/ChunkStream";
// GetChunks' index among the ArtifactTransfer service's methods (shard.proto's order), for
// grpc::Service::MarkMethodStreamed.
inline constexpr int kGetChunksMethodIndex = 1;
inline constexpr size_t kMaxChunksPerRequest = 256;
// Largest request a peer may send the transfer service (a GetChunksRequest of 256 hashes is
// ~9 KiB); set as the server's max receive size.
inline constexpr int kMaxTransferRequestBytes = 64 << 10;

// Where the stores of each shard are. Implemented by the sidecar (opens them lazily, with the
// shard's quota from the chain).
class StoreRegistry {
 public:
  virtual ~StoreRegistry() = default;
  // NOT_FOUND if this host holds no store for the shard and cannot open one; errors of
  // ArtifactStore::Open.
  virtual absl::StatusOr<ArtifactStore*> StoreFor(uint64_t shard_id) = 0;
};

struct TransferServiceOptions {
  size_t max_chunks_per_request = kMaxChunksPerRequest;
  // GetChunks calls and chunk stream requests being served at once, together.
  size_t max_concurrent_streams = 32;
  // The port GetChunkStream announces (0: chunks over GetChunks only).
  uint16_t chunk_stream_port = 0;
  // Told of every chunk served (not owned; may be null).
  TransferObserver* observer = nullptr;
};

// A chunk request that passed the service's checks, holding one of its stream slots until it
// is destroyed. Move-only.
class ChunkServing {
 public:
  ChunkServing(ArtifactStore* store, std::atomic<size_t>* streams)
      : store_(store), streams_(streams) {}
  ~ChunkServing() {
    if (streams_ != nullptr) streams_->fetch_sub(1);
  }
  ChunkServing(ChunkServing&& other) noexcept
      : store_(other.store_), streams_(std::exchange(other.streams_, nullptr)) {}
  ChunkServing& operator=(ChunkServing&&) = delete;
  ChunkServing(const ChunkServing&) = delete;
  ChunkServing& operator=(const ChunkServing&) = delete;

  ArtifactStore* store() const { return store_; }
  // Hands the slot to the caller (who must give it back).
  std::atomic<size_t>* Release() { return std::exchange(streams_, nullptr); }

 private:
  ArtifactStore* store_;
  std::atomic<size_t>* streams_;
};

class ArtifactTransferService final : public pb::ArtifactTransfer::Service {
 public:
  // None of the pointers is owned; all must outlive the service.
  ArtifactTransferService(StoreRegistry* stores, ShardDirectory* directory,
                          PeerRequestVerifier* verifier, TransferServiceOptions options = {});

  grpc::Status GetManifest(grpc::ServerContext* context, const pb::GetManifestRequest* request,
                           pb::GetManifestResponse* response) override;
  grpc::Status GetChunks(grpc::ServerContext* context, const pb::GetChunksRequest* request,
                         grpc::ServerWriter<pb::ChunkData>* writer) override;
  grpc::Status ListArtifacts(grpc::ServerContext* context, const pb::ListArtifactsRequest* request,
                             pb::ListArtifactsResponse* response) override;
  grpc::Status GetChunkStream(grpc::ServerContext* context,
                              const pb::GetChunkStreamRequest* request,
                              pb::GetChunkStreamResponse* response) override;
  // GetChunks as gRPC calls it on this service: each ChunkData is encoded by hand around the
  // chunk file's bytes, read straight into the outgoing message, where the generated handler
  // would copy every chunk once more to serialize it. The constructor installs it for
  // GetChunks (split streaming: server streaming on the wire, one request then the answers); a
  // service forwarding to this one installs it the same way (kGetChunksMethodIndex).
  grpc::Status GetChunksRaw(
      grpc::ServerContext* context,
      grpc::ServerSplitStreamer<pb::GetChunksRequest, grpc::ByteBuffer>* stream);

  // The checks every chunk request passes before anything is sent, whichever path it came by:
  // auth signed for `method` (kMethodGetChunks or kMethodChunkStream), the signer a member of
  // the shard, the artifact id, 1..max_chunks_per_request hashes of 32 bytes each, every one
  // named by the artifact's complete manifest, and a free stream slot. UNAUTHENTICATED /
  // PERMISSION_DENIED (auth, membership), INVALID_ARGUMENT (request), RESOURCE_EXHAUSTED (no
  // slot), NOT_FOUND (no such complete artifact).
  absl::StatusOr<ChunkServing> BeginChunks(const pb::GetChunksRequest& request,
                                           std::string_view method);
  // Tells the observer, if any, of a chunk of `bytes` sent to `peer` by `way`.
  void ChunkServed(const std::string& peer, std::string_view way, uint64_t bytes) const {
    if (options_.observer != nullptr) options_.observer->ChunkServed(peer, way, bytes);
  }

 private:
  // The request's auth, then the signer's right to read the request's shard (a member, or a
  // reader: the creator or an address the spec names; the directory), then its nonce
  // (PeerRequestVerifier::Verify). Returns the signer's role. A reader sees checkpoints only
  // (CheckReadable).
  template <typename Request>
  absl::StatusOr<ShardRole> Authorize(const Request& request, std::string_view method) {
    ShardRole role = ShardRole::kMember;
    TS_RETURN_IF_ERROR(verifier_
                           ->VerifyRequest(request, method, request.shard_id(),
                                           [&](uint64_t shard_id, std::string_view signer) {
                                             auto checked =
                                                 directory_->CheckReader(shard_id, signer);
                                             if (!checked.ok()) return checked.status();
                                             role = *checked;
                                             return absl::OkStatus();
                                           })
                           .status());
    return role;
  }
  // OK for a member, and for a reader when the artifact is a checkpoint; PERMISSION_DENIED
  // otherwise.
  static absl::Status CheckReadable(ShardRole role, std::string_view kind,
                                    std::string_view artifact_id);
  // Sends each chunk, in request order, through `send` once the request is checked.
  using ChunkSender = std::function<absl::Status(ArtifactStore* store, const std::string& hash)>;
  grpc::Status ServeChunks(grpc::ServerContext* context, const pb::GetChunksRequest& request,
                           const ChunkSender& send);

  StoreRegistry* const stores_;
  ShardDirectory* const directory_;
  PeerRequestVerifier* const verifier_;
  const TransferServiceOptions options_;
  std::atomic<size_t> streams_{0};
};

// The one kind of artifact a reader of a shard (not a member) may list and fetch.
inline constexpr std::string_view kReaderKind = "checkpoint";

struct FetchPeer {
  std::string address;
  std::string endpoint;  // host:port
  // The SHA-256 its reservation pins for its certificate: the fetch talks TLS to it and accepts
  // no other certificate (sidecar/peer/peer_tls.h). Empty: plaintext.
  std::string tls_cert_sha256 = {};
};

struct FetcherOptions {
  // Each peer gets max(streams_per_peer, streams_target / peers) concurrent calls (at most 16):
  // a lone peer needs a few to keep the disk, the hashing and the link busy at once, while many
  // peers already give that; the total bounds the chunks partly received at any moment (what a
  // crash makes the resumed fetch receive again). More than 4 for one peer costs more CPU than
  // it gains on a 2-core host (docs/benchmarks.md).
  int streams_per_peer = 2;
  int streams_target = 4;
  int chunks_per_request = 16;
  int64_t manifest_deadline_ms = 10000;
  // Per GetChunks call; scaled up by nothing — keep chunks_per_request × chunk size / slowest
  // expected rate under it.
  int64_t chunks_deadline_ms = 120000;
  int max_call_failures_per_peer = 2;
  int64_t request_lifetime_ms = kDefaultPeerRequestLifetimeMs;
  // Chunks over a peer's chunk stream (chunk_stream.h) where it offers one; GetChunks otherwise.
  bool use_chunk_stream = true;
};

struct FetchRequest {
  uint64_t shard_id = 0;
  std::string artifact_id;  // 32 bytes
  std::vector<FetchPeer> peers;
};

// What a fetch needs from its host.
struct FetchContext {
  const common::PrivateKey* key = nullptr;
  std::string self_address;
  ArtifactStore* store = nullptr;
  ShardDirectory* directory = nullptr;
  common::Clock* clock = nullptr;
  ProgressFn progress;  // may be empty; called from fetcher threads, serialised
  // This host's TLS identity, for the chunk streams of peers pinned by tls_cert_sha256; without
  // it such peers are fetched from over gRPC (TLS) only.
  std::shared_ptr<const common::TlsContext> tls;
  // Polled between chunks; true stops the fetch (CANCELLED, resumable).
  std::function<bool()> cancelled;
};

// One member's answer to a signed ListArtifacts: its complete artifacts, or why not.
struct PeerArtifacts {
  std::string address;
  absl::StatusOr<std::vector<pb::ArtifactSummary>> artifacts;
};

// Asks every peer (in parallel, each within `deadline_ms` of the context's clock's monotonic
// time) for the complete artifacts it holds of the shard, with a request signed by the context's
// key. The answers in peer order; a peer that does not answer, or answers with more than
// kMaxListedArtifacts, carries its error.
std::vector<PeerArtifacts> ListPeerArtifacts(const FetchContext& context, uint64_t shard_id,
                                             const std::vector<FetchPeer>& peers,
                                             int64_t deadline_ms);
inline constexpr size_t kMaxListedArtifacts = 10000;

// Fetches an artifact as described in the file comment. On success returns the final progress
// (done = true, artifact_id, chunks_present / chunks_fetched / bytes_fetched, bytes_by_peer and
// peer_faults — also faults of peers dropped along the way). Errors: INVALID_ARGUMENT (request),
// NOT_FOUND (no peer has the manifest), the manifest checks of VerifyManifest, PERMISSION_DENIED
// (publisher not a member), RESOURCE_EXHAUSTED (quota), UNAVAILABLE (every peer dropped, the
// message naming each with its reason), CANCELLED.
absl::StatusOr<pb::ArtifactProgress> FetchArtifact(const FetchContext& context,
                                                   const FetchRequest& request,
                                                   const FetcherOptions& options = {});

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_TRANSFER_H_
