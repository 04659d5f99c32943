// Frames of the collective's wire protocol: a fixed 32-byte header and a payload whose size the
// header states and the receiver caps before reading it. The layout is in docs/collective.md
// ("Frames"). Everything here parses bytes from peers: malformed input is refused with
// INVALID_ARGUMENT naming the field and value (or RESOURCE_EXHAUSTED for a size over its cap),
// never read out of bounds.
//
// Header (little-endian):
//   u32 magic "TSCF" (0x46435354)   u8 version (1)   u8 type   u16 flags (0)
//   u64 op_id   u32 step   u32 chunk   u32 payload_size   u32 reserved (0)
//
// Thread-safety: pure functions.
#ifndef TS_SIDECAR_COLLECTIVE_FRAME_H_
#define TS_SIDECAR_COLLECTIVE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::sidecar {

inline constexpr uint32_t kFrameMagic = 0x46435354;  // "TSCF" as bytes 54 53 43 46
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderSize = 32;

enum class FrameType : uint8_t {
  kHello = 1,      // dialer -> listener: serialized CollectiveHello (signed)
  kHelloAck = 2,   // listener -> dialer: serialized CollectiveHello (signed, bound to the dialer's)
  kHeartbeat = 3,  // either way, empty payload; sent when a link is otherwise idle
  kData = 4,       // an operation's bytes: op_id, step and chunk say which
  kAbort = 5,      // the sender gives up on op_id; payload: EncodeAbort (blamed member, reason)
  kClose = 6,      // orderly end of the link, empty payload
};

inline constexpr uint32_t kMaxHelloPayload = 4096;
inline constexpr uint32_t kMaxAbortPayload = 1024;

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint16_t flags = 0;
  uint64_t op_id = 0;
  uint32_t step = 0;
  uint32_t chunk = 0;
  uint32_t payload_size = 0;
};

// Writes the 32 header bytes to out[0..32).
void EncodeFrameHeader(const FrameHeader& header, char* out);
std::string EncodeFrameHeader(const FrameHeader& header);

// Parses exactly kFrameHeaderSize bytes. INVALID_ARGUMENT: wrong length, bad magic, version
// other than 1, unknown type, non-zero flags or reserved, a payload on a heartbeat or close.
// RESOURCE_EXHAUSTED: payload_size over its cap — max_data_payload for kData, kMaxHelloPayload
// for hello and ack, kMaxAbortPayload for abort.
absl::StatusOr<FrameHeader> DecodeFrameHeader(std::string_view bytes, uint32_t max_data_payload);

// An abort's payload: the address of the member the sender blames (may be empty) and a reason.
// Layout: u8 address length, address bytes, reason bytes (UTF-8). Both end up in logs and
// statuses, so DecodeAbort refuses (INVALID_ARGUMENT) a payload over kMaxAbortPayload, an
// address length past the end, an address that is not [a-z0-9] only, and a reason with
// control characters or invalid UTF-8.
struct AbortPayload {
  std::string blamed_address;
  std::string reason;
};
std::string EncodeAbort(std::string_view blamed_address, std::string_view reason);
absl::StatusOr<AbortPayload> DecodeAbort(std::string_view payload);

// The wire's little-endian u64 (frame headers, and small values the operations gather).
void PutU64(char* out, uint64_t v);
uint64_t GetU64(const char* in);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_FRAME_H_
