#include "sidecar/artifacts/transfer.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <grpc/slice.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/method_handler.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/chunk_stream.h"
#include "sidecar/artifacts/chunk_wire.h"
#include "sidecar/peer/peer_tls.h"

namespace ts::sidecar {
namespace {

// Room for the protobuf framing around the largest chunk (or manifest) a peer may send.
constexpr int kReceiveSlackBytes = 64 << 10;
constexpr int kMaxChunkMessageBytes = static_cast<int>(kMaxChunkSize) + kReceiveSlackBytes;
constexpr int kMaxManifestMessageBytes = static_cast<int>(kMaxManifestBytes) + kReceiveSlackBytes;
// Bounds on what one fetch may start: its threads are peers × StreamsPerPeer().
constexpr size_t kMaxFetchPeers = 256;
constexpr int kMaxStreamsPerPeer = 16;
constexpr size_t kMaxFetchStreams = 512;
// Progress callbacks at most this often (a final one comes regardless).
constexpr int64_t kProgressIntervalMs = 100;
// How often the caller's thread polls FetchContext::cancelled.
constexpr int64_t kCancelPollMs = 20;
// Pause before retrying a peer whose call failed, per failure so far.
constexpr int64_t kRetryBackoffMs = 100;

std::string Hex(std::string_view bytes) { return common::HexEncode(bytes); }

absl::Status CheckArtifactId(std::string_view field, std::string_view id) {
  if (id.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(field), ": ", id.size(), " bytes, want ", common::kSha256Size));
  }
  return absl::OkStatus();
}

// Runs a handler body, mapping its status and any exception (the RPC edge catches) to gRPC.
template <typename Fn>
grpc::Status Serve(Fn&& fn) {
  try {
    return ToGrpcStatus(fn());
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("internal error: ", e.what()));
  }
}

std::string CallFailure(const absl::Status& status) {
  std::string name = absl::StatusCodeToString(status.code());
  std::transform(name.begin(), name.end(), name.begin(),
                 [](char c) { return c == '_' ? ' ' : static_cast<char>(std::tolower(c)); });
  return absl::StrCat(name, ": ", status.message());
}

size_t VarintBytes(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

// Bytes of a ChunkData's encoding before its data: hash (field 1, 32 bytes), then the data's
// tag and length (field 2).
size_t ChunkDataHeaderBytes(size_t data_size) {
  return 2 + common::kSha256Size + 1 + VarintBytes(data_size);
}

// Writes that header to out (ChunkDataHeaderBytes(data_size) bytes); returns its size. The same
// bytes protobuf writes for a ChunkData with hash and data set, so either side may be generated.
size_t EncodeChunkDataHeader(std::string_view hash, size_t data_size, char* out) {
  char* p = out;
  *p++ = static_cast<char>((1 << 3) | 2);
  *p++ = static_cast<char>(hash.size());
  std::memcpy(p, hash.data(), hash.size());
  p += hash.size();
  *p++ = static_cast<char>((2 << 3) | 2);
  uint64_t value = data_size;
  while (value >= 0x80) {
    *p++ = static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *p++ = static_cast<char>(value);
  return static_cast<size_t>(p - out);
}

std::chrono::system_clock::time_point DeadlineAfter(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ArtifactTransferService

absl::Status ArtifactTransferService::CheckReadable(ShardRole role, std::string_view kind,
                                                    std::string_view artifact_id) {
  if (role == ShardRole::kMember || kind == kReaderKind) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("artifact ", Hex(artifact_id), " is a ", common::AsAbsl(kind).substr(0, 32),
                   "; a reader of the shard may fetch checkpoints only"));
}

ArtifactTransferService::ArtifactTransferService(StoreRegistry* stores, ShardDirectory* directory,
                                                 PeerRequestVerifier* verifier,
                                                 TransferServiceOptions options)
    : stores_(stores), directory_(directory), verifier_(verifier), options_(options) {
  MarkMethodStreamed(
      kGetChunksMethodIndex,
      new grpc::internal::SplitServerStreamingHandler<pb::GetChunksRequest, grpc::ByteBuffer>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<pb::GetChunksRequest, grpc::ByteBuffer>* stream) {
            return GetChunksRaw(context, stream);
          }));
}

