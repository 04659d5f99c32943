#include "sidecar/collective/collective.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto/signing.h"
#include "common/protocol.h"
#include "common/status.h"

namespace ts::sidecar {
namespace {

constexpr std::string_view kCommitSignKind = protocol::kSignCollectiveCommit;
// commitment || recoverable signature || u64 (little-endian) payload size (sizes vary with
// int8-zstd; a size that is not the committed payload's shows as a mismatch with the commitment).
constexpr size_t kCommitBlockSize = 32 + 65 + 8;
// Robust allreduce runs two all-gathers under one op id; the second one's steps start here.
constexpr uint32_t kRevealStepBase = 1u << 16;

// [begin, end) of segment j when `count` items are cut into n segments.
struct Range {
  size_t begin = 0;
  size_t size = 0;
};

Range SegmentOf(size_t count, size_t n, size_t j) {
  size_t begin = count * j / n;
  size_t end = count * (j + 1) / n;
  return {begin, end - begin};
}

size_t ChunksOf(size_t size, size_t chunk) { return (size + chunk - 1) / chunk; }

Range ChunkOf(Range segment, size_t chunk, size_t c) {
  size_t begin = c * chunk;
  return {segment.begin + begin, std::min(chunk, segment.size - begin)};
}

// Elements per data frame: whole codec blocks, at least one block.
size_t ChunkElements(const OpOptions& options) {
  size_t chunk = std::max<size_t>(options.chunk_elements, 1);
  const CodecSpec& codec = options.codec;
  if (HasBlocks(codec.kind)) {
    size_t block = codec.block_elements;
    chunk = std::max(block, chunk / block * block);
  }
  return chunk;
}

// One outgoing frame: its payload is either owned or a view into the caller's buffer.
struct Outgoing {
  FrameHeader header;
  std::string owned;
  std::string_view view;
  bool use_view = false;
  // Where `owned` goes once sent (a received payload forwarded unchanged goes back to the
  // pool of the link it came from); the sender's own free list when null.
  Link* recycle_to = nullptr;
};

// Sends queued frames to one link on its own thread, so receiving, reducing and sending
// overlap. Buffers it has sent go to a free list the producer draws from. A link whose Send
// never blocks (an in-memory one) is sent to inline, on the producer's thread: nothing to
// overlap, and a simulation then sees every send on the thread it schedules.
class FrameSender {
 public:
  FrameSender(Link* link, int64_t deadline_ms)
      : link_(link), deadline_ms_(deadline_ms), inline_(link->SendNeverBlocks()) {
    if (!inline_) thread_ = std::thread([this] { Run(); });
  }
  ~FrameSender() { Finish().IgnoreError(); }

  void Push(Outgoing frame) {
    if (inline_) {
      {
        absl::MutexLock lock(&mu_);
        if (closing_) return;
      }
      Send(std::move(frame));
      return;
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(frame));
  }
  // A buffer of `size` bytes (contents unspecified), reusing one sent earlier where one is
  // free: frames of one operation have one size, so no new memory is touched.
  std::string TakeBuffer(size_t size) {
    std::string buffer;
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        buffer = std::move(free_.back());
        free_.pop_back();
      }
    }
    buffer.resize(size);
    return buffer;
  }
  // Stops after the queued frames are sent (or a send fails) and returns the first error.
  absl::Status Finish() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }
  uint64_t payload_bytes() const { return payload_bytes_; }
  uint64_t frames() const { return frames_; }

 private:
  void Run() {
    while (true) {
      Outgoing frame;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || closing_; };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;
        frame = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!Send(std::move(frame))) return;
    }
  }

  // Sends one frame; false after a failure (kept as the sender's status, the queue dropped).
  bool Send(Outgoing frame) {
    std::string_view payload = frame.use_view ? frame.view : std::string_view(frame.owned);
    absl::Status status = link_->Send(frame.header, payload, deadline_ms_);
    payload_bytes_ += payload.size();
    ++frames_;
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      status_ = status;
      queue_.clear();
      closing_ = true;
      return false;
    }
    if (frame.use_view) return true;
    if (frame.recycle_to != nullptr) {
      frame.recycle_to->Recycle(std::move(frame.owned));
    } else if (free_.size() < 8) {
      free_.push_back(std::move(frame.owned));
    }
    return true;
  }

  Link* const link_;
  const int64_t deadline_ms_;
  const bool inline_;
  absl::Mutex mu_;
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> free_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Written by the sending thread only (the sender thread, or the producer inline), read after
  // it is joined.
  uint64_t payload_bytes_ = 0;
  uint64_t frames_ = 0;
  std::thread thread_;
};

