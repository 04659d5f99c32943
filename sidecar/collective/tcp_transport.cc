#include "sidecar/collective/tcp_transport.h"

#include "sidecar/collective/tcp_transport_internal.h"

namespace ts::sidecar {

using tcp_internal::AsAbsl;
using tcp_internal::Conn;
using tcp_internal::ErrnoText;
using tcp_internal::EventFd;
using tcp_internal::FrameBytes;
using tcp_internal::Hello;
using tcp_internal::Hex8;
using tcp_internal::kDialBackoffFirstMs;
using tcp_internal::kDialBackoffMaxMs;
using tcp_internal::kHelloLifetimeMs;
using tcp_internal::kLogComponent;
using tcp_internal::kMaxRefusals;
using tcp_internal::kReplyDeadlineMs;
using tcp_internal::LinkImpl;
using tcp_internal::MeshImpl;
using tcp_internal::Msg;
using tcp_internal::PeerNameOf;
using tcp_internal::ReadExact;
using tcp_internal::RecvErrorText;
using tcp_internal::RecvOn;
using tcp_internal::Resolve;
using tcp_internal::SetSocketOptions;
using tcp_internal::SocketAddress;
using tcp_internal::SplitHostPort;
using tcp_internal::UniqueFd;
using tcp_internal::Wait;
using tcp_internal::WaitFd;
using tcp_internal::WireBytes;
using tcp_internal::WriteAll;

// ---------------------------------------------------------------------------------------------
// Handshake checks

absl::StatusOr<Hello> ParseCollectiveHello(std::string_view payload) {
  if (payload.size() > kMaxHelloPayload) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello: ", payload.size(), " bytes, at most ", kMaxHelloPayload));
  }
  Hello hello;
  if (!hello.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello: ", payload.size(), " bytes are not a CollectiveHello"));
  }
  return hello;
}