grpc::Status ArtifactTransferService::GetManifest(grpc::ServerContext* context,
                                                  const pb::GetManifestRequest* request,
                                                  pb::GetManifestResponse* response) {
  return Serve([&]() -> absl::Status {
    TS_ASSIGN_OR_RETURN(ShardRole role, Authorize(*request, kMethodGetManifest));
    TS_RETURN_IF_ERROR(CheckArtifactId("artifact_id", request->artifact_id()));
    TS_ASSIGN_OR_RETURN(ArtifactStore * store, stores_->StoreFor(request->shard_id()));
    TS_ASSIGN_OR_RETURN(VerifiedManifest manifest,
                        store->GetManifest(request->artifact_id(), /*complete_only=*/true));
    TS_RETURN_IF_ERROR(CheckReadable(role, manifest.body.kind(), request->artifact_id()));
    *response->mutable_manifest() = std::move(manifest.manifest);
    return absl::OkStatus();
  });
}

absl::StatusOr<ChunkServing> ArtifactTransferService::BeginChunks(
    const pb::GetChunksRequest& request, std::string_view method) {
  TS_ASSIGN_OR_RETURN(ShardRole role, Authorize(request, method));
  TS_RETURN_IF_ERROR(CheckArtifactId("artifact_id", request.artifact_id()));
  const size_t count = static_cast<size_t>(request.chunks_size());
  if (count == 0) return absl::InvalidArgumentError("chunks: empty");
  if (count > options_.max_chunks_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunks: ", count, " hashes, at most ", options_.max_chunks_per_request, " per request"));
  }
  absl::flat_hash_set<std::string_view> wanted;
  for (size_t i = 0; i < count; ++i) {
    const std::string& hash = request.chunks(static_cast<int>(i));
    if (hash.size() != common::kSha256Size) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks[", i, "]: ", hash.size(), " bytes, want ", common::kSha256Size));
    }
    wanted.insert(hash);
  }

  // The stream slot is taken only once the request is known to be worth serving, so
  // refused requests cannot crowd out members' transfers.
  if (streams_.fetch_add(1) >= options_.max_concurrent_streams) {
    streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "chunk requests: ", options_.max_concurrent_streams, " streams already running here"));
  }
  ChunkServing slot(/*store=*/nullptr, &streams_);  // given back on every early return

  TS_ASSIGN_OR_RETURN(ArtifactStore * store, stores_->StoreFor(request.shard_id()));
  TS_ASSIGN_OR_RETURN(VerifiedManifest manifest,
                      store->GetManifest(request.artifact_id(), /*complete_only=*/true));
  TS_RETURN_IF_ERROR(CheckReadable(role, manifest.body.kind(), request.artifact_id()));
  // One pass over the manifest against the (at most a few hundred) wanted hashes, rather than
  // a set of every chunk of a possibly large manifest per call.
  absl::flat_hash_set<std::string_view> named;
  for (const pb::ManifestFile& file : manifest.body.files()) {
    for (const std::string& hash : file.chunks()) {
      if (wanted.contains(hash)) named.insert(hash);
    }
    if (named.size() == wanted.size()) break;
  }
  for (size_t i = 0; i < count; ++i) {
    const std::string& hash = request.chunks(static_cast<int>(i));
    if (!named.contains(hash)) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "]: ", Hex(hash),
                                                     " is not named by the manifest of ",
                                                     Hex(request.artifact_id())));
    }
  }
  return ChunkServing(store, slot.Release());
}

grpc::Status ArtifactTransferService::ServeChunks(grpc::ServerContext* context,
                                                  const pb::GetChunksRequest& request_message,
                                                  const ChunkSender& send) {
  const pb::GetChunksRequest* request = &request_message;
  return Serve([&]() -> absl::Status {
    TS_ASSIGN_OR_RETURN(ChunkServing serving, BeginChunks(*request, kMethodGetChunks));
    ArtifactStore* store = serving.store();
    const size_t count = static_cast<size_t>(request->chunks_size());
    for (size_t i = 0; i < count; ++i) {
      if (context->IsCancelled()) return absl::CancelledError("GetChunks: cancelled by the peer");
      // The receiver hashes every chunk before storing it, so serving skips a second hash; a
      // chunk file modified on this disk shows up as this host being reported corrupt, and in
      // its own Verify.
      absl::Status sent = send(store, request->chunks(static_cast<int>(i)));
      if (absl::IsCancelled(sent)) {
        return absl::CancelledError(
            absl::StrCat("GetChunks: the peer went away after ", i, " of ", count, " chunks"));
      }
      TS_RETURN_IF_ERROR(sent);
    }
    return absl::OkStatus();
  });
}

