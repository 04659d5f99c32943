// Each stream of a fetch (transfer_internal.h): its batches from the shared queue, its GetChunks
// and chunk stream calls with the fallback from one to the other, each chunk verified on arrival
// and stored by the stream's writer thread.
#include "sidecar/artifacts/transfer_internal.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/chunk_stream.h"
#include "sidecar/artifacts/chunk_wire.h"

namespace ts::sidecar::transfer_internal {
namespace {

// Pause before retrying a peer whose call failed, per failure so far.
constexpr int64_t kRetryBackoffMs = 100;
// Alignment of the chunk buffers: what the store needs to write them with O_DIRECT.
constexpr size_t kChunkBufferAlignBytes = 4096;

std::string CallFailure(const absl::Status& status) {
  std::string name = absl::StatusCodeToString(status.code());
  std::transform(name.begin(), name.end(), name.begin(),
                 [](char c) { return c == '_' ? ' ' : static_cast<char>(std::tolower(c)); });
  return absl::StrCat(name, ": ", status.message());
}

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

}  // namespace

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

}  // namespace ts::sidecar::transfer_internal
