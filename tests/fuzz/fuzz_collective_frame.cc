// Fuzzes what the collective reads from peers (sidecar/collective): frame headers, abort
// payloads, hellos and acks (parsed, verified against a fixed world and checked as the listener
// and dialer check them) and codec payloads. Input layout in collective_frame_input.h.
// Properties beyond "no crash, no out-of-bounds read": an accepted header re-encodes to the same
// bytes, an accepted abort re-encodes to the same payload, EncodeAbort's output always decodes,
// and a decoded codec payload has exactly EncodedSize bytes (zstd codecs: 1 to EncodedSize).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/collective/codec.h"
#include "sidecar/collective/frame.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/collective/transport.h"
#include "sidecar/peer/peer_auth.h"
#include "tests/fuzz/collective_frame_input.h"

namespace {

using ts::sidecar::FrameType;

void CheckAbort(std::string_view payload) {
  absl::StatusOr<ts::sidecar::AbortPayload> abort = ts::sidecar::DecodeAbort(payload);
  if (abort.ok()) {
    if (ts::sidecar::EncodeAbort(abort->blamed_address, abort->reason) != payload) std::abort();
  }
  // Whatever the caller passes, EncodeAbort's output decodes.
  const std::string_view address = payload.substr(0, payload.size() / 3);
  const std::string encoded = ts::sidecar::EncodeAbort(address, payload);
  if (encoded.size() > ts::sidecar::kMaxAbortPayload) std::abort();
  if (!ts::sidecar::DecodeAbort(encoded).ok()) std::abort();
}

// As the listener (member 1) checks a hello, or as the dialer (member 0) checks an ack.
void CheckHello(std::string_view payload, bool ack) {
  absl::StatusOr<ts::sidecar::pb::CollectiveHello> hello =
      ts::sidecar::ParseCollectiveHello(payload);
  if (!hello.ok()) return;
  const ts::sidecar::GroupSpec& group = ts::fuzz::CollectiveGroup();
  const size_t self = ack ? ts::fuzz::kCollectiveDialer : ts::fuzz::kCollectiveListener;
  ts::fuzz::FixedClock clock;
  ts::sidecar::PeerRequestVerifier verifier(group.members[self].address,
                                            std::string(ts::fuzz::kCollectiveChainId), &clock);
  absl::StatusOr<std::string> signer = verifier.AuthenticateRequest(
      *hello, ack ? ts::sidecar::kCollectiveHelloAckMethod : ts::sidecar::kCollectiveHelloMethod,
      hello->shard_id());
  if (!signer.ok()) return;
  if (ack) {
    // The dialer's checks: the member dialed signed it, for this mesh.
    (void)(*signer == group.members[ts::fuzz::kCollectiveListener].address &&
           hello->mesh_id() == ts::fuzz::CollectiveMeshId());
    return;
  }
  (void)ts::sidecar::CheckHelloMember(*hello, *signer, group, ts::fuzz::CollectiveMeshId(), self);
}

void CheckCodec(const ts::sidecar::CodecSpec& spec, size_t elements, std::string_view bytes) {
  if (!ts::sidecar::ValidateCodecSpec(spec).ok()) return;
  if (elements > ts::fuzz::kMaxCodecElements) return;
  std::vector<float> out(elements);
  const size_t size = ts::sidecar::EncodedSize(spec, elements);
  const bool size_ok = ts::sidecar::HasFixedSize(spec.kind)
                           ? bytes.size() == size
                           : !bytes.empty() && bytes.size() <= size;
  // The bytes as given (usually the wrong size: refused), and cut to the exact size.
  if (ts::sidecar::Decode(spec, bytes, out).ok() && !size_ok) std::abort();
  if (bytes.size() >= size) {
    const std::string_view exact = bytes.substr(0, size);
    (void)ts::sidecar::Decode(spec, exact, out);
    std::vector<float> sum(elements, 1.0f);
    (void)ts::sidecar::DecodeAdd(spec, exact, sum);
  }
}

void CheckFrame(std::string_view in) {
  if (in.size() < ts::sidecar::kFrameHeaderSize) {
    if (ts::sidecar::DecodeFrameHeader(in, ts::fuzz::kCollectiveMaxData).ok()) std::abort();
    return;
  }
  const std::string_view header_bytes = in.substr(0, ts::sidecar::kFrameHeaderSize);
  absl::StatusOr<ts::sidecar::FrameHeader> header =
      ts::sidecar::DecodeFrameHeader(header_bytes, ts::fuzz::kCollectiveMaxData);
  if (!header.ok()) return;
  if (ts::sidecar::EncodeFrameHeader(*header) != header_bytes) std::abort();
  const std::string_view payload =
      in.substr(ts::sidecar::kFrameHeaderSize).substr(0, header->payload_size);
  switch (header->type) {
    case FrameType::kHeartbeat:
    case FrameType::kClose:
      if (header->payload_size != 0) std::abort();
      break;
    case FrameType::kAbort:
      CheckAbort(payload);
      break;
    case FrameType::kHello:
    case FrameType::kHelloAck:
      CheckHello(payload, header->type == FrameType::kHelloAck);
      break;
    case FrameType::kData: {
      size_t elements = 0;
      const ts::sidecar::CodecSpec spec =
          ts::fuzz::CodecSpecOfFrame(header->step, header->chunk, &elements);
      CheckCodec(spec, elements, payload);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case ts::fuzz::kModeFrame:
      CheckFrame(in);
      break;
    case ts::fuzz::kModeAbort:
      CheckAbort(in);
      break;
    case ts::fuzz::kModeHello:
      CheckHello(in, /*ack=*/false);
      break;
    case ts::fuzz::kModeCodec: {
      const ts::fuzz::CodecInput c = ts::fuzz::ParseCodecInput(in);
      CheckCodec(c.spec, c.elements, c.bytes);
      break;
    }
  }
  return 0;
}