grpc::Status ArtifactTransferService::GetChunks(grpc::ServerContext* context,
                                                const pb::GetChunksRequest* request,
                                                grpc::ServerWriter<pb::ChunkData>* writer) {
  pb::ChunkData message;
  return ServeChunks(
      context, *request, [&](ArtifactStore* store, const std::string& hash) -> absl::Status {
        // Read into the message's own buffer, which keeps its capacity.
        TS_RETURN_IF_ERROR(store->ReadChunk(hash, message.mutable_data()));
        message.set_hash(hash);
        if (!writer->Write(message)) return absl::CancelledError("write failed");
        ChunkServed(request->auth().signer(), kServedOverGrpc, message.data().size());
        return absl::OkStatus();
      });
}

grpc::Status ArtifactTransferService::GetChunksRaw(
    grpc::ServerContext* context,
    grpc::ServerSplitStreamer<pb::GetChunksRequest, grpc::ByteBuffer>* stream) {
  pb::GetChunksRequest request;
  if (!stream->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "GetChunks: no request");
  }
  return ServeChunks(context, request,
                     [&](ArtifactStore* store, const std::string& hash) -> absl::Status {
                       grpc_slice slice = grpc_empty_slice();
                       size_t chunk_bytes = 0;
                       absl::Status read = store->ReadChunkInto(hash, [&](size_t size) {
                         chunk_bytes = size;
                         slice = grpc_slice_malloc(ChunkDataHeaderBytes(size) + size);
                         char* begin = reinterpret_cast<char*>(GRPC_SLICE_START_PTR(slice));
                         return begin + EncodeChunkDataHeader(hash, size, begin);
                       });
                       // The message owns the slice from here, also on error.
                       grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
                       TS_RETURN_IF_ERROR(read);
                       grpc::ByteBuffer message(&owned, 1);
                       if (!stream->Write(message)) return absl::CancelledError("write failed");
                       ChunkServed(request.auth().signer(), kServedOverGrpc, chunk_bytes);
                       return absl::OkStatus();
                     });
}

grpc::Status ArtifactTransferService::ListArtifacts(grpc::ServerContext* context,
                                                    const pb::ListArtifactsRequest* request,
                                                    pb::ListArtifactsResponse* response) {
  return Serve([&]() -> absl::Status {
    TS_ASSIGN_OR_RETURN(ShardRole role, Authorize(*request, kMethodListArtifacts));
    TS_ASSIGN_OR_RETURN(ArtifactStore * store, stores_->StoreFor(request->shard_id()));
    TS_ASSIGN_OR_RETURN(std::vector<pb::ArtifactSummary> list,
                        store->List(/*include_incomplete=*/false));
    for (pb::ArtifactSummary& summary : list) {
      if (role == ShardRole::kReader && summary.kind() != kReaderKind) continue;
      *response->add_artifacts() = std::move(summary);
    }
    return absl::OkStatus();
  });
}