FrameHeader DataHeader(uint64_t op_id, uint32_t step, uint32_t chunk) {
  FrameHeader header;
  header.type = FrameType::kData;
  header.op_id = op_id;
  header.step = step;
  header.chunk = chunk;
  return header;
}

// The next frame from `link`, which must be (op_id, step, chunk) with a payload of exactly
// `payload_size` bytes — or, with `up_to`, of 1 to `payload_size` bytes (a variable-size codec).
absl::StatusOr<Frame> RecvExpected(Link* link, uint64_t op_id, uint32_t step, uint32_t chunk,
                                   size_t payload_size, int64_t deadline_ms, bool up_to = false) {
  TS_ASSIGN_OR_RETURN(Frame frame, link->Recv(deadline_ms));
  const FrameHeader& h = frame.header;
  const size_t got = frame.payload.size();
  const bool size_ok = up_to ? got >= 1 && got <= payload_size : got == payload_size;
  if (h.op_id != op_id || h.step != step || h.chunk != chunk || !size_ok) {
    return PeerFailure(
        absl::StatusCode::kInvalidArgument, link->peer(),
        absl::StrCat("unexpected data frame: op ", h.op_id, " step ", h.step, " chunk ", h.chunk,
                     " payload ", got, " bytes; expected op ", op_id, " step ", step, " chunk ",
                     chunk, " payload ", up_to ? "1 to " : "", payload_size, " bytes"));
  }
  return frame;
}

// A failure of this member's own making (bad input) blames itself, so the others learn why.
absl::Status SelfFailure(const Mesh& mesh, const absl::Status& status) {
  return PeerFailure(status.code(), mesh.group().members[mesh.self_index()].address,
                     std::string(status.message()));
}

// Ends an operation that failed: the first error wins; the mesh is aborted so every other
// member fails fast instead of waiting for its deadline.
absl::Status Fail(Mesh* mesh, absl::Status status) {
  if (FailedPeerOf(status).empty()) status = SelfFailure(*mesh, status);
  mesh->Abort(status);
  absl::Status failure = mesh->failure();
  return failure.ok() ? status : failure;
}

absl::Status CheckOp(const Mesh& mesh, const OpOptions& options) {
  TS_RETURN_IF_ERROR(ValidateCodecSpec(options.codec));
  if (mesh.group().members.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("group: needs at least 2 members, has ", mesh.group().members.size()));
  }
  return absl::OkStatus();
}

}  // namespace

Collective::Collective(Mesh* mesh, const common::PrivateKey* key, std::string chain_id,
                       common::Clock* clock)
    : mesh_(mesh), key_(key), chain_id_(std::move(chain_id)), clock_(clock) {}

