// The fetching side of the artifact transfer (transfer.h): FetchArtifact's checks, its peers'
// channels, the manifest, progress, the fetch loop and its resume; and ListPeerArtifacts. Each
// fetch stream's calls are in transfer_fetch_stream.cc, the service in transfer_serve.cc.
#include "sidecar/artifacts/transfer.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/transfer_internal.h"
#include "sidecar/peer/peer_tls.h"

namespace ts::sidecar {

using transfer_internal::DeadlineAfter;
using transfer_internal::Fetcher;

// ---------------------------------------------------------------------------------------------
// FetchArtifact

namespace {

// Room for the protobuf framing around the largest chunk (or manifest) a peer may send.
constexpr int kReceiveSlackBytes = 64 << 10;
constexpr int kMaxChunkMessageBytes = static_cast<int>(kMaxChunkSize) + kReceiveSlackBytes;
constexpr int kMaxManifestMessageBytes = static_cast<int>(kMaxManifestBytes) + kReceiveSlackBytes;
// Progress callbacks at most this often (a final one comes regardless).
constexpr int64_t kProgressIntervalMs = 100;
// How often the caller's thread polls FetchContext::cancelled.
constexpr int64_t kCancelPollMs = 20;

// The method name as a C string for grpc::internal::RpcMethod, which keeps the pointer.
constexpr char kGetChunksMethodName[] = "/gonka.trainshard.v1.ArtifactTransfer/GetChunks";
static_assert(std::string_view(kGetChunksMethodName) == kMethodGetChunks);
// HTTP/2 and socket settings of the fetcher's channels (see PeerChannel).
constexpr int kChannelFrameBytes = 1 << 20;
constexpr int kChannelLookaheadBytes = 8 << 20;
constexpr int kChannelReadChunkBytes = 256 << 10;

std::shared_ptr<grpc::Channel> PeerChannel(const FetchPeer& peer) {
  grpc::ChannelArguments args;
  // The channel-wide cap fits a manifest; the per-method config narrows chunk streams to one
  // chunk (gRPC applies the smaller of the two), so one channel per peer serves both.
  args.SetMaxReceiveMessageSize(kMaxManifestMessageBytes);
  args.SetMaxSendMessageSize(kMaxTransferRequestBytes);
  // Chunks arrive as megabyte messages: let the peer send them in large HTTP/2 frames (fewer
  // frame headers to parse, fewer slices per message) and read the socket in large pieces.
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kChannelFrameBytes);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kChannelLookaheadBytes);
  args.SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kChannelReadChunkBytes);
  args.SetInt(GRPC_ARG_TCP_READ_CHUNK_SIZE, kChannelReadChunkBytes);
  args.SetServiceConfigJSON(absl::StrCat(
      R"({"methodConfig":[{"name":[{"service":"gonka.trainshard.v1.ArtifactTransfer",)",
      R"("method":"GetChunks"}],"maxResponseMessageBytes":)", kMaxChunkMessageBytes, "}]}"));
  return grpc::CreateCustomChannel(peer.endpoint, PeerChannelCredentials(peer.tls_cert_sha256),
                                   args);
}

}  // namespace

namespace transfer_internal {

absl::Status CheckArtifactId(std::string_view field, std::string_view id) {
  if (id.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(field), ": ", id.size(), " bytes, want ", common::kSha256Size));
  }
  return absl::OkStatus();
}