absl::Status CheckHelloMember(const Hello& hello, std::string_view signer, const GroupSpec& group,
                              std::string_view mesh_id, size_t self_index) {
  const std::string mesh = Hex8(mesh_id);
  if (hello.mesh_id() != mesh_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("hello.mesh_id: ", Hex8(hello.mesh_id()), "… is not mesh ", mesh, "…"));
  }
  if (hello.shard_id() != group.shard_id) {
    return absl::PermissionDeniedError(absl::StrCat("hello.shard_id: ", hello.shard_id(), ", mesh ",
                                                    mesh, " is shard ", group.shard_id));
  }
  const size_t n = group.members.size();
  size_t signer_index = n;
  for (size_t i = 0; i < n; ++i) {
    if (group.members[i].address == signer) signer_index = i;
  }
  if (signer_index == n) {
    return absl::PermissionDeniedError(
        absl::StrCat("host ", AsAbsl(signer), " is not a member of mesh ", mesh));
  }
  if (hello.member_index() != signer_index) {
    return absl::PermissionDeniedError(
        absl::StrCat("hello.member_index: ", hello.member_index(), " is not the signer ",
                     AsAbsl(signer), " (member ", signer_index, " of mesh ", mesh, ")"));
  }
  if (signer_index >= self_index) {
    return absl::PermissionDeniedError(absl::StrCat("hello.member_index: member ", signer_index,
                                                    " dialed member ", self_index, " of mesh ",
                                                    mesh, "; the earlier member dials"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Listener

void TcpTransport::Impl::RecordRefusal(const absl::Status& status) {
  common::Log(common::LogLevel::kWarn, kLogComponent, "handshake refused",
              {{"self", address}, {"error", std::string(status.ToString())}});
  absl::MutexLock lock(&refusals_mu);
  refusals.push_back(status);
  while (refusals.size() > kMaxRefusals) refusals.pop_front();
}

void TcpTransport::Impl::Refuse(Pending* p, const absl::Status& why) {
  const std::string reason =
      absl::StrCat("hello refused by ", address, ": ", absl::StatusCodeToString(why.code()), ": ",
                   why.message());
  absl::Status status =
      p->signer.empty()
          ? absl::Status(why.code(), absl::StrCat("connection from ", p->remote, ": ", reason))
          : PeerFailure(why.code(), p->signer, reason);
  RecordRefusal(status);
  // Under TLS the reason goes only to a dialer whose handshake is done (a record it can open).
  if (p->handshake == nullptr) {
    const std::string frame =
        WireBytes(p->tls.get(), FrameBytes(FrameType::kAbort, EncodeAbort(p->signer, reason)));
    (void)WriteAll(p->fd.get(), frame, clock->MonotonicMs() + kReplyDeadlineMs, -1, clock);
  }
  ::shutdown(p->fd.get(), SHUT_WR);
  // Unread bytes at close() would turn the FIN into a reset that can overtake the abort.
  char sink[4096];
  for (int i = 0; i < 16; ++i) {
    if (::recv(p->fd.get(), sink, sizeof(sink), MSG_DONTWAIT) <= 0) break;
  }
  p->fd.Reset();
}

void TcpTransport::Impl::AcceptNew(std::vector<std::unique_ptr<Pending>>* pending) {
  while (pending->size() < options.max_pending_connections) {
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        common::Log(common::LogLevel::kWarn, kLogComponent, "accept failed",
                    {{"self", address}, {"error", ErrnoText(errno)}});
      }
      return;
    }
    SetSocketOptions(fd, options.socket_buffer_bytes);
    auto p = std::make_unique<Pending>();
    p->fd = UniqueFd(fd);
    p->remote = PeerNameOf(fd);
    p->deadline_ms = clock->MonotonicMs() + options.handshake_timeout_ms;
    if (options.tls != nullptr) {
      absl::StatusOr<std::unique_ptr<common::TlsHandshake>> handshake = common::TlsHandshake::Start(
          options.tls, fd, common::TlsHandshake::Role::kServer, std::string());
      if (!handshake.ok()) {
        RecordRefusal(absl::Status(
            handshake.status().code(),
            absl::StrCat("connection from ", p->remote, ": ", handshake.status().message())));
        continue;  // p, and the socket with it, go
      }
      p->handshake = *std::move(handshake);
    }
    pending->push_back(std::move(p));
  }
}

void TcpTransport::Impl::AdvanceHandshake(Pending* p) {
  absl::StatusOr<common::TlsHandshake::Want> want = p->handshake->Step();
  if (!want.ok()) {
    Refuse(p, want.status());
    return;
  }
  p->want = *want;
  if (*want != common::TlsHandshake::Want::kDone) return;
  absl::StatusOr<common::TlsRecordLayer> layer = p->handshake->Finish();
  if (!layer.ok()) {
    Refuse(p, layer.status());
    return;
  }
  p->peer_cert_sha256 = p->handshake->peer_cert_sha256();
  p->handshake.reset();
  p->tls = std::make_unique<TlsWire>(*std::move(layer));
  ReadHello(p);  // the hello may have come with the handshake's last flight
}

bool TcpTransport::Impl::ReadHello(Pending* p) {
  while (true) {
    char* dst = nullptr;
    size_t want = 0;
    if (p->header_have < kFrameHeaderSize) {
      dst = p->header + p->header_have;
      want = kFrameHeaderSize - p->header_have;
    } else {
      dst = p->payload.data() + p->payload_have;
      want = p->payload.size() - p->payload_have;
    }
    if (want > 0) {
      uint64_t wire_bytes = 0;
      const ssize_t n = RecvOn(p->fd.get(), p->tls.get(), dst, want, &wire_bytes);
      if (n == 0) {
        Refuse(p,
               absl::UnavailableError(absl::StrCat("connection closed before a whole hello (",
                                                   p->header_have + p->payload_have, " bytes)")));
        return true;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        Refuse(p,
               absl::UnavailableError(absl::StrCat("recv: ", RecvErrorText(errno, p->tls.get()))));
        return true;
      }
      if (p->header_have < kFrameHeaderSize) {
        p->header_have += static_cast<size_t>(n);
        if (p->header_have < kFrameHeaderSize) continue;
        absl::StatusOr<FrameHeader> header = DecodeFrameHeader(
            std::string_view(p->header, kFrameHeaderSize), options.max_data_payload);
        if (!header.ok()) {
          Refuse(p, header.status());
          return true;
        }
        if (header->type != FrameType::kHello) {
          Refuse(p, absl::InvalidArgumentError(absl::StrCat(
                        "frame: type ", static_cast<int>(header->type), " where a hello (",
                        static_cast<int>(FrameType::kHello), ") was expected")));
          return true;
        }
        p->frame = *header;
        // Capped at kMaxHelloPayload by DecodeFrameHeader.
        p->payload.resize(header->payload_size);
      } else {
        p->payload_have += static_cast<size_t>(n);
      }
      if (p->header_have < kFrameHeaderSize || p->payload_have < p->payload.size()) continue;
    }
    // A whole hello.
    absl::StatusOr<Hello> hello = ParseCollectiveHello(p->payload);
    if (!hello.ok()) {
      Refuse(p, hello.status());
      return true;
    }
    // Signature, audience and times now; membership and the nonce once a Connect of the
    // hello's mesh claims it (TryClaim), so a parked hello keeps nothing in the verifier.
    absl::StatusOr<std::string> signer =
        verifier.AuthenticateRequest(*hello, kCollectiveHelloMethod, hello->shard_id());
    if (!signer.ok()) {
      Refuse(p, signer.status());
      return true;
    }
    p->hello = *std::move(hello);
    p->signer = *std::move(signer);
    p->parked = true;
    return TryClaim(p);
  }
}

bool TcpTransport::Impl::TryClaim(Pending* p) {
  absl::MutexLock lock(&connect_mu);
  auto it = connecting.find(p->hello.mesh_id());
  if (it == connecting.end()) return false;
  MeshImpl* mesh = it->second;
  const GroupSpec& group = mesh->group();
  // The group's membership is asked before the hello's nonce is recorded: a hello from a host
  // outside the mesh leaves nothing behind.
  absl::Status ok =
      verifier
          .VerifyRequest(p->hello, kCollectiveHelloMethod, p->hello.shard_id(),
                         [&](uint64_t, std::string_view signer) {
                           return CheckHelloMember(p->hello, signer, group, mesh->mesh_id(),
                                                   mesh->self_index());
                         })
          .status();
  if (!ok.ok() && !absl::IsPermissionDenied(ok)) {
    // Refused by its nonce or its times (a replay, say): the signature shows who once signed
    // the hello, not who sent it now, so the refusal names the connection, not the signer.
    p->signer.clear();
  }
  if (ok.ok() && options.tls != nullptr &&
      p->peer_cert_sha256 != group.members[p->hello.member_index()].tls_cert_sha256) {
    // The hello is the member's, the connection someone else's: name the connection.
    ok = absl::PermissionDeniedError(absl::StrCat(
        "the connection's TLS certificate has SHA-256 ",
        absl::BytesToHexString(p->peer_cert_sha256), ", the reservation of member ",
        p->hello.member_index(), " (", p->signer, ") names ",
        absl::BytesToHexString(group.members[p->hello.member_index()].tls_cert_sha256)));
    p->signer.clear();
  }
  if (ok.ok() && mesh->HasLink(p->hello.member_index())) {
    ok = absl::AlreadyExistsError(absl::StrCat("member ", p->hello.member_index(), " (", p->signer,
                                               ") is already connected in mesh ",
                                               Hex8(mesh->mesh_id())));
  }
  if (!ok.ok()) {
    Refuse(p, ok);
    return true;
  }
  Hello ack;
  ack.set_shard_id(group.shard_id);
  ack.set_mesh_id(mesh->mesh_id());
  ack.set_member_index(static_cast<uint32_t>(mesh->self_index()));
  ack.set_answers_nonce(p->hello.auth().nonce());
  absl::StatusOr<pb::PeerRequestAuth> auth =
      SignPeerRequest(key, options.chain_id, group.shard_id, kCollectiveHelloAckMethod, p->signer,
                      ack, clock->NowUnixMs(), kHelloLifetimeMs);
  if (!auth.ok()) {
    Refuse(p, auth.status());
    return true;
  }
  *ack.mutable_auth() = *std::move(auth);
  const absl::Status sent =
      WriteAll(p->fd.get(),
               WireBytes(p->tls.get(), FrameBytes(FrameType::kHelloAck, ack.SerializeAsString())),
               clock->MonotonicMs() + kReplyDeadlineMs, -1, clock);
  if (!sent.ok()) {
    RecordRefusal(PeerFailure(absl::StatusCode::kUnavailable, p->signer,
                              absl::StrCat("ack not sent: ", sent.message())));
    p->fd.Reset();
    return true;
  }
  mesh->AddLink(p->hello.member_index(), Conn{std::move(p->fd), std::move(p->tls)});
  return true;
}

void TcpTransport::Impl::AcceptMain() {
  std::vector<std::unique_ptr<Pending>> pending;
  std::vector<pollfd> fds;
  while (!stopping.load(std::memory_order_acquire)) {
    fds.clear();
    fds.push_back({accept_wake.fd(), POLLIN, 0});
    const bool listening = pending.size() < options.max_pending_connections;
    fds.push_back({listening ? listen_fd.get() : -1, POLLIN, 0});
    int64_t timeout_ms = 1000;
    const int64_t now = clock->MonotonicMs();
    for (const auto& p : pending) {
      const bool out = p->handshake != nullptr && p->want == common::TlsHandshake::Want::kWrite;
      fds.push_back({p->fd.get(), static_cast<short>(out ? POLLOUT : POLLIN), 0});
      timeout_ms = std::min(timeout_ms, p->deadline_ms - now);
    }
    int r;
    do {
      r = ::poll(fds.data(), fds.size(),
                 static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, 1000)));
    } while (r < 0 && errno == EINTR);
    if (stopping.load(std::memory_order_acquire)) break;
    if ((fds[0].revents & POLLIN) != 0) accept_wake.Drain();
    // Existing connections first (their pollfds line up with `pending` before accepting).
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending* p = pending[i].get();
      if (p->fd.get() < 0 || fds[i + 2].revents == 0) continue;
      if (p->handshake != nullptr) {
        AdvanceHandshake(p);
        continue;
      }
      if (p->parked) {
        // A parked dialer has nothing more to say: it left, or it breaks the protocol.
        Refuse(p, absl::InvalidArgumentError(
                      "connection sent more than a hello or closed while waiting"));
        continue;
      }
      ReadHello(p);
    }
    for (auto& p : pending) {
      if (p->fd.get() >= 0 && p->parked) TryClaim(p.get());
    }
    const int64_t after = clock->MonotonicMs();
    for (auto& p : pending) {
      if (p->fd.get() < 0 || after < p->deadline_ms) continue;
      if (p->parked) {
        Refuse(p.get(), absl::PermissionDeniedError(absl::StrCat(
                            "mesh ", Hex8(p->hello.mesh_id()), " is not being connected here (",
                            "waited ", options.handshake_timeout_ms, " ms)")));
      } else {
        Refuse(p.get(), absl::DeadlineExceededError(absl::StrCat(
                            p->handshake != nullptr ? "no TLS handshake" : "no whole hello",
                            " within ", options.handshake_timeout_ms, " ms")));
      }
    }
    // Handed over or refused: their fd was moved out or closed.
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const auto& p) { return p->fd.get() < 0; }),
                  pending.end());
    if (listening && (fds[1].revents & POLLIN) != 0) AcceptNew(&pending);
  }
}