grpc::Status ArtifactTransferService::GetChunkStream(grpc::ServerContext* context,
                                                     const pb::GetChunkStreamRequest* request,
                                                     pb::GetChunkStreamResponse* response) {
  return Serve([&]() -> absl::Status {
    TS_RETURN_IF_ERROR(Authorize(*request, kMethodGetChunkStream).status());
    response->set_port(options_.chunk_stream_port);
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// FetchArtifact

namespace {

// The method name as a C string for grpc::internal::RpcMethod, which keeps the pointer.
constexpr char kGetChunksMethodName[] = "/gonka.trainshard.v1.ArtifactTransfer/GetChunks";
static_assert(std::string_view(kGetChunksMethodName) == kMethodGetChunks);
// Alignment of the chunk buffers: what the store needs to write them with O_DIRECT.
constexpr size_t kChunkBufferAlignBytes = 4096;
// HTTP/2 and socket settings of the fetcher's channels (see PeerChannel).
constexpr int kChannelFrameBytes = 1 << 20;
constexpr int kChannelLookaheadBytes = 8 << 20;
constexpr int kChannelReadChunkBytes = 256 << 10;

// One chunk's bytes as received, in a page-aligned buffer reused for every chunk of a stream,
// so receiving a chunk allocates nothing and the store can write it straight to the disk.
class ChunkBuffer {
 public:
  ChunkBuffer() = default;
  ~ChunkBuffer() { std::free(data_); }
  ChunkBuffer(const ChunkBuffer&) = delete;
  ChunkBuffer& operator=(const ChunkBuffer&) = delete;

  // Room for `capacity` bytes; RESOURCE_EXHAUSTED if the memory cannot be had.
  absl::Status Reserve(size_t capacity) {
    if (capacity <= capacity_) return absl::OkStatus();
    void* data = nullptr;
    const size_t rounded =
        (capacity + kChunkBufferAlignBytes - 1) / kChunkBufferAlignBytes * kChunkBufferAlignBytes;
    if (::posix_memalign(&data, kChunkBufferAlignBytes, rounded) != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("chunk buffer: ", rounded, " bytes"));
    }
    std::free(data_);
    data_ = static_cast<char*>(data);
    capacity_ = rounded;
    return absl::OkStatus();
  }
  char* data() { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

// Decodes a ChunkData answer from the received slices into the stream's buffer (chunk_wire.h).
absl::Status DecodeChunkAnswer(const grpc::ByteBuffer& message, std::string* hash,
                               ChunkBuffer* data, size_t* data_size) {
  std::vector<grpc::Slice> slices;
  if (!message.Dump(&slices).ok()) return absl::InvalidArgumentError("unreadable message");
  std::vector<std::string_view> pieces;
  pieces.reserve(slices.size());
  for (const grpc::Slice& slice : slices) {
    pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return DecodeChunkData(pieces, hash, data->data(), data->capacity(), data_size);
}

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

// A stream's two chunk buffers and its writer thread: the stream receives and verifies chunk
// k + 1 into one buffer while the writer stores chunk k durably from the other, so the disk's
// waits (fdatasync, the directory fsync) overlap the network and the hashing. Only verified
// chunks reach the writer; what is unverified is at most the one chunk being received.
class Fetcher::Pipeline {
 public:
  Pipeline(Fetcher* fetcher, size_t index)
      : fetcher_(fetcher), index_(index), thread_([this] { WriterLoop(); }) {}
  ~Pipeline() {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Pipeline::Idle));
      done_ = true;
    }
    thread_.join();
  }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  absl::Status Reserve(size_t capacity) {
    TS_RETURN_IF_ERROR(buffers_[0].Reserve(capacity));
    return buffers_[1].Reserve(capacity);
  }
  // Where the next chunk is received; never the buffer being written.
  ChunkBuffer* buffer() { return &buffers_[current_]; }

  // Hands the verified chunk in buffer() to the writer, once the previous one is written.
  void Submit(VerifiedChunk chunk) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Pipeline::Idle));
    job_.emplace(std::move(chunk));
    current_ = 1 - current_;
  }

 private:
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !job_.has_value(); }
  bool WorkOrDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return job_.has_value() || done_; }

  void WriterLoop() {
    while (true) {
      std::optional<VerifiedChunk> job;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Pipeline::WorkOrDone));
        if (!job_.has_value()) return;
        job.emplace(std::move(*job_));
      }
      absl::Status stored;
      try {
        stored = fetcher_->context_.store->PutVerifiedChunk(*job);
      } catch (const std::exception& e) {
        stored = absl::InternalError(absl::StrCat("storing a chunk: ", e.what()));
      }
      fetcher_->Stored(index_, job->size(), std::move(stored));
      absl::MutexLock lock(&mu_);
      job_.reset();
    }
  }

  Fetcher* const fetcher_;
  const size_t index_;
  ChunkBuffer buffers_[2];
  int current_ = 0;  // used by the stream's thread only
  mutable absl::Mutex mu_;
  std::optional<VerifiedChunk> job_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is set up
};

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

void Fetcher::StreamLoopGuarded(size_t index) {
  try {
    StreamLoop(index);
  } catch (const std::exception& e) {
    absl::MutexLock lock(&mu_);
    Fail(absl::InternalError(absl::StrCat("fetch stream to ", PeerName(index), ": ", e.what())));
  }
}