absl::StatusOr<OpStats> Collective::AllReduce(const OpOptions& options, std::span<float> data) {
  const int64_t start_ms = clock_->MonotonicMs();
  if (absl::Status s = CheckOp(*mesh_, options); !s.ok()) return Fail(mesh_, s);
  const CodecSpec& codec = options.codec;
  const size_t n = mesh_->group().members.size();
  const size_t r = mesh_->self_index();
  OpStats stats;
  stats.elements = data.size();
  stats.raw_bytes = data.size() * sizeof(float);

  if (codec.kind == Compression::kTopK) {
    // Sparse contributions: gather them all, then sum in member order.
    std::string mine;
    if (absl::Status s = Encode(codec, data, &mine); !s.ok()) return Fail(mesh_, s);
    std::vector<char> all(mine.size() * n);
    TS_ASSIGN_OR_RETURN(OpStats gathered, AllGather(options, mine, all));
    std::fill(data.begin(), data.end(), 0.0f);
    for (size_t i = 0; i < n; ++i) {
      std::string_view bytes(all.data() + i * mine.size(), mine.size());
      if (absl::Status s = DecodeAdd(codec, bytes, data); !s.ok()) {
        return Fail(mesh_, PeerFailure(s.code(), mesh_->group().members[i].address,
                                       absl::StrCat("contribution: ", s.message())));
      }
    }
    if (options.reduce == ReduceOp::kMean) {
      const float count = static_cast<float>(n);
      for (float& x : data) x = x / count;
    }
    gathered.elements = stats.elements;
    gathered.raw_bytes = stats.raw_bytes;
    gathered.seconds = (clock_->MonotonicMs() - start_ms) / 1000.0;
    return gathered;
  }

  // Dense codecs: pipelined ring, reduce-scatter then all-gather (see the header).
  Link* next = mesh_->link((r + 1) % n);
  Link* prev = mesh_->link((r + n - 1) % n);
  const size_t chunk = ChunkElements(options);
  const bool lossy = !IsLossless(codec.kind);
  const float count = static_cast<float>(n);
  const uint32_t steps = static_cast<uint32_t>(2 * (n - 1));
  auto segment_sent_at = [&](uint32_t g) {
    return g < n - 1 ? (r + n - g) % n : (r + 1 + n - (g - (n - 1))) % n;
  };
  auto segment_received_at = [&](uint32_t g) {
    return g < n - 1 ? (r + 2 * n - g - 1) % n : (r + n - (g - (n - 1))) % n;
  };

  FrameSender sender(next, options.deadline_ms);
  // A frame's payload for `values`. fp32 goes on the wire as it is, read by the sender from
  // `data` itself: that region is not written again before the frame has reached the next
  // member (its final value comes back around the ring only after that). Other codecs encode
  // into a reused buffer.
  auto fill = [&](std::span<const float> values, Outgoing* out) -> absl::Status {
    if (codec.kind == Compression::kFp32) {
      TS_RETURN_IF_ERROR(CheckFinite(values));
      out->use_view = true;
      out->view = std::string_view(reinterpret_cast<const char*>(values.data()),
                                   values.size() * sizeof(float));
      return absl::OkStatus();
    }
    out->owned = sender.TakeBuffer(EncodedSize(codec, values.size()));
    TS_ASSIGN_OR_RETURN(
        size_t written,
        EncodeInto(codec, values, std::span<char>(out->owned.data(), out->owned.size())));
    out->owned.resize(written);
    return absl::OkStatus();
  };
  // Step 0: this member's own part of segment r.
  {
    Range segment = SegmentOf(data.size(), n, segment_sent_at(0));
    for (size_t c = 0; c < ChunksOf(segment.size, chunk); ++c) {
      Range part = ChunkOf(segment, chunk, c);
      Outgoing out;
      out.header = DataHeader(options.op_id, 0, static_cast<uint32_t>(c));
      if (absl::Status s = fill(data.subspan(part.begin, part.size), &out); !s.ok()) {
        absl::Status failure = Fail(mesh_, s);
        sender.Finish().IgnoreError();
        return failure;
      }
      sender.Push(std::move(out));
    }
  }
  absl::Status status;
  for (uint32_t g = 0; g < steps && status.ok(); ++g) {
    const bool reduce_scatter = g < n - 1;
    Range segment = SegmentOf(data.size(), n, segment_received_at(g));
    for (size_t c = 0; c < ChunksOf(segment.size, chunk) && status.ok(); ++c) {
      Range part = ChunkOf(segment, chunk, c);
      std::span<float> values = data.subspan(part.begin, part.size);
      absl::StatusOr<Frame> frame = RecvExpected(prev, options.op_id, g, static_cast<uint32_t>(c),
                                                 EncodedSize(codec, part.size), options.deadline_ms,
                                                 /*up_to=*/!HasFixedSize(codec.kind));
      if (!frame.ok()) {
        status = frame.status();
        break;
      }
      stats.payload_bytes_received += frame->payload.size();
      absl::Status decoded = reduce_scatter ? DecodeAdd(codec, frame->payload, values)
                                            : Decode(codec, frame->payload, values);
      if (!decoded.ok()) {
        status =
            PeerFailure(decoded.code(), prev->peer(),
                        absl::StrCat("data frame step ", g, " chunk ", c, ": ", decoded.message()));
        break;
      }
      if (g + 1 == steps) {  // the last step: nothing to pass on
        prev->Recycle(std::move(frame->payload));
        continue;
      }
      Outgoing out;
      out.header = DataHeader(options.op_id, g + 1, static_cast<uint32_t>(c));
      if (!reduce_scatter) {
        out.owned = std::move(frame->payload);  // forward the owner's bytes unchanged
        out.recycle_to = prev;
      } else {
        prev->Recycle(std::move(frame->payload));
        const bool owner = g + 2 == n;  // the segment is now complete here
        if (owner && options.reduce == ReduceOp::kMean) {
          for (float& x : values) x = x / count;
        }
        status = fill(values, &out);
        if (!status.ok()) break;
        // The owner keeps what the others will decode, so every member ends with the same
        // bits.
        if (owner && lossy) status = Decode(codec, out.owned, values);
        if (!status.ok()) break;
      }
      sender.Push(std::move(out));
    }
  }
  if (!status.ok()) {
    absl::Status failure = Fail(mesh_, status);
    sender.Finish().IgnoreError();
    return failure;
  }
  if (absl::Status s = sender.Finish(); !s.ok()) return Fail(mesh_, s);
  stats.payload_bytes_sent = sender.payload_bytes();
  stats.wire_bytes_sent = sender.payload_bytes() + sender.frames() * kFrameHeaderSize;
  stats.seconds = (clock_->MonotonicMs() - start_ms) / 1000.0;
  return stats;
}