absl::Status Fetcher::Validate() const {
  TS_CHECK(context_.key != nullptr && context_.store != nullptr && context_.directory != nullptr &&
           context_.clock != nullptr);
  TS_RETURN_IF_ERROR(CheckArtifactId("artifact_id", request_.artifact_id));
  if (request_.shard_id != context_.store->shard_id()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard_id: ", request_.shard_id, " is not the store's shard ", context_.store->shard_id()));
  }
  if (request_.peers.empty()) return absl::InvalidArgumentError("peers: empty");
  if (request_.peers.size() > kMaxFetchPeers) {
    return absl::InvalidArgumentError(
        absl::StrCat("peers: ", request_.peers.size(), " entries, at most ", kMaxFetchPeers));
  }
  absl::flat_hash_set<std::string_view> seen;
  for (size_t i = 0; i < request_.peers.size(); ++i) {
    const FetchPeer& peer = request_.peers[i];
    if (peer.address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("peers[", i, "].address: empty"));
    }
    if (peer.endpoint.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("peers[", i, "].endpoint: empty (", peer.address, ")"));
    }
    if (peer.address == context_.self_address) {
      return absl::InvalidArgumentError(
          absl::StrCat("peers[", i, "].address: ", peer.address, " is this host"));
    }
    if (!seen.insert(peer.address).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("peers[", i, "].address: ", peer.address, " is listed twice"));
    }
  }
  if (options_.streams_per_peer < 1 || options_.streams_per_peer > kMaxStreamsPerPeer) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.streams_per_peer: ", options_.streams_per_peer, " is outside 1..",
                     kMaxStreamsPerPeer));
  }
  if (options_.streams_target < 1 ||
      static_cast<size_t>(options_.streams_target) > kMaxFetchStreams) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.streams_target: ", options_.streams_target, " is outside 1..", kMaxFetchStreams));
  }
  if (request_.peers.size() * static_cast<size_t>(StreamsPerPeer()) > kMaxFetchStreams) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peers: ", request_.peers.size(), " peers with ", StreamsPerPeer(), " streams each make ",
        request_.peers.size() * static_cast<size_t>(StreamsPerPeer()), " streams, at most ",
        kMaxFetchStreams));
  }
  if (options_.chunks_per_request < 1 ||
      static_cast<size_t>(options_.chunks_per_request) > kMaxChunksPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.chunks_per_request: ", options_.chunks_per_request, " is outside 1..",
                     kMaxChunksPerRequest));
  }
  if (options_.manifest_deadline_ms <= 0 || options_.chunks_deadline_ms <= 0) {
    return absl::InvalidArgumentError("options: deadlines must be positive");
  }
  if (options_.max_call_failures_per_peer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.max_call_failures_per_peer: ", options_.max_call_failures_per_peer,
                     " is below 1"));
  }
  if (options_.request_lifetime_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.request_lifetime_ms: ", options_.request_lifetime_ms, " is not positive"));
  }
  return absl::OkStatus();
}

std::string Fetcher::PeerName(size_t index) const {
  const FetchPeer& peer = peers_[index].peer;
  return absl::StrCat(peer.address, " (", peer.endpoint, ")");
}

absl::StatusOr<VerifiedManifest> Fetcher::CheckedManifest(const pb::Manifest& manifest) const {
  ArtifactStore* store = context_.store;
  return VerifyManifest(manifest, store->chain_id(), store->shard_id(), request_.artifact_id);
}

