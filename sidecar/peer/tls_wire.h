// The TLS side of one raw TCP connection between hosts — a collective link, a chunk stream
// (docs/threat-model.md, "TLS between hosts"): after the handshake
// (common/crypto/tls_session.h) every byte the owner writes is sealed into TLS 1.3 records and
// every byte it reads comes out of opened ones. The owner keeps its own socket code: Recv has
// recv(2)'s contract, and the bytes to send are sealed first, then written by the same loops as
// in the clear. The sender and the receiver hold separate states, so a reader thread and a
// sender need no lock between them.
//
// Thread-safety: Recv is one thread's at a time, Seal another's.
#ifndef TS_SIDECAR_PEER_TLS_WIRE_H_
#define TS_SIDECAR_PEER_TLS_WIRE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/crypto/tls_session.h"

namespace ts::sidecar {

class TlsWire {
 public:
  explicit TlsWire(common::TlsRecordLayer layer) : layer_(std::move(layer)) {}

  // recv(2) on `fd` through the records: > 0 plaintext bytes, 0 at the peer's end of stream
  // (its FIN or close_notify; a record cut off by the FIN reads as the end too), -1 with errno
  // (EAGAIN when no whole record has arrived; EPROTO when a record fails, error() says why).
  // *wire_bytes grows by what was read off the socket.
  ssize_t Recv(int fd, char* buf, size_t size, uint64_t* wire_bytes);
  // Why the last Recv returned EPROTO.
  const absl::Status& error() const { return error_; }

  // The records for `parts`, appended to *out. Each call's records must all reach the peer,
  // in order (see TlsSealer::Seal).
  absl::Status Seal(std::initializer_list<std::string_view> parts, std::string* out) {
    return layer_.sealer.Seal(parts, out);
  }

 private:
  common::TlsRecordLayer layer_;
  std::string in_;     // read off the socket, not yet a whole record
  std::string plain_;  // opened, not yet returned
  size_t plain_at_ = 0;
  bool closed_ = false;
  absl::Status error_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_PEER_TLS_WIRE_H_