void TcpTransport::Impl::HeartbeatMain() {
  const int64_t tick_ms = std::max<int64_t>(1, options.heartbeat_interval_ms / 4);
  int64_t next = clock->MonotonicMs() + tick_ms;
  while (!stopping.load(std::memory_order_acquire)) {
    const int64_t now = clock->MonotonicMs();
    if (now < next) {
      pollfd p{stop.fd(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min(next - now, tick_ms)));
      continue;
    }
    next = now + tick_ms;
    absl::MutexLock lock(&meshes_mu);
    for (MeshImpl* mesh : meshes) mesh->Tick(clock->MonotonicMs());
  }
}

// ---------------------------------------------------------------------------------------------
// Dialer

absl::StatusOr<std::unique_ptr<TlsWire>> TcpTransport::Impl::DialTls(MeshImpl* mesh,
                                                                     size_t member_index, int fd,
                                                                     int64_t deadline_ms,
                                                                     bool* final) {
  const GroupMember& peer = mesh->group().members[member_index];
  absl::StatusOr<common::TlsRecordLayer> layer = common::TlsHandshake::Connect(
      options.tls, fd, peer.tls_cert_sha256, [&](short events) -> absl::Status {
        const int64_t left = deadline_ms - clock->MonotonicMs();
        if (left <= 0)
          return absl::DeadlineExceededError("TLS handshake: not done by the deadline");
        if (WaitFd(fd, events, mesh->wake_fd(), left) == Wait::kCancelled) {
          return absl::CancelledError("TLS handshake: cancelled");
        }
        return absl::OkStatus();
      });
  if (!layer.ok()) {
    // A certificate other than the reservation's will not change by dialing again.
    *final = absl::IsUnauthenticated(layer.status());
    return PeerFailure(layer.status().code(), peer.address, Msg(layer.status()));
  }
  return std::make_unique<TlsWire>(*std::move(layer));
}