absl::StatusOr<VerifiedManifest> Fetcher::ManifestFromPeer(size_t index, Outcome* outcome) {
  *outcome = Outcome::kFailed;
  Peer& peer = peers_[index];
  pb::GetManifestRequest request;
  request.set_shard_id(request_.shard_id);
  request.set_artifact_id(request_.artifact_id);
  TS_ASSIGN_OR_RETURN(*request.mutable_auth(),
                      SignPeerRequest(*context_.key, context_.store->chain_id(), request_.shard_id,
                                      kMethodGetManifest, peer.peer.address, request,
                                      context_.clock->NowUnixMs(), options_.request_lifetime_ms));
  grpc::ClientContext call;
  call.set_deadline(DeadlineAfter(options_.manifest_deadline_ms));
  pb::GetManifestResponse response;
  grpc::Status status = peer.stub->GetManifest(&call, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  absl::StatusOr<VerifiedManifest> manifest = CheckedManifest(response.manifest());
  if (!manifest.ok()) {
    *outcome = Outcome::kCorrupt;
    return manifest.status();
  }
  *outcome = Outcome::kOk;
  return manifest;
}

absl::StatusOr<VerifiedManifest> Fetcher::FindManifest() {
  // An interrupted fetch left its manifest in the store: resuming needs no peer for it (it is
  // checked again, as anything read back from the disk).
  absl::StatusOr<VerifiedManifest> local =
      context_.store->GetManifest(request_.artifact_id, /*complete_only=*/false);
  if (local.ok()) return CheckedManifest(local->manifest);
  if (!absl::IsNotFound(local.status())) return local.status();

  std::vector<std::string> reasons;
  absl::Status verification;  // the first manifest a peer sent that failed the checks
  bool all_not_found = true;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (Cancelled()) return absl::CancelledError("fetch cancelled while asking for the manifest");
    Outcome outcome;
    absl::StatusOr<VerifiedManifest> manifest = ManifestFromPeer(i, &outcome);
    if (manifest.ok()) return manifest;
    const absl::Status& s = manifest.status();
    std::string reason;
    absl::MutexLock lock(&mu_);
    if (outcome == Outcome::kCorrupt) {
      if (verification.ok()) verification = s;
      reason = absl::StrCat("sent a bad manifest: ", s.ToString());
      Drop(i, reason, /*corrupt=*/true);
      all_not_found = false;
    } else if (absl::IsNotFound(s)) {
      reason = absl::StrCat("does not have it: ", s.message());
      Drop(i, reason, /*corrupt=*/false);
    } else {
      reason = s.ToString();
      all_not_found = false;
      if (++peers_[i].failures >= options_.max_call_failures_per_peer) {
        Drop(i, reason, /*corrupt=*/false);
      }
    }
    reasons.push_back(absl::StrCat(PeerName(i), ": ", reason));
  }
  const std::string message = absl::StrCat("manifest of artifact ", Hex(request_.artifact_id), ": ",
                                           absl::StrJoin(reasons, "; "));
  if (!verification.ok()) return absl::Status(verification.code(), message);
  if (all_not_found) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

bool Fetcher::AnyPeerLeft() const {
  for (const Peer& peer : peers_) {
    if (!peer.dropped) return true;
  }
  return false;
}

bool Fetcher::Finished() const {
  if (stop_) return true;
  if (outstanding_ > 0) return false;
  return queue_.empty() || !AnyPeerLeft();
}

void Fetcher::Drop(size_t index, std::string reason, bool corrupt) {
  Peer& peer = peers_[index];
  if (peer.dropped) return;
  peer.dropped = true;
  pb::PeerFault& fault = faults_.emplace_back();
  fault.set_peer(peer.peer.address);
  if (peer.stream_off && !corrupt) {
    absl::StrAppend(&reason,
                    " (over GetChunks, after its chunk stream failed: ", peer.stream_failure, ")");
  }
  fault.set_reason(std::move(reason));
  fault.set_corrupt(corrupt);
  for (grpc::ClientContext* call : peer.calls) call->TryCancel();
  for (ChunkStreamCall* call : peer.stream_calls) call->Cancel();
}

void Fetcher::StopLocked() {
  stop_ = true;
  for (Peer& peer : peers_) {
    for (grpc::ClientContext* call : peer.calls) call->TryCancel();
    for (ChunkStreamCall* call : peer.stream_calls) call->Cancel();
  }
}

void Fetcher::Fail(absl::Status status) {
  if (fatal_.ok()) fatal_ = std::move(status);
  StopLocked();
}

pb::ArtifactProgress Fetcher::Snapshot() const {
  pb::ArtifactProgress progress;
  progress.set_phase("fetching");
  progress.set_bytes_total(bytes_total_);
  progress.set_bytes_done(bytes_total_ - plan_.missing_bytes + bytes_fetched_);
  const uint32_t total = plan_.present + static_cast<uint32_t>(plan_.missing.size());
  progress.set_chunks_total(total);
  progress.set_chunks_done(plan_.present + chunks_fetched_);
  progress.set_chunks_present(plan_.present);
  progress.set_chunks_fetched(chunks_fetched_);
  progress.set_bytes_fetched(bytes_fetched_);
  for (const pb::PeerFault& fault : faults_) *progress.add_peer_faults() = fault;
  for (const pb::PeerFault& fallback : stream_fallbacks_) {
    *progress.add_stream_fallbacks() = fallback;
  }
  for (const Peer& peer : peers_)
    (*progress.mutable_bytes_by_peer())[peer.peer.address] = peer.bytes;
  return progress;
}

void Fetcher::Progress(bool force) {
  if (!context_.progress) return;
  absl::MutexLock progress_lock(&progress_mu_);
  const int64_t now = context_.clock->MonotonicMs();
  if (!force && progress_started_ && now - last_progress_ms_ < kProgressIntervalMs) return;
  progress_started_ = true;
  last_progress_ms_ = now;
  pb::ArtifactProgress progress;
  {
    absl::MutexLock lock(&mu_);
    progress = Snapshot();
  }
  // Under progress_mu_ only: callbacks are serialised and in order, the fetch goes on.
  context_.progress(progress);
}

std::string Fetcher::NoPeerLeftMessage() const {
  std::vector<std::string> reasons;
  for (const pb::PeerFault& fault : faults_) {
    reasons.push_back(
        absl::StrCat(fault.peer(), fault.corrupt() ? " (corrupt)" : "", ": ", fault.reason()));
  }
  return absl::StrCat("fetch of artifact ", Hex(request_.artifact_id), ": no peer left with ",
                      queue_.size(), " of ", plan_.present + plan_.missing.size(),
                      " chunks missing; dropped: ", absl::StrJoin(reasons, "; "));
}

absl::StatusOr<pb::ArtifactProgress> Fetcher::FetchChunks() {
  // Sizes of the missing chunks (for progress); the store checks them on arrival.
  absl::flat_hash_map<std::string_view, uint32_t> sizes;
  const pb::ManifestBody& body = plan_.manifest.body;
  for (const pb::ManifestFile& file : body.files()) {
    uint64_t left = file.size();
    for (const std::string& hash : file.chunks()) {
      const uint32_t size = static_cast<uint32_t>(std::min<uint64_t>(left, body.chunk_size()));
      left -= size;
      if (sizes.emplace(hash, size).second) bytes_total_ += size;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t k = 0; k < plan_.missing.size(); ++k) queue_.push_back(k);
  }

  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (peers_[i].dropped) continue;
      for (int s = 0; s < StreamsPerPeer(); ++s) {
        threads.emplace_back(&Fetcher::StreamLoopGuarded, this, i);
      }
    }
  }
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(this, &Fetcher::Finished),
                               absl::Milliseconds(kCancelPollMs))) {
        break;
      }
    }
    if (Cancelled()) {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      StopLocked();
    }
  }
  {
    // The stream threads leave when there is no more work for them.
    absl::MutexLock lock(&mu_);
    StopLocked();
  }
  for (std::thread& thread : threads) thread.join();

  absl::MutexLock lock(&mu_);
  if (!fatal_.ok()) return fatal_;
  if (cancelled_) {
    return absl::CancelledError(absl::StrCat(
        "fetch of artifact ", Hex(request_.artifact_id), " cancelled with ", queue_.size(), " of ",
        plan_.present + plan_.missing.size(), " chunks missing (resumable)"));
  }
  if (!queue_.empty()) return absl::UnavailableError(NoPeerLeftMessage());
  return Snapshot();
}

