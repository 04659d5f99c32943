// The TCP transport's socket helpers (tcp_transport_internal.h).
#include "sidecar/collective/tcp_transport_internal.h"

namespace ts::sidecar::tcp_internal {

std::string_view Msg(const absl::Status& status) {
  return {status.message().data(), status.message().size()};
}

std::string Hex8(std::string_view id) { return absl::BytesToHexString(AsAbsl(id.substr(0, 4))); }

std::string ErrnoText(int err) {
  char buf[128];
  // GNU strerror_r: returns a pointer to the message (in buf or static).
  const char* text = strerror_r(err, buf, sizeof(buf));
  return absl::StrCat(text, " (errno ", err, ")");
}

ssize_t RecvOn(int fd, TlsWire* tls, char* buf, size_t size, uint64_t* wire_bytes) {
  if (tls != nullptr) return tls->Recv(fd, buf, size, wire_bytes);
  const ssize_t n = ::recv(fd, buf, size, 0);
  if (n > 0) *wire_bytes += static_cast<uint64_t>(n);
  return n;
}

std::string RecvErrorText(int err, const TlsWire* tls) {
  if (err == EPROTO && tls != nullptr && !tls->error().ok()) {
    return std::string(tls->error().message());
  }
  return ErrnoText(err);
}

std::string WireBytes(TlsWire* tls, std::string_view frame) {
  if (tls == nullptr) return std::string(frame);
  std::string out;
  if (!tls->Seal({frame}, &out).ok()) out.clear();
  return out;
}

Wait WaitFd(int fd, short events, int cancel_fd, int64_t timeout_ms) {
  pollfd fds[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
  const nfds_t n = cancel_fd >= 0 ? 2 : 1;
  const int timeout = static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, kSliceMs));
  int r;
  do {
    r = ::poll(fds, n, timeout);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return Wait::kTimeout;
  if (n == 2 && (fds[1].revents & POLLIN) != 0) return Wait::kCancelled;
  return Wait::kReady;
}

absl::Status SplitHostPort(std::string_view field, std::string_view endpoint, std::string* host,
                           std::string* port) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(field), ": '", absl::CHexEscape(AsAbsl(endpoint)), "' ", AsAbsl(why)));
  };
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos) return bad("is not host:port");
  std::string_view h = endpoint.substr(0, colon);
  const std::string_view p = endpoint.substr(colon + 1);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  uint32_t port_number = 0;
  if (h.empty()) return bad("has no host");
  if (!absl::SimpleAtoi(AsAbsl(p), &port_number) || port_number > 65535) {
    return bad("has no valid port");
  }
  *host = std::string(h);
  *port = std::string(p);
  return absl::OkStatus();
}

absl::StatusOr<SocketAddress> Resolve(std::string_view field, std::string_view endpoint) {
  std::string host;
  std::string port;
  TS_RETURN_IF_ERROR(SplitHostPort(field, endpoint, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::UnavailableError(absl::StrCat(AsAbsl(field), ": cannot resolve '",
                                               AsAbsl(endpoint), "': ", ::gai_strerror(rc)));
  }
  SocketAddress out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.size = result->ai_addrlen;
  ::freeaddrinfo(result);
  return out;
}

std::string PeerNameOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown";
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return absl::StrCat(host, ":", port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return absl::StrCat("[", host, "]:", port);
  }
  return "unknown";
}

void SetSocketOptions(int fd, int buffer_bytes) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

absl::Status WriteAll(int fd, std::string_view data, int64_t deadline_ms, int cancel_fd,
                      common::Clock* clock) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("send: ", ErrnoText(errno)));
    }
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("send: ", done, " of ", data.size(), " bytes by the deadline"));
    }
    if (WaitFd(fd, POLLOUT, cancel_fd, left) == Wait::kCancelled) {
      return absl::CancelledError("send: cancelled");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadExact(int fd, TlsWire* tls, char* out, size_t size, int64_t deadline_ms,
                       int cancel_fd, common::Clock* clock) {
  size_t done = 0;
  uint64_t wire_bytes = 0;
  while (done < size) {
    const ssize_t n = RecvOn(fd, tls, out + done, size - done, &wire_bytes);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("connection closed after ", done, " of ", size, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("recv: ", RecvErrorText(errno, tls)));
    }
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("recv: ", done, " of ", size, " bytes by the deadline"));
    }
    if (WaitFd(fd, POLLIN, cancel_fd, left) == Wait::kCancelled) {
      return absl::CancelledError("recv: cancelled");
    }
  }
  return absl::OkStatus();
}

std::string FrameBytes(FrameType type, std::string_view payload) {
  FrameHeader header;
  header.type = type;
  header.payload_size = static_cast<uint32_t>(payload.size());
  std::string out = EncodeFrameHeader(header);
  out.append(payload);
  return out;
}

}  // namespace ts::sidecar::tcp_internal
