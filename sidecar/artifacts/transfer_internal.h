// The artifact transfer's internals, included only by its own .cc files (transfer.cc,
// transfer_serve.cc, transfer_fetch_stream.cc): the helpers they share and the Fetcher.
// Thread-safety: as transfer.h says; the Fetcher's locks are annotated on its members.
#ifndef TS_SIDECAR_ARTIFACTS_TRANSFER_INTERNAL_H_
#define TS_SIDECAR_ARTIFACTS_TRANSFER_INTERNAL_H_

#include "sidecar/artifacts/transfer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/hex.h"
#include "sidecar/artifacts/chunk_stream.h"
#include "sidecar/artifacts/store.h"

namespace ts::sidecar::transfer_internal {

// Bounds on what one fetch may start: its threads are peers × StreamsPerPeer().
inline constexpr size_t kMaxFetchPeers = 256;
inline constexpr int kMaxStreamsPerPeer = 16;
inline constexpr size_t kMaxFetchStreams = 512;

inline std::string Hex(std::string_view bytes) { return common::HexEncode(bytes); }

absl::Status CheckArtifactId(std::string_view field, std::string_view id);

inline std::chrono::system_clock::time_point DeadlineAfter(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

class Fetcher {
 public:
  Fetcher(const FetchContext& context, const FetchRequest& request, const FetcherOptions& options)
      : context_(context), request_(request), options_(options) {}

  absl::StatusOr<pb::ArtifactProgress> Run();

 private:
  struct Peer {
    FetchPeer peer;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::ArtifactTransfer::Stub> stub;
    // GetChunks called without the generated stub, to read each answer as received (slices)
    // and decode it straight into the stream's chunk buffer.
    std::unique_ptr<grpc::internal::RpcMethod> get_chunks;
    // The chunk stream's port, asked for once by the peer's first stream (0: GetChunks).
    std::unique_ptr<std::once_flag> stream_once = std::make_unique<std::once_flag>();
    uint16_t stream_port = 0;
    std::string stream_host;
    // The rest is guarded by mu_.
    bool dropped = false;
    // Its chunk stream refused or failed before a chunk came (why): GetChunks from then on.
    bool stream_off = false;
    std::string stream_failure;
    int failures = 0;  // consecutive failed calls
    uint64_t bytes = 0;
    std::vector<grpc::ClientContext*> calls;     // in flight; cancelled when the peer is dropped
    std::vector<ChunkStreamCall*> stream_calls;  // the same for chunk stream calls
  };
  // What one call for a batch came to.
  struct CallResult {
    size_t delivered = 0;
    std::string corrupt;  // why the peer's data was refused
    absl::Status fatal;   // a failure of this host, not of the peer
    absl::Status status;  // how the call itself ended
  };
  enum class Outcome { kOk, kFailed, kCorrupt };

  absl::Status Validate() const;
  bool Cancelled() const { return context_.cancelled && context_.cancelled(); }
  // Concurrent GetChunks calls per peer (FetcherOptions::streams_target).
  int StreamsPerPeer() const {
    const int peers = static_cast<int>(std::max<size_t>(request_.peers.size(), 1));
    return std::max(options_.streams_per_peer,
                    std::min(kMaxStreamsPerPeer, options_.streams_target / peers));
  }
  absl::StatusOr<VerifiedManifest> CheckedManifest(const pb::Manifest& manifest) const;
  absl::StatusOr<VerifiedManifest> ManifestFromPeer(size_t index, Outcome* outcome);
  absl::StatusOr<VerifiedManifest> FindManifest();
  absl::StatusOr<pb::ArtifactProgress> FetchChunks();

  void StreamLoop(size_t index);
  void StreamLoopGuarded(size_t index);
  // One GetChunks call for plan_.missing[k], k in batch: stores what arrives, puts the rest
  // back in the queue and judges the peer.
  class Pipeline;
  void Call(size_t index, const std::vector<size_t>& batch, Pipeline* pipeline);
  void CallGrpc(size_t index, const pb::GetChunksRequest& request, const std::vector<size_t>& batch,
                Pipeline* pipeline, CallResult* result);
  void CallStream(size_t index, const pb::GetChunksRequest& request,
                  const std::vector<size_t>& batch, Pipeline* pipeline, CallResult* result);
  // Verifies one received chunk (the batch's next) and hands it to the stream's writer, or says
  // why not; true if handed on.
  bool Deliver(size_t index, const std::vector<size_t>& batch, std::string_view hash,
               std::string_view data, Pipeline* pipeline, CallResult* result);
  // A chunk handed on by peer `index` was written (or failed to be).
  void Stored(size_t index, uint64_t size, absl::Status status);
  // Asks the peer for its chunk stream port (once per peer; 0 when it has none).
  void ResolveStream(size_t index);
  // Signs `request` for `method` to peer `index`.
  absl::Status Sign(size_t index, std::string_view method, pb::GetChunksRequest* request) const;
  // Whether a chunk stream call that came to `result` should be made again over GetChunks: it
  // failed before any chunk arrived, through no fault in what the peer sent and not because
  // this fetch stopped it (a refusal, a reset, a closed connection, a deadline).
  bool StreamRefused(size_t index, const CallResult& result) const ABSL_LOCKS_EXCLUDED(mu_);
  // Takes peer `index` off its chunk stream for the rest of the fetch and reports why.
  void FallBackToGrpc(size_t index, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  bool Finished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AnyPeerLeft() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(size_t index, std::string reason, bool corrupt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  pb::ArtifactProgress Snapshot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Progress(bool force) ABSL_LOCKS_EXCLUDED(mu_, progress_mu_);
  std::string PeerName(size_t index) const;
  std::string NoPeerLeftMessage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FetchContext& context_;
  const FetchRequest& request_;
  const FetcherOptions& options_;
  std::vector<Peer> peers_;  // the vector itself is fixed once the stream threads start

  // Set before the stream threads start, read-only afterwards.
  FetchPlan plan_;
  uint64_t bytes_total_ = 0;  // distinct chunks

  mutable absl::Mutex mu_;
  std::deque<size_t> queue_ ABSL_GUARDED_BY(mu_);  // indices into plan_.missing
  size_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;    // taken by a call, not yet stored
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  uint32_t chunks_fetched_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_fetched_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<pb::PeerFault> faults_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::PeerFault> stream_fallbacks_ ABSL_GUARDED_BY(mu_);

  absl::Mutex progress_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int64_t last_progress_ms_ ABSL_GUARDED_BY(progress_mu_) = 0;
  bool progress_started_ ABSL_GUARDED_BY(progress_mu_) = false;
};

}  // namespace ts::sidecar::transfer_internal

#endif  // TS_SIDECAR_ARTIFACTS_TRANSFER_INTERNAL_H_