void Fetcher::StreamLoop(size_t index) {
  Peer& peer = peers_[index];
  const size_t per_call = static_cast<size_t>(options_.chunks_per_request);
  Pipeline pipeline(this, index);
  {
    absl::Status reserved = pipeline.Reserve(plan_.manifest.body.chunk_size());
    if (!reserved.ok()) {
      absl::MutexLock lock(&mu_);
      Fail(std::move(reserved));
      return;
    }
  }
  while (true) {
    std::vector<size_t> batch;
    {
      absl::MutexLock lock(&mu_);
      // Work to take, or a reason to leave. With the queue empty but chunks outstanding on
      // other calls, this thread waits: a failing call puts its chunks back.
      auto ready = [this, &peer]() {
        mu_.AssertHeld();
        return stop_ || peer.dropped || !queue_.empty() || outstanding_ == 0;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_ || peer.dropped || queue_.empty()) return;
      // A batch is a share of what is left, not a fixed size: with fixed batches one peer's
      // streams could claim a small artifact whole, and the fetch would end with one batch
      // on one peer while the others idle. Half of an even share per stream keeps every
      // stream busy and the tail short; chunks_per_request caps it.
      size_t active = 0;
      for (const Peer& p : peers_) {
        if (!p.dropped) active += static_cast<size_t>(StreamsPerPeer());
      }
      const size_t share = queue_.size() / (2 * std::max<size_t>(active, 1));
      const size_t take = std::clamp<size_t>(share, 1, per_call);
      while (!queue_.empty() && batch.size() < take) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      outstanding_ += batch.size();
    }
    Call(index, batch, &pipeline);
    absl::MutexLock lock(&mu_);
    if (peer.failures > 0 && !peer.dropped && !stop_) {
      // Interruptible pause before the retry, longer after each failure.
      auto woken = [this, &peer]() {
        mu_.AssertHeld();
        return stop_ || peer.dropped;
      };
      mu_.AwaitWithTimeout(absl::Condition(&woken),
                           absl::Milliseconds(kRetryBackoffMs * peer.failures));
    }
  }
}

void Fetcher::ResolveStream(size_t index) {
  Peer& peer = peers_[index];
  if (!options_.use_chunk_stream) return;
  // A peer pinned by its certificate is streamed from over TLS, which needs this host's own.
  if (!peer.peer.tls_cert_sha256.empty() && context_.tls == nullptr) return;
  pb::GetChunkStreamRequest request;
  request.set_shard_id(request_.shard_id);
  absl::StatusOr<pb::PeerRequestAuth> auth = SignPeerRequest(
      *context_.key, context_.store->chain_id(), request_.shard_id, kMethodGetChunkStream,
      peer.peer.address, request, context_.clock->NowUnixMs(), options_.request_lifetime_ms);
  if (!auth.ok()) return;  // the GetChunks path signs the same way and reports it
  *request.mutable_auth() = *std::move(auth);
  grpc::ClientContext call;
  call.set_deadline(DeadlineAfter(options_.manifest_deadline_ms));
  pb::GetChunkStreamResponse response;
  // Any failure (an older host answers UNIMPLEMENTED) leaves the peer on GetChunks, whose
  // calls then judge it.
  if (!peer.stub->GetChunkStream(&call, request, &response).ok()) return;
  if (response.port() == 0 || response.port() > 65535) return;
  std::string host = EndpointHost(peer.peer.endpoint);
  if (host.empty()) return;
  peer.stream_host = std::move(host);
  peer.stream_port = static_cast<uint16_t>(response.port());
}

bool Fetcher::Deliver(size_t index, const std::vector<size_t>& batch, std::string_view hash,
                      std::string_view data, Pipeline* pipeline, CallResult* result) {
  if (result->delivered == batch.size()) {
    result->corrupt = absl::StrCat("sent more than the ", batch.size(), " chunks asked for");
    return false;
  }
  const std::string& want = plan_.missing[batch[result->delivered]];
  if (hash != want) {
    result->corrupt = absl::StrCat("sent chunk ", Hex(hash), " where ", Hex(want),
                                   " was asked for (out of order or not requested)");
    return false;
  }
  absl::StatusOr<VerifiedChunk> verified =
      context_.store->VerifyChunk(request_.artifact_id, want, data);
  if (absl::IsDataLoss(verified.status()) || absl::IsInvalidArgument(verified.status())) {
    result->corrupt =
        absl::StrCat("chunk ", Hex(want), " failed verification: ", verified.status().message());
    return false;
  }
  if (!verified.ok()) {
    result->fatal = verified.status();
    return false;
  }
  ++result->delivered;
  pipeline->Submit(*std::move(verified));
  return true;
}