absl::StatusOr<Conn> TcpTransport::Impl::DialOnce(MeshImpl* mesh, size_t member_index,
                                                  const SocketAddress& to, int64_t deadline_ms,
                                                  bool* final) {
  *final = false;
  const GroupSpec& group = mesh->group();
  const GroupMember& peer = group.members[member_index];
  UniqueFd fd(::socket(to.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  SetSocketOptions(fd.get(), options.socket_buffer_bytes);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.storage), to.size) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(errno)));
    }
    while (true) {
      const int64_t left = deadline_ms - clock->MonotonicMs();
      if (left <= 0) return absl::DeadlineExceededError("connect: not done by the deadline");
      const Wait w = WaitFd(fd.get(), POLLOUT, mesh->wake_fd(), left);
      if (w == Wait::kCancelled) return absl::CancelledError("connect: cancelled");
      if (w == Wait::kReady) break;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(err)));
  }
  std::unique_ptr<TlsWire> tls;
  if (options.tls != nullptr) {
    TS_ASSIGN_OR_RETURN(tls, DialTls(mesh, member_index, fd.get(), deadline_ms, final));
  }

  Hello hello;
  hello.set_shard_id(group.shard_id);
  hello.set_mesh_id(mesh->mesh_id());
  hello.set_member_index(static_cast<uint32_t>(mesh->self_index()));
  absl::StatusOr<pb::PeerRequestAuth> auth =
      SignPeerRequest(key, options.chain_id, group.shard_id, kCollectiveHelloMethod, peer.address,
                      hello, clock->NowUnixMs(), kHelloLifetimeMs);
  if (!auth.ok()) {
    *final = true;
    return auth.status();
  }
  const std::string nonce = auth->nonce();
  *hello.mutable_auth() = *std::move(auth);
  TS_RETURN_IF_ERROR(WriteAll(
      fd.get(), WireBytes(tls.get(), FrameBytes(FrameType::kHello, hello.SerializeAsString())),
      deadline_ms, mesh->wake_fd(), clock));

  // Exactly the reply: frames the listener sends after it belong to the link's reader.
  char header_bytes[kFrameHeaderSize];
  TS_RETURN_IF_ERROR(ReadExact(fd.get(), tls.get(), header_bytes, kFrameHeaderSize, deadline_ms,
                               mesh->wake_fd(), clock));
  *final = true;
  absl::StatusOr<FrameHeader> header =
      DecodeFrameHeader(std::string_view(header_bytes, kFrameHeaderSize), options.max_data_payload);
  if (!header.ok()) {
    return PeerFailure(header.status().code(), peer.address,
                       absl::StrCat("reply to the hello: ", header.status().message()));
  }
  std::string payload(header->payload_size, '\0');
  absl::Status read = ReadExact(fd.get(), tls.get(), payload.data(), payload.size(), deadline_ms,
                                mesh->wake_fd(), clock);
  if (!read.ok()) {
    *final = false;
    return read;
  }
  if (header->type == FrameType::kAbort) {
    absl::StatusOr<AbortPayload> abort = DecodeAbort(payload);
    if (!abort.ok()) {
      return PeerFailure(absl::StatusCode::kPermissionDenied, peer.address,
                         absl::StrCat("refused the hello (", abort.status().message(), ")"));
    }
    return PeerFailure(absl::StatusCode::kPermissionDenied, peer.address,
                       absl::StrCat("refused the hello: ", abort->reason));
  }
  if (header->type != FrameType::kHelloAck) {
    return PeerFailure(absl::StatusCode::kInvalidArgument, peer.address,
                       absl::StrCat("reply to the hello: frame type ",
                                    static_cast<int>(header->type), ", want an ack"));
  }
  absl::StatusOr<Hello> ack = ParseCollectiveHello(payload);
  if (!ack.ok()) {
    return PeerFailure(absl::StatusCode::kInvalidArgument, peer.address,
                       absl::StrCat("ack: ", ack.status().message()));
  }
  // The only member an ack may come from is the one dialed.
  absl::StatusOr<std::string> signer =
      verifier.VerifyRequest(*ack, kCollectiveHelloAckMethod, group.shard_id,
                             [&](uint64_t, std::string_view from) -> absl::Status {
                               if (from == peer.address) return absl::OkStatus();
                               return absl::UnauthenticatedError(absl::StrCat(
                                   "signed by ", AsAbsl(from), ", not the member dialed"));
                             });
  if (!signer.ok()) {
    return PeerFailure(signer.status().code(), peer.address,
                       absl::StrCat("ack: ", signer.status().message()));
  }
  if (ack->mesh_id() != mesh->mesh_id() || ack->shard_id() != group.shard_id ||
      ack->member_index() != member_index || ack->answers_nonce() != nonce) {
    return PeerFailure(
        absl::StatusCode::kUnauthenticated, peer.address,
        absl::StrCat("ack: does not answer this hello (mesh ", Hex8(ack->mesh_id()), ", shard ",
                     ack->shard_id(), ", member_index ", ack->member_index(), ")"));
  }
  return Conn{std::move(fd), std::move(tls)};
}