absl::StatusOr<OpStats> Collective::AllReduceBf16(const OpOptions& options,
                                                  std::span<uint16_t> data) {
  std::vector<float> values(data.size());
  for (size_t i = 0; i < data.size(); ++i) values[i] = Bf16ToFloat(data[i]);
  OpOptions wire = options;
  if (wire.codec.kind == Compression::kFp32) wire.codec.kind = Compression::kBf16;
  TS_ASSIGN_OR_RETURN(OpStats stats, AllReduce(wire, std::span<float>(values)));
  for (size_t i = 0; i < data.size(); ++i) data[i] = FloatToBf16(values[i]);
  stats.raw_bytes = data.size() * sizeof(uint16_t);
  return stats;
}

namespace {

// Ring all-gather of equal blocks of `block` bytes: out[i·block ..) ← member i's block, which
// for this member is already in place. Steps are numbered from `step_base`.
absl::Status GatherRing(Mesh* mesh, uint64_t op_id, uint32_t step_base, size_t block,
                        size_t chunk_bytes, int64_t deadline_ms, std::span<char> out,
                        OpStats* stats) {
  const size_t n = mesh->group().members.size();
  const size_t r = mesh->self_index();
  Link* next = mesh->link((r + 1) % n);
  Link* prev = mesh->link((r + n - 1) % n);
  FrameSender sender(next, deadline_ms);
  auto push_view = [&](uint32_t step, size_t c, size_t member) {
    Range whole{member * block, block};
    Range part = ChunkOf(whole, chunk_bytes, c);
    Outgoing frame;
    frame.header = DataHeader(op_id, step_base + step, static_cast<uint32_t>(c));
    frame.view = std::string_view(out.data() + part.begin, part.size);
    frame.use_view = true;
    sender.Push(std::move(frame));
  };
  const size_t chunks = ChunksOf(block, chunk_bytes);
  for (size_t c = 0; c < chunks; ++c) push_view(0, c, r);
  absl::Status status;
  for (uint32_t s = 0; s + 1 < n && status.ok(); ++s) {
    const size_t member = (r + 2 * n - s - 1) % n;
    for (size_t c = 0; c < chunks; ++c) {
      Range part = ChunkOf(Range{member * block, block}, chunk_bytes, c);
      absl::StatusOr<Frame> frame = RecvExpected(prev, op_id, step_base + s,
                                                 static_cast<uint32_t>(c), part.size, deadline_ms);
      if (!frame.ok()) {
        status = frame.status();
        break;
      }
      stats->payload_bytes_received += frame->payload.size();
      std::memcpy(out.data() + part.begin, frame->payload.data(), part.size);
      prev->Recycle(std::move(frame->payload));
      if (s + 2 < n) push_view(s + 1, c, member);
    }
  }
  if (!status.ok()) {
    absl::Status failure = Fail(mesh, status);
    sender.Finish().IgnoreError();
    return failure;
  }
  if (absl::Status s = sender.Finish(); !s.ok()) return Fail(mesh, s);
  stats->payload_bytes_sent += sender.payload_bytes();
  stats->wire_bytes_sent += sender.payload_bytes() + sender.frames() * kFrameHeaderSize;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpStats> Collective::AllGather(const OpOptions& options, std::span<const char> mine,
                                              std::span<char> out) {
  const int64_t start_ms = clock_->MonotonicMs();
  const size_t n = mesh_->group().members.size();
  const size_t r = mesh_->self_index();
  if (out.size() != n * mine.size()) {
    return Fail(mesh_, absl::InvalidArgumentError(absl::StrCat(
                           "all-gather: output holds ", out.size(), " bytes, expected ", n,
                           " members × ", mine.size(), " bytes")));
  }
  if (!mine.empty()) std::memcpy(out.data() + r * mine.size(), mine.data(), mine.size());
  OpStats stats;
  stats.raw_bytes = mine.size();
  const size_t chunk_bytes = std::max<size_t>(options.chunk_elements, 1) * sizeof(float);
  TS_RETURN_IF_ERROR(GatherRing(mesh_, options.op_id, /*step_base=*/0, mine.size(), chunk_bytes,
                                options.deadline_ms, out, &stats));
  stats.seconds = (clock_->MonotonicMs() - start_ms) / 1000.0;
  return stats;
}

absl::StatusOr<uint64_t> Collective::MinimumOf(const OpOptions& options, uint64_t value) {
  const size_t n = mesh_->group().members.size();
  char mine[sizeof(uint64_t)];
  PutU64(mine, value);
  std::string all(n * sizeof(uint64_t), '\0');
  TS_RETURN_IF_ERROR(AllGather(options, std::span<const char>(mine, sizeof(mine)),
                               std::span<char>(all.data(), all.size()))
                         .status());
  uint64_t least = value;
  for (size_t i = 0; i < n; ++i) least = std::min(least, GetU64(all.data() + i * sizeof(uint64_t)));
  return least;
}

absl::StatusOr<OpStats> Collective::RobustAllReduce(const OpOptions& options,
                                                    const AggregateSpec& aggregate,
                                                    std::span<float> data,
                                                    std::vector<std::string>* commitments) {
  const int64_t start_ms = clock_->MonotonicMs();
  if (absl::Status s = CheckOp(*mesh_, options); !s.ok()) return Fail(mesh_, s);
  const GroupSpec& group = mesh_->group();
  const size_t n = group.members.size();
  const size_t r = mesh_->self_index();
  const CodecSpec& codec = options.codec;
  OpStats stats;
  stats.elements = data.size();
  stats.raw_bytes = data.size() * sizeof(float);

  // 1. Commit: every member's signed commitment is known before any contribution is sent.
  std::string payload;
  if (absl::Status s = Encode(codec, data, &payload); !s.ok()) return Fail(mesh_, s);
  const std::string commitment = CommitmentOf(options.op_id, static_cast<uint32_t>(r), payload);
  absl::StatusOr<std::string> signature =
      common::SignStatement(*key_, kCommitSignKind, chain_id_, group.shard_id, commitment);
  if (!signature.ok()) return Fail(mesh_, signature.status());
  char size_bytes[8];
  PutU64(size_bytes, payload.size());
  std::string commit_block = commitment + *signature + std::string(size_bytes, 8);
  std::vector<char> commits(n * kCommitBlockSize);
  std::memcpy(commits.data() + r * kCommitBlockSize, commit_block.data(), kCommitBlockSize);
  const size_t chunk_bytes = ChunkElements(options) * sizeof(float);
  TS_RETURN_IF_ERROR(GatherRing(mesh_, options.op_id, /*step_base=*/0, kCommitBlockSize,
                                chunk_bytes, options.deadline_ms, commits, &stats));
  for (size_t i = 0; i < n; ++i) {
    std::string_view block(commits.data() + i * kCommitBlockSize, kCommitBlockSize);
    absl::StatusOr<std::string> signer = common::RecoverStatementSigner(
        kCommitSignKind, chain_id_, group.shard_id, block.substr(0, 32), block.substr(32, 65));
    if (!signer.ok() || *signer != group.members[i].address) {
      return Fail(mesh_,
                  PeerFailure(absl::StatusCode::kUnauthenticated, group.members[i].address,
                              absl::StrCat("commitment of member ", i, " is not signed by its key",
                                           signer.ok() ? absl::StrCat(" (signed by ", *signer, ")")
                                                       : std::string())));
    }
  }
  // The contributions' sizes: each within the codec's bounds (exactly its size for a fixed-size
  // codec); all are gathered in blocks of the largest, zero-padded.
  const size_t bound = EncodedSize(codec, data.size());
  std::vector<size_t> sizes(n);
  size_t block = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t size = GetU64(commits.data() + i * kCommitBlockSize + 32 + 65);
    if (!IsEncodedSize(codec, data.size(), size)) {
      return Fail(mesh_,
                  PeerFailure(absl::StatusCode::kInvalidArgument, group.members[i].address,
                              absl::StrCat("contribution of member ", i, " announced as ", size,
                                           " bytes; the codec's is ",
                                           HasFixedSize(codec.kind) ? "" : "at most ", bound)));
    }
    sizes[i] = static_cast<size_t>(size);
    block = std::max(block, sizes[i]);
  }

  // 2. Reveal: gather the contributions and hold each to its commitment.
  std::vector<char> all(n * block, '\0');
  std::memcpy(all.data() + r * block, payload.data(), payload.size());
  TS_RETURN_IF_ERROR(GatherRing(mesh_, options.op_id, kRevealStepBase, block, chunk_bytes,
                                options.deadline_ms, all, &stats));
  std::vector<std::vector<float>> decoded(n, std::vector<float>(data.size()));
  std::vector<std::span<const float>> views;
  for (size_t i = 0; i < n; ++i) {
    std::string_view bytes(all.data() + i * block, sizes[i]);
    std::string_view committed(commits.data() + i * kCommitBlockSize, 32);
    if (CommitmentOf(options.op_id, static_cast<uint32_t>(i), bytes) != committed) {
      return Fail(mesh_, PeerFailure(absl::StatusCode::kDataLoss, group.members[i].address,
                                     absl::StrCat("contribution of member ", i,
                                                  " does not match its commitment")));
    }
    if (absl::Status s = Decode(codec, bytes, decoded[i]); !s.ok()) {
      return Fail(mesh_, PeerFailure(s.code(), group.members[i].address,
                                     absl::StrCat("contribution: ", s.message())));
    }
    views.emplace_back(decoded[i]);
  }

  // 3. Aggregate in member order: the same bits on every member.
  if (absl::Status s = Aggregate(aggregate, views, data); !s.ok()) return Fail(mesh_, s);
  if (options.reduce == ReduceOp::kSum) {
    const float count = static_cast<float>(n);
    for (float& x : data) x = x * count;
  }
  if (commitments != nullptr) {
    commitments->clear();
    for (size_t i = 0; i < n; ++i) {
      commitments->emplace_back(commits.data() + i * kCommitBlockSize, 32);
    }
  }
  stats.seconds = (clock_->MonotonicMs() - start_ms) / 1000.0;
  return stats;
}

absl::StatusOr<std::vector<size_t>> Collective::MeasureRingOrder(
    const OpOptions& options, size_t probe_bytes, std::vector<std::vector<double>>* rates) {
  const size_t n = mesh_->group().members.size();
  const size_t r = mesh_->self_index();
  const size_t chunk_bytes = std::max<size_t>(options.chunk_elements, 1) * sizeof(float);
  const std::string zeros(std::min(chunk_bytes, std::max<size_t>(probe_bytes, 1)), '\0');
  std::vector<double> row(n, 0.0);  // row[i]: bytes/s from member i to this member
  OpStats stats;
  for (uint32_t t = 1; t < n; ++t) {
    Link* to = mesh_->link((r + t) % n);
    Link* from = mesh_->link((r + n - t) % n);
    FrameSender sender(to, options.deadline_ms);
    // A one-byte start frame, then the probe in chunks: the receiver times from the start
    // frame's arrival to the probe's last byte.
    const size_t chunks = 1 + ChunksOf(probe_bytes, zeros.size());
    for (size_t c = 0; c < chunks; ++c) {
      Outgoing frame;
      frame.header = DataHeader(options.op_id, t, static_cast<uint32_t>(c));
      size_t size = c == 0 ? 1 : std::min(zeros.size(), probe_bytes - (c - 1) * zeros.size());
      frame.view = std::string_view(zeros.data(), size);
      frame.use_view = true;
      sender.Push(std::move(frame));
    }
    int64_t start_ms = 0;
    absl::Status status;
    for (size_t c = 0; c < chunks; ++c) {
      size_t size = c == 0 ? 1 : std::min(zeros.size(), probe_bytes - (c - 1) * zeros.size());
      absl::StatusOr<Frame> frame =
          RecvExpected(from, options.op_id, t, static_cast<uint32_t>(c), size, options.deadline_ms);
      if (!frame.ok()) {
        status = frame.status();
        break;
      }
      if (c == 0) start_ms = clock_->MonotonicMs();
      from->Recycle(std::move(frame->payload));
    }
    if (!status.ok()) {
      absl::Status failure = Fail(mesh_, status);
      sender.Finish().IgnoreError();
      return failure;
    }
    if (absl::Status s = sender.Finish(); !s.ok()) return Fail(mesh_, s);
    // Millisecond clock: a probe faster than 1 ms counts as taking 1 ms.
    double seconds = std::max<int64_t>(clock_->MonotonicMs() - start_ms, 1) / 1000.0;
    row[(r + n - t) % n] = static_cast<double>(probe_bytes) / seconds;
  }
  std::vector<char> all(n * n * sizeof(double));
  std::memcpy(all.data() + r * n * sizeof(double), row.data(), n * sizeof(double));
  TS_RETURN_IF_ERROR(GatherRing(mesh_, options.op_id, kRevealStepBase, n * sizeof(double),
                                chunk_bytes, options.deadline_ms, all, &stats));
  // all holds, per receiver j, the rates from every i: transpose into rates[i][j].
  std::vector<std::vector<double>> matrix(n, std::vector<double>(n, 0.0));
  for (size_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, all.data() + (j * n + i) * sizeof(double), sizeof(double));
      if (!std::isfinite(v) || v < 0) {
        return Fail(
            mesh_,
            PeerFailure(absl::StatusCode::kInvalidArgument, mesh_->group().members[j].address,
                        absl::StrCat("measured rate from member ", i, ": ", v, " is not a rate")));
      }
      matrix[i][j] = v;
    }
  }
  absl::StatusOr<std::vector<size_t>> order = ChooseRingOrder(matrix);
  if (!order.ok()) return Fail(mesh_, order.status());
  if (rates != nullptr) *rates = std::move(matrix);
  return order;
}

}  // namespace ts::sidecar
