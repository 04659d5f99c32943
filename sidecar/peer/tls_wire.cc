#include "sidecar/peer/tls_wire.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ts::sidecar {
namespace {

// Read off the socket per call: a few full records.
constexpr size_t kReadChunk = 64u << 10;

}  // namespace

ssize_t TlsWire::Recv(int fd, char* buf, size_t size, uint64_t* wire_bytes) {
  while (true) {
    if (plain_at_ < plain_.size()) {
      const size_t n = std::min(size, plain_.size() - plain_at_);
      std::memcpy(buf, plain_.data() + plain_at_, n);
      plain_at_ += n;
      if (plain_at_ == plain_.size()) {
        plain_.clear();
        plain_at_ = 0;
      }
      return static_cast<ssize_t>(n);
    }
    if (closed_) return 0;
    if (!error_.ok()) {
      errno = EPROTO;
      return -1;
    }
    const size_t have = in_.size();
    in_.resize(have + kReadChunk);
    const ssize_t n = ::recv(fd, in_.data() + have, kReadChunk, MSG_DONTWAIT);
    const int err = errno;
    in_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n <= 0) {
      errno = err;
      return n;  // the end, or recv's error
    }
    *wire_bytes += static_cast<uint64_t>(n);
    absl::StatusOr<size_t> used = layer_.opener.Open(in_, &plain_, &closed_);
    if (!used.ok()) {
      error_ = used.status();
      plain_.clear();
      errno = EPROTO;
      return -1;
    }
    in_.erase(0, *used);
  }
}

}  // namespace ts::sidecar