void Fetcher::Stored(size_t index, uint64_t size, absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      Fail(std::move(status));
      return;
    }
    Peer& peer = peers_[index];
    --outstanding_;
    ++chunks_fetched_;
    bytes_fetched_ += size;
    peer.bytes += size;
  }
  Progress(/*force=*/false);
}

void Fetcher::CallGrpc(size_t index, const pb::GetChunksRequest& request,
                       const std::vector<size_t>& batch, Pipeline* pipeline, CallResult* result) {
  Peer& peer = peers_[index];
  grpc::ClientContext call;
  call.set_deadline(DeadlineAfter(options_.chunks_deadline_ms));
  {
    absl::MutexLock lock(&mu_);
    if (stop_ || peer.dropped) return;
    peer.calls.push_back(&call);
  }
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          peer.channel.get(), *peer.get_chunks, &call, request));
  grpc::ByteBuffer message;
  std::string hash;
  size_t data_size = 0;
  while (reader->Read(&message)) {
    ChunkBuffer* buffer = pipeline->buffer();
    absl::Status decoded = DecodeChunkAnswer(message, &hash, buffer, &data_size);
    message.Clear();
    if (!decoded.ok()) {
      result->corrupt =
          result->delivered < batch.size()
              ? absl::StrCat("sent a malformed answer for chunk ",
                             Hex(plan_.missing[batch[result->delivered]]), ": ", decoded.message())
              : absl::StrCat("sent more than the ", batch.size(), " chunks asked for");
      break;
    }
    if (!Deliver(index, batch, hash, std::string_view(buffer->data(), data_size), pipeline,
                 result)) {
      break;
    }
  }
  if (!result->corrupt.empty() || !result->fatal.ok()) call.TryCancel();
  result->status = FromGrpcStatus(reader->Finish());
  absl::MutexLock lock(&mu_);
  peer.calls.erase(std::find(peer.calls.begin(), peer.calls.end(), &call));
}

void Fetcher::CallStream(size_t index, const pb::GetChunksRequest& request,
                         const std::vector<size_t>& batch, Pipeline* pipeline, CallResult* result) {
  Peer& peer = peers_[index];
  ChunkStreamCall call(context_.clock, context_.clock->MonotonicMs() + options_.chunks_deadline_ms);
  {
    absl::MutexLock lock(&mu_);
    if (stop_ || peer.dropped) return;
    peer.stream_calls.push_back(&call);
  }
  ChunkStreamTls tls;
  if (!peer.peer.tls_cert_sha256.empty()) tls = {context_.tls, peer.peer.tls_cert_sha256};
  result->status = call.Start(peer.stream_host, peer.stream_port, request, tls);
  while (result->status.ok()) {
    ChunkBuffer* buffer = pipeline->buffer();
    absl::StatusOr<ChunkStreamFrame> frame = call.Next(buffer->data(), buffer->capacity());
    if (!frame.ok()) {
      // A malformed frame is the peer's doing; a refusal (error frame) or a broken connection
      // is judged like a failed call.
      if (absl::IsInvalidArgument(frame.status()) &&
          absl::StartsWith(frame.status().message(), "chunk stream frame")) {
        result->corrupt =
            absl::StrCat("sent a malformed chunk stream frame: ", frame.status().message());
      } else {
        result->status = frame.status();
      }
      break;
    }
    if (frame->type == ChunkStreamFrameType::kEnd) {
      if (frame->index != result->delivered) {
        result->corrupt = absl::StrCat("ended its chunk stream claiming ", frame->index,
                                       " chunks sent after ", result->delivered);
      }
      break;
    }
    if (frame->index != result->delivered) {
      result->corrupt = absl::StrCat("sent chunk stream position ", frame->index, " where ",
                                     result->delivered, " was next");
      break;
    }
    if (!Deliver(index, batch, frame->hash, std::string_view(buffer->data(), frame->size), pipeline,
                 result)) {
      break;
    }
  }
  absl::MutexLock lock(&mu_);
  peer.stream_calls.erase(std::find(peer.stream_calls.begin(), peer.stream_calls.end(), &call));
}