absl::Status TcpTransport::Impl::Dial(MeshImpl* mesh, size_t member_index, int64_t deadline_ms) {
  const GroupMember& peer = mesh->group().members[member_index];
  absl::StatusOr<SocketAddress> to =
      Resolve(absl::StrCat("group.members[", member_index, "].endpoint"), peer.endpoint);
  if (!to.ok()) return PeerFailure(to.status().code(), peer.address, Msg(to.status()));
  int64_t backoff_ms = kDialBackoffFirstMs;
  while (true) {
    bool final = false;
    absl::StatusOr<Conn> fd = DialOnce(mesh, member_index, *to, deadline_ms, &final);
    if (fd.ok()) {
      mesh->AddLink(member_index, *std::move(fd));
      return absl::OkStatus();
    }
    if (mesh->stopping() || absl::IsCancelled(fd.status())) return fd.status();
    const absl::Status named = FailedPeerOf(fd.status()).empty()
                                   ? PeerFailure(fd.status().code(), peer.address, Msg(fd.status()))
                                   : fd.status();
    mesh->SetDialError(member_index, named, final);
    if (final) return named;
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) return named;
    pollfd p{mesh->wake_fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min(left, backoff_ms)));
    backoff_ms = std::min(backoff_ms * 2, kDialBackoffMaxMs);
  }
}