absl::StatusOr<pb::ArtifactProgress> Fetcher::Run() {
  TS_RETURN_IF_ERROR(Validate());
  peers_.reserve(request_.peers.size());
  for (const FetchPeer& peer : request_.peers) {
    Peer& p = peers_.emplace_back();
    p.peer = peer;
    p.channel = PeerChannel(peer);
    p.stub = pb::ArtifactTransfer::NewStub(p.channel);
    p.get_chunks = std::make_unique<grpc::internal::RpcMethod>(
        kGetChunksMethodName, grpc::internal::RpcMethod::SERVER_STREAMING, p.channel);
  }
  if (context_.progress) {
    pb::ArtifactProgress progress;
    progress.set_phase("manifest");
    context_.progress(progress);
  }
  TS_ASSIGN_OR_RETURN(VerifiedManifest manifest, FindManifest());
  // A manifest signed by a host outside the shard is refused however well-formed it is.
  TS_RETURN_IF_ERROR(context_.directory->CheckMember(request_.shard_id, manifest.body.publisher()));
  if (Cancelled()) {
    return absl::CancelledError(
        absl::StrCat("fetch of artifact ", Hex(request_.artifact_id), " cancelled"));
  }
  TS_ASSIGN_OR_RETURN(plan_, context_.store->BeginFetch(manifest));

  absl::StatusOr<pb::ArtifactProgress> result = FetchChunks();
  if (result.ok()) {
    absl::Status complete = context_.store->CompleteFetch(request_.artifact_id);
    if (!complete.ok()) result = complete;
  }
  if (!result.ok()) {
    // The incomplete row stays: the next fetch of this id resumes.
    context_.store->AbandonFetch(request_.artifact_id);
    return result;
  }
  Progress(/*force=*/true);
  result->set_phase("done");
  result->set_done(true);
  result->set_artifact_id(request_.artifact_id);
  return result;
}

}  // namespace transfer_internal