absl::Status Fetcher::Sign(size_t index, std::string_view method,
                           pb::GetChunksRequest* request) const {
  request->clear_auth();
  TS_ASSIGN_OR_RETURN(*request->mutable_auth(),
                      SignPeerRequest(*context_.key, context_.store->chain_id(), request_.shard_id,
                                      method, peers_[index].peer.address, *request,
                                      context_.clock->NowUnixMs(), options_.request_lifetime_ms));
  return absl::OkStatus();
}

bool Fetcher::StreamRefused(size_t index, const CallResult& result) const {
  if (result.delivered > 0 || !result.corrupt.empty() || !result.fatal.ok() || result.status.ok() ||
      absl::IsDataLoss(result.status)) {
    return false;
  }
  absl::MutexLock lock(&mu_);
  return !stop_ && !peers_[index].dropped;
}

void Fetcher::FallBackToGrpc(size_t index, const absl::Status& why) {
  Peer& peer = peers_[index];
  {
    absl::MutexLock lock(&mu_);
    if (peer.stream_off) return;  // another stream of the peer got there first
    peer.stream_off = true;
    peer.stream_failure = CallFailure(why);
    pb::PeerFault& fallback = stream_fallbacks_.emplace_back();
    fallback.set_peer(peer.peer.address);
    fallback.set_reason(peer.stream_failure);
  }
  common::Log(common::LogLevel::kWarn, "fetch",
              "a peer's chunk stream failed; fetching its chunks over GetChunks",
              {{"artifact", Hex(request_.artifact_id)},
               {"peer", PeerName(index)},
               {"error", CallFailure(why)}});
  Progress(/*force=*/true);
}

void Fetcher::Call(size_t index, const std::vector<size_t>& batch, Pipeline* pipeline) {
  Peer& peer = peers_[index];
  std::call_once(*peer.stream_once, [this, index]() { ResolveStream(index); });
  bool stream = peer.stream_port != 0;
  if (stream) {
    absl::MutexLock lock(&mu_);
    stream = !peer.stream_off;
  }
  pb::GetChunksRequest request;
  request.set_shard_id(request_.shard_id);
  request.set_artifact_id(request_.artifact_id);
  for (size_t k : batch) request.add_chunks(plan_.missing[k]);

  CallResult result;
  if (absl::Status signed_request =
          Sign(index, stream ? kMethodChunkStream : kMethodGetChunks, &request);
      !signed_request.ok()) {
    result.fatal = std::move(signed_request);
  } else if (stream) {
    CallStream(index, request, batch, pipeline, &result);
    if (StreamRefused(index, result)) {
      // The peer's chunk stream would not serve (it refused the connection, reset it or
      // closed it: a host whose stream is full or attacked, or a middlebox): the same batch
      // from the same peer over GetChunks, which judges the peer from here on.
      FallBackToGrpc(index, result.status);
      result = CallResult();
      if (absl::Status signed_again = Sign(index, kMethodGetChunks, &request); !signed_again.ok()) {
        result.fatal = std::move(signed_again);
      } else {
        CallGrpc(index, request, batch, pipeline, &result);
      }
    }
  } else {
    CallGrpc(index, request, batch, pipeline, &result);
  }

  absl::MutexLock lock(&mu_);
  // Whatever was not stored goes back for any peer to take.
  const size_t delivered = result.delivered;
  for (size_t k = delivered; k < batch.size(); ++k) queue_.push_back(batch[k]);
  outstanding_ -= batch.size() - delivered;
  if (!result.fatal.ok()) {
    Fail(std::move(result.fatal));
  } else if (!result.corrupt.empty()) {
    Drop(index, std::move(result.corrupt), /*corrupt=*/true);
  } else if (stop_ || peer.dropped) {
    // Cancelled by this fetch; not the peer's failure.
  } else if (absl::IsDataLoss(result.status)) {
    Drop(index, CallFailure(result.status), /*corrupt=*/true);
  } else if (!result.status.ok() || delivered < batch.size()) {
    std::string reason = !result.status.ok() ? CallFailure(result.status)
                                             : absl::StrCat("stream ended after ", delivered,
                                                            " of ", batch.size(), " chunks");
    if (++peer.failures >= options_.max_call_failures_per_peer) {
      Drop(index, std::move(reason), /*corrupt=*/false);
    }
  } else {
    peer.failures = 0;
  }
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

}  // namespace

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
          if (a.complete() && a.artifact_id().size() == 32 && a.shard_id() == shard_id) {
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