// ---------------------------------------------------------------------------------------------
// TcpTransport

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Start(common::PrivateKey key,
                                                                  TcpTransportOptions options,
                                                                  common::Clock* clock) {
  if (options.chain_id.empty()) return absl::InvalidArgumentError("options.chain_id: empty");
  if (options.heartbeat_interval_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.heartbeat_interval_ms: ", options.heartbeat_interval_ms, ", want > 0"));
  }
  if (options.dead_after_ms < 0 ||
      (options.dead_after_ms > 0 && options.dead_after_ms < options.heartbeat_interval_ms)) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.dead_after_ms: ", options.dead_after_ms, ", want 0 or at least ",
                     "heartbeat_interval_ms (", options.heartbeat_interval_ms, ")"));
  }
  if (options.handshake_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.handshake_timeout_ms: ", options.handshake_timeout_ms, ", want > 0"));
  }
  if (options.max_data_payload == 0) {
    return absl::InvalidArgumentError("options.max_data_payload: 0, want > 0");
  }
  if (options.max_queued_bytes == 0) {
    return absl::InvalidArgumentError("options.max_queued_bytes: 0, want > 0");
  }
  if (options.max_pending_connections == 0) {
    return absl::InvalidArgumentError("options.max_pending_connections: 0, want > 0");
  }
  if (options.socket_buffer_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.socket_buffer_bytes: ", options.socket_buffer_bytes, ", want >= 0"));
  }
  TS_ASSIGN_OR_RETURN(SocketAddress bind_to,
                      Resolve("options.listen_address", options.listen_address));
  if (bind_to.storage.ss_family != AF_INET && bind_to.storage.ss_family != AF_INET6) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.listen_address: '", options.listen_address, "' is not IP"));
  }

  auto impl = std::make_unique<Impl>(std::move(key), std::move(options), clock);
  Impl& t = *impl;
  t.dead_after_ms = t.options.dead_after_ms > 0 ? t.options.dead_after_ms
                                                : t.options.heartbeat_interval_ms * 3 / 2;
  t.listen_fd =
      UniqueFd(::socket(bind_to.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (t.listen_fd.get() < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  }
  const int one = 1;
  ::setsockopt(t.listen_fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (t.options.socket_buffer_bytes > 0) {
    ::setsockopt(t.listen_fd.get(), SOL_SOCKET, SO_RCVBUF, &t.options.socket_buffer_bytes,
                 sizeof(int));
    ::setsockopt(t.listen_fd.get(), SOL_SOCKET, SO_SNDBUF, &t.options.socket_buffer_bytes,
                 sizeof(int));
  }
  if (::bind(t.listen_fd.get(), reinterpret_cast<const sockaddr*>(&bind_to.storage),
             bind_to.size) != 0 ||
      ::listen(t.listen_fd.get(), 128) != 0) {
    return absl::UnavailableError(absl::StrCat("options.listen_address: cannot listen on ",
                                               t.options.listen_address, ": ", ErrnoText(errno)));
  }
  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  ::getsockname(t.listen_fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_size);
  const uint16_t port = bound.ss_family == AF_INET
                            ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                            : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  std::string host;
  std::string unused_port;
  TS_RETURN_IF_ERROR(
      SplitHostPort("options.listen_address", t.options.listen_address, &host, &unused_port));
  t.endpoint = bound.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                           : absl::StrCat(host, ":", port);
  t.accept_thread = std::thread([&t] { t.AcceptMain(); });
  t.heartbeat_thread = std::thread([&t] { t.HeartbeatMain(); });
  return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
}

TcpTransport::TcpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpTransport::~TcpTransport() {
  impl_->stopping.store(true, std::memory_order_release);
  impl_->accept_wake.Set();
  impl_->stop.Set();
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  if (impl_->heartbeat_thread.joinable()) impl_->heartbeat_thread.join();
  absl::MutexLock lock(&impl_->meshes_mu);
  // Meshes refer to the transport (contract: destroyed first).
  TS_CHECK(impl_->meshes.empty());
}

std::string TcpTransport::endpoint() const { return impl_->endpoint; }
const std::string& TcpTransport::address() const { return impl_->address; }

std::vector<absl::Status> TcpTransport::RecentRefusals() const {
  absl::MutexLock lock(&impl_->refusals_mu);
  return std::vector<absl::Status>(impl_->refusals.begin(), impl_->refusals.end());
}

absl::StatusOr<std::unique_ptr<Mesh>> TcpTransport::Connect(const GroupSpec& group,
                                                            size_t self_index,
                                                            int64_t deadline_ms) {
  Impl& t = *impl_;
  TS_RETURN_IF_ERROR(ValidateGroup(group));
  const size_t n = group.members.size();
  if (self_index >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("self_index: ", self_index, " is outside the group of ", n));
  }
  if (group.members[self_index].address != t.address) {
    return absl::InvalidArgumentError(absl::StrCat("group.members[", self_index,
                                                   "].address: ", group.members[self_index].address,
                                                   " is not this host (", t.address, ")"));
  }
  for (size_t j = 0; j < n && t.options.tls != nullptr; ++j) {
    if (j != self_index && group.members[j].tls_cert_sha256.size() != common::kSha256Size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group.members[", j, "].tls_cert_sha256: ", group.members[j].tls_cert_sha256.size(),
          " bytes, want ", common::kSha256Size, " (TLS is on: every peer is pinned)"));
    }
  }
  for (size_t j = self_index + 1; j < n; ++j) {
    std::string host;
    std::string port;
    TS_RETURN_IF_ERROR(SplitHostPort(absl::StrCat("group.members[", j, "].endpoint"),
                                     group.members[j].endpoint, &host, &port));
  }
  const std::string mesh_id = MeshIdOf(group);
  auto mesh = std::make_unique<MeshImpl>(&t, group, self_index, mesh_id);
  {
    absl::MutexLock lock(&t.connect_mu);
    if (!t.connect_refusal.ok()) return t.connect_refusal;
    if (!t.connecting.emplace(mesh_id, mesh.get()).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("mesh ", Hex8(mesh_id), " is already being connected here"));
    }
  }
  t.Register(mesh.get());
  // Hellos that arrived before this Connect are parked in the listener: look at them now.
  t.accept_wake.Set();

  std::vector<std::thread> dialers;
  for (size_t j = self_index + 1; j < n; ++j) {
    dialers.emplace_back([&t, m = mesh.get(), j, deadline_ms] {
      absl::Status s = t.Dial(m, j, deadline_ms);
      (void)s;  // recorded through SetDialError / AddLink
    });
  }
  absl::Status status = mesh->WaitConnected(deadline_ms);
  {
    absl::MutexLock lock(&t.connect_mu);
    t.connecting.erase(mesh_id);
  }
  // Successful dialers have returned (every link is up); failing ones stop at the mesh's
  // failure, which Abort below records.
  if (!status.ok()) mesh->Abort(status);
  for (std::thread& d : dialers) d.join();
  if (!status.ok()) return status;
  return std::unique_ptr<Mesh>(std::move(mesh));
}

void TcpTransport::StopConnecting(const absl::Status& status) {
  TS_CHECK(!status.ok());
  Impl& t = *impl_;
  // Under the lock a connecting mesh cannot go away (Connect takes it out of the map first);
  // its abort frames go out within kAbortDeadlineMs.
  absl::MutexLock lock(&t.connect_mu);
  if (t.connect_refusal.ok()) t.connect_refusal = status;
  for (auto& [id, mesh] : t.connecting) mesh->Abort(status);
}

}  // namespace ts::sidecar