absl::StatusOr<pb::ArtifactProgress> FetchArtifact(const FetchContext& context,
                                                   const FetchRequest& request,
                                                   const FetcherOptions& options) {
  Fetcher fetcher(context, request, options);
  return fetcher.Run();
}

std::vector<PeerArtifacts> ListPeerArtifacts(const FetchContext& context, uint64_t shard_id,
                                             const std::vector<FetchPeer>& peers,
                                             int64_t deadline_ms) {
  std::vector<PeerArtifacts> out(peers.size());
  std::vector<std::thread> threads;
  threads.reserve(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    threads.emplace_back([&, i] {
      PeerArtifacts& answer = out[i];
      answer.address = peers[i].address;
      answer.artifacts = [&]() -> absl::StatusOr<std::vector<pb::ArtifactSummary>> {
        pb::ListArtifactsRequest request;
        request.set_shard_id(shard_id);
        TS_ASSIGN_OR_RETURN(
            *request.mutable_auth(),
            SignPeerRequest(*context.key, context.store->chain_id(), shard_id, kMethodListArtifacts,
                            peers[i].address, request, context.clock->NowUnixMs(),
                            kDefaultPeerRequestLifetimeMs));
        auto stub = pb::ArtifactTransfer::NewStub(PeerChannel(peers[i]));
        grpc::ClientContext call;
        call.set_deadline(
            DeadlineAfter(std::max<int64_t>(1, deadline_ms - context.clock->MonotonicMs())));
        pb::ListArtifactsResponse response;
        grpc::Status status = stub->ListArtifacts(&call, request, &response);
        if (!status.ok()) return FromGrpcStatus(status);
        if (static_cast<size_t>(response.artifacts_size()) > kMaxListedArtifacts) {
          return absl::OutOfRangeError(absl::StrCat(
              response.artifacts_size(), " artifacts listed, more than ", kMaxListedArtifacts));
        }
        std::vector<pb::ArtifactSummary> listed;
        for (pb::ArtifactSummary& a : *response.mutable_artifacts()) {
          // A peer's claims are only hints for what to fetch: the fetch verifies everything.
          if (a.complete() && a.artifact_id().size() == common::kSha256Size &&
              a.shard_id() == shard_id) {
            listed.push_back(std::move(a));
          }
        }
        return listed;
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

}  // namespace ts::sidecar
