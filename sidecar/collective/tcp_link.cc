// A mesh of the TCP transport and its links: sending frames, the reader threads, heartbeats,
// liveness, failure and the linger on close (tcp_transport_internal.h).
#include "sidecar/collective/tcp_transport_internal.h"

namespace ts::sidecar::tcp_internal {

// ---------------------------------------------------------------------------------------------
// MeshImpl

MeshImpl::MeshImpl(TcpTransport::Impl* transport, GroupSpec group, size_t self_index,
                   std::string mesh_id)
    : transport_(transport),
      group_(std::move(group)),
      self_index_(self_index),
      mesh_id_(std::move(mesh_id)) {
  absl::MutexLock lock(&links_mu_);
  links_.resize(group_.members.size());
  dial_errors_.resize(group_.members.size());
}

MeshImpl::~MeshImpl() {
  transport_->Unregister(this);
  std::vector<LinkImpl*> links = Links();
  closing_.store(true, std::memory_order_release);
  wake_.Set();
  for (LinkImpl* link : links) link->WakeAll();
  for (LinkImpl* link : links) link->JoinReader();
  // A mesh that failed says so again rather than closing with a bare EOF, which a member still
  // waiting would blame on this host (it may see the close before the original abort).
  std::string frame;
  std::string blamed;
  if (failed()) {
    const absl::Status status = failure();
    blamed = FailedPeerOf(status);
    frame = FrameBytes(FrameType::kAbort, EncodeAbort(blamed, std::string(status.message())));
  } else {
    frame = FrameBytes(FrameType::kClose, {});
  }
  Linger(std::move(links), frame, blamed);
  absl::MutexLock lock(&links_mu_);
  links_.clear();
}

void MeshImpl::Linger(std::vector<LinkImpl*> links, std::string_view frame,
                      std::string_view blamed) {
  struct Closing {
    LinkImpl* link;
    std::string wire;  // `frame` as this link sends it
    size_t written = 0;
    bool shut = false;
    int64_t unacked = 0;
    int64_t progress_ms = 0;
  };
  const int64_t start = clock()->MonotonicMs();
  std::vector<Closing> closing;
  for (LinkImpl* link : links) {
    if (link->closed_by_peer()) {
      link->ShutdownWrite();
    } else if (!blamed.empty() && link->peer() == blamed) {
      // Nothing is owed to the member at fault: one try, no waiting.
      size_t written = 0;
      link->WriteNow(link->WireBytesOf(frame), &written);
      link->ShutdownWrite();
    } else {
      closing.push_back({link, link->WireBytesOf(frame), 0, false, link->UnackedBytes(), start});
    }
  }
  while (true) {
    const int64_t now = clock()->MonotonicMs();
    std::erase_if(closing, [&](Closing& c) {
      // Unread input at close() would turn the FIN into a reset.
      c.link->DrainInput();
      bool ok = true;
      if (!c.shut) {
        const size_t before = c.written;
        ok = !c.wire.empty() && c.link->WriteNow(c.wire, &c.written);
        if (c.written > before) c.progress_ms = now;
        if (!ok || c.written == c.wire.size()) {
          c.link->ShutdownWrite();
          c.shut = true;
        }
      }
      if (!ok) return true;
      const int64_t unacked = c.link->UnackedBytes();
      if (c.shut && unacked <= 0) return true;
      if (unacked < c.unacked) c.progress_ms = now;
      c.unacked = unacked;
      return now - c.progress_ms >= dead_after_ms();
    });
    if (closing.empty() || now - start >= kMaxLingerMs) break;
    ::poll(nullptr, 0, static_cast<int>(kLingerPollMs));
  }
  for (Closing& c : closing) {
    if (!c.shut) c.link->ShutdownWrite();
  }
}

const TcpTransportOptions& MeshImpl::options() const { return transport_->options; }
common::Clock* MeshImpl::clock() const { return transport_->clock; }
int64_t MeshImpl::dead_after_ms() const { return transport_->dead_after_ms; }

Link* MeshImpl::link(size_t member_index) {
  TS_CHECK(member_index < group_.members.size() && member_index != self_index_);
  absl::MutexLock lock(&links_mu_);
  return links_[member_index].get();
}

absl::Status MeshImpl::failure() const {
  absl::MutexLock lock(&fail_mu_);
  return failure_;
}

std::vector<LinkImpl*> MeshImpl::Links() const {
  std::vector<LinkImpl*> out;
  absl::MutexLock lock(&links_mu_);
  for (const auto& link : links_) {
    if (link != nullptr) out.push_back(link.get());
  }
  return out;
}

bool MeshImpl::Fail(const absl::Status& status) {
  TS_CHECK(!status.ok());
  {
    absl::MutexLock lock(&fail_mu_);
    if (!failure_.ok()) return false;
    failure_ = status;
    failed_.store(true, std::memory_order_release);
  }
  wake_.Set();
  for (LinkImpl* link : Links()) link->WakeAll();
  {
    absl::MutexLock lock(&links_mu_);
    links_cv_.SignalAll();
  }
  common::Log(common::LogLevel::kWarn, kLogComponent, "mesh failed",
              {{"mesh", Hex8(mesh_id_)},
               {"self", group_.members[self_index_].address},
               {"error", std::string(status.ToString())}});
  return true;
}

void MeshImpl::Abort(const absl::Status& status) {
  if (status.ok() || !Fail(status)) return;
  SendAbort(status, nullptr);
}

void MeshImpl::SendAbort(const absl::Status& status, const LinkImpl* except) {
  const std::string blamed = FailedPeerOf(status);
  const std::string payload = EncodeAbort(blamed, std::string(status.message()));
  // The blamed peer last: its link is the one likely to be stuck, and the others should not
  // wait behind it.
  std::vector<LinkImpl*> links = Links();
  std::erase(links, except);
  std::stable_partition(links.begin(), links.end(),
                        [&](const LinkImpl* link) { return link->peer() != blamed; });
  const int64_t deadline = clock()->MonotonicMs() + kAbortDeadlineMs;
  for (LinkImpl* link : links) link->SendControl(FrameType::kAbort, payload, deadline);
}

bool MeshImpl::HasLink(size_t member_index) const {
  absl::MutexLock lock(&links_mu_);
  return links_[member_index] != nullptr;
}

void MeshImpl::AddLink(size_t member_index, Conn conn) {
  auto link = std::make_unique<LinkImpl>(this, group_.members[member_index].address,
                                         std::move(conn), clock()->MonotonicMs());
  LinkImpl* raw = link.get();
  {
    absl::MutexLock lock(&links_mu_);
    TS_CHECK(links_[member_index] == nullptr);
    links_[member_index] = std::move(link);
    ++connected_;
    links_cv_.SignalAll();
  }
  raw->StartReader();
  // A failure recorded before the link existed did not wake it.
  if (stopping()) raw->WakeAll();
}

void MeshImpl::SetDialError(size_t member_index, absl::Status status, bool final) {
  absl::MutexLock lock(&links_mu_);
  dial_errors_[member_index] = status;
  if (final && final_dial_error_.ok()) final_dial_error_ = std::move(status);
  links_cv_.SignalAll();
}

absl::Status MeshImpl::WaitConnected(int64_t deadline_ms) {
  const size_t n = group_.members.size();
  absl::MutexLock lock(&links_mu_);
  while (true) {
    if (failed()) {
      absl::MutexLock fail_lock(&fail_mu_);
      return failure_;
    }
    if (!final_dial_error_.ok()) return final_dial_error_;
    if (connected_ == n - 1) return absl::OkStatus();
    const int64_t left = deadline_ms - clock()->MonotonicMs();
    if (left <= 0) break;
    links_cv_.WaitWithTimeout(&links_mu_, absl::Milliseconds(std::min(left, kSliceMs)));
  }
  std::vector<std::string> missing;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    if (i == self_index_ || links_[i] != nullptr) continue;
    const GroupMember& m = group_.members[i];
    std::string why = i < self_index_ ? "has not dialed here" : "not reached";
    if (!dial_errors_[i].ok()) why = std::string(dial_errors_[i].message());
    if (first.empty()) first = m.address;
    missing.push_back(absl::StrCat(m.address, " at ", m.endpoint, " (", why, ")"));
  }
  return PeerFailure(absl::StatusCode::kDeadlineExceeded, first,
                     absl::StrCat("not connected by the deadline (mesh ", Hex8(mesh_id_),
                                  "); members not connected: ", absl::StrJoin(missing, ", ")));
}

void MeshImpl::Tick(int64_t now_ms) {
  if (stopping()) return;
  const int64_t idle_ms = std::max<int64_t>(1, options().heartbeat_interval_ms / 2);
  for (LinkImpl* link : Links()) {
    absl::Status status = link->MaybeHeartbeat(now_ms, idle_ms);
    if (status.ok()) status = link->CheckLiveness(now_ms, dead_after_ms());
    if (!status.ok()) {
      Abort(status);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LinkImpl

LinkImpl::LinkImpl(MeshImpl* mesh, std::string peer, Conn conn, int64_t now_ms)
    : mesh_(mesh),
      peer_(std::move(peer)),
      fd_(std::move(conn.fd)),
      tls_(std::move(conn.tls)),
      last_sent_ms_(now_ms),
      last_heard_ms_(now_ms) {}

LinkImpl::~LinkImpl() { JoinReader(); }

void LinkImpl::StartReader() {
  read_buf_.resize(kReadBufferBytes);
  reader_ = std::thread([this] { ReaderMain(); });
}

void LinkImpl::JoinReader() {
  if (reader_.joinable()) reader_.join();
}

void LinkImpl::WakeAll() {
  absl::MutexLock lock(&mu_);
  data_cv_.SignalAll();
  space_cv_.SignalAll();
}

absl::Status LinkImpl::WriteFrameLocked(const char* header, std::string_view payload,
                                        int64_t deadline_ms, bool cancellable, size_t* written) {
  common::Clock* clock = mesh_->clock();
  const int cancel_fd = cancellable ? mesh_->wake_fd() : -1;
  *written = 0;
  std::string_view first(header, kFrameHeaderSize);
  std::string_view second = payload;
  if (tls_ != nullptr) {
    // Records once sealed must all be sent: nothing is sealed before the socket takes bytes,
    // so a deadline passing first leaves the link usable, as in the clear.
    while (true) {
      const int64_t left = deadline_ms - clock->MonotonicMs();
      if (left <= 0) return absl::DeadlineExceededError("send not begun by the deadline");
      const Wait w = WaitFd(fd_.get(), POLLOUT, cancel_fd, left);
      if (w == Wait::kCancelled)
        return absl::CancelledError("mesh failed or closed during the send");
      if (w == Wait::kReady) break;
    }
    sealed_.clear();
    const absl::Status sealed = tls_->Seal({first, second}, &sealed_);
    if (!sealed.ok()) {
      broken_ = true;
      return absl::UnavailableError(sealed.message());
    }
    first = sealed_;
    second = {};
  }
  const size_t total = first.size() + second.size();
  size_t done = 0;
  absl::Status status;
  while (done < total) {
    iovec iov[2];
    int iov_count = 0;
    if (done < first.size()) {
      iov[iov_count++] = {const_cast<char*>(first.data()) + done, first.size() - done};
      if (!second.empty()) iov[iov_count++] = {const_cast<char*>(second.data()), second.size()};
    } else {
      const size_t at = done - first.size();
      iov[iov_count++] = {const_cast<char*>(second.data()) + at, second.size() - at};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iov_count);
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      bytes_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      status = absl::UnavailableError(absl::StrCat("send: ", ErrnoText(errno)));
      break;
    }
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      status = absl::DeadlineExceededError(absl::StrCat("send not done by the deadline (", done,
                                                        " of ", total, " bytes of the frame)"));
      break;
    }
    if (WaitFd(fd_.get(), POLLOUT, cancel_fd, left) == Wait::kCancelled) {
      status = absl::CancelledError("mesh failed or closed during the send");
      break;
    }
  }
  *written = done;
  if (done > 0) last_sent_ms_.store(clock->MonotonicMs(), std::memory_order_relaxed);
  if ((done > 0 || tls_ != nullptr) && done < total) broken_ = true;
  return status;
}

absl::Status LinkImpl::Send(const FrameHeader& header, std::string_view payload,
                            int64_t deadline_ms) {
  if (mesh_->failed()) return mesh_->failure();
  if (header.type != FrameType::kData) {
    return absl::InvalidArgumentError(absl::StrCat("Send: frame type ",
                                                   static_cast<int>(header.type),
                                                   "; only data frames are sent by callers"));
  }
  if (payload.size() > mesh_->options().max_data_payload) {
    return absl::InvalidArgumentError(absl::StrCat("Send: payload of ", payload.size(),
                                                   " bytes is over max_data_payload ",
                                                   mesh_->options().max_data_payload));
  }
  if (closed_by_peer_.load(std::memory_order_acquire)) {
    return PeerFailure(absl::StatusCode::kUnavailable, peer_, "closed the link (kClose)");
  }
  FrameHeader h = header;
  h.payload_size = static_cast<uint32_t>(payload.size());
  char encoded[kFrameHeaderSize];
  EncodeFrameHeader(h, encoded);
  absl::Status status;
  size_t written = 0;
  bool broken = false;
  {
    absl::MutexLock lock(&send_mu_);
    if (broken_) {
      status = absl::UnavailableError("an earlier send was cut off inside a frame");
    } else {
      status = WriteFrameLocked(encoded, payload, deadline_ms, /*cancellable=*/true, &written);
    }
    broken = broken_;
  }
  if (status.ok()) return status;
  if (mesh_->failed()) return mesh_->failure();
  if (absl::IsDeadlineExceeded(status) && !broken) {
    // Nothing of this frame is on the wire: the link is still usable.
    return PeerFailure(absl::StatusCode::kDeadlineExceeded, peer_, Msg(status));
  }
  if (closed_by_peer_.load(std::memory_order_acquire)) {
    return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                       absl::StrCat("closed the link (kClose); ", status.message()));
  }
  const absl::StatusCode code =
      absl::IsDeadlineExceeded(status) ? status.code() : absl::StatusCode::kUnavailable;
  mesh_->Abort(PeerFailure(code, peer_, Msg(status)));
  return mesh_->failure();
}

absl::StatusOr<Frame> LinkImpl::Recv(int64_t deadline_ms) {
  common::Clock* clock = mesh_->clock();
  absl::MutexLock lock(&mu_);
  while (true) {
    if (mesh_->failed()) return mesh_->failure();
    if (!queue_.empty()) {
      Frame frame = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= frame.payload.size();
      space_cv_.Signal();
      return frame;
    }
    if (closed_by_peer_.load(std::memory_order_acquire)) {
      return PeerFailure(absl::StatusCode::kUnavailable, peer_, "closed the link (kClose)");
    }
    if (mesh_->stopping()) return absl::CancelledError("mesh closed");
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      return PeerFailure(absl::StatusCode::kDeadlineExceeded, peer_,
                         "no data frame by the deadline");
    }
    data_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(std::min(left, kSliceMs)));
  }
}

void LinkImpl::Recycle(std::string buffer) {
  if (buffer.capacity() == 0) return;
  absl::MutexLock lock(&mu_);
  if (pool_.size() >= kMaxPooledBuffers || pooled_bytes_ + buffer.capacity() > kMaxPooledBytes) {
    return;
  }
  pooled_bytes_ += buffer.capacity();
  pool_.push_back(std::move(buffer));
}

std::string LinkImpl::TakeBuffer(size_t size) {
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    // The smallest pooled buffer that fits, else the largest (it grows once).
    size_t best = pool_.size();
    for (size_t i = 0; i < pool_.size(); ++i) {
      if (best == pool_.size()) {
        best = i;
        continue;
      }
      const size_t cap = pool_[i].capacity();
      const size_t best_cap = pool_[best].capacity();
      const bool better = best_cap >= size ? (cap >= size && cap < best_cap) : cap > best_cap;
      if (better) best = i;
    }
    if (best < pool_.size()) {
      pooled_bytes_ -= pool_[best].capacity();
      out = std::move(pool_[best]);
      pool_[best] = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  out.resize(size);
  return out;
}

bool LinkImpl::WaitForQueueSpace() {
  const size_t cap = mesh_->options().max_queued_bytes;
  absl::MutexLock lock(&mu_);
  if (queued_bytes_ < cap) return true;
  reader_paused_.store(true, std::memory_order_release);
  while (queued_bytes_ >= cap && !mesh_->stopping()) space_cv_.Wait(&mu_);
  // The pause is not the peer's silence: its clock starts again now.
  last_heard_ms_.store(mesh_->clock()->MonotonicMs(), std::memory_order_relaxed);
  reader_paused_.store(false, std::memory_order_release);
  return !mesh_->stopping();
}

LinkImpl::ReadResult LinkImpl::ReadSome(char* buf, size_t size, size_t* got) {
  while (true) {
    uint64_t wire_bytes = 0;
    const ssize_t n = RecvOn(fd_.get(), tls_.get(), buf, size, &wire_bytes);
    if (wire_bytes > 0) {
      // Under TLS bytes may arrive before their record is whole: they are heard all the same.
      bytes_received_.fetch_add(wire_bytes, std::memory_order_relaxed);
      last_heard_ms_.store(mesh_->clock()->MonotonicMs(), std::memory_order_relaxed);
    }
    if (n > 0) {
      *got = static_cast<size_t>(n);
      return ReadResult::kOk;
    }
    if (n == 0) return ReadResult::kEof;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      read_errno_ = errno;
      return ReadResult::kError;
    }
    if (mesh_->stopping()) return ReadResult::kCancelled;
    pollfd fds[2] = {{fd_.get(), POLLIN, 0}, {mesh_->wake_fd(), POLLIN, 0}};
    int r;
    do {
      r = ::poll(fds, 2, -1);
    } while (r < 0 && errno == EINTR);
    if ((fds[1].revents & POLLIN) != 0) return ReadResult::kCancelled;
  }
}

LinkImpl::ReadResult LinkImpl::Fill(size_t need) {
  if (read_end_ - read_begin_ >= need) return ReadResult::kOk;
  if (read_begin_ + need > read_buf_.size()) {
    std::memmove(read_buf_.data(), read_buf_.data() + read_begin_, read_end_ - read_begin_);
    read_end_ -= read_begin_;
    read_begin_ = 0;
  }
  while (read_end_ - read_begin_ < need) {
    size_t got = 0;
    const ReadResult r = ReadSome(read_buf_.data() + read_end_, read_buf_.size() - read_end_, &got);
    if (r != ReadResult::kOk) return r;
    read_end_ += got;
  }
  return ReadResult::kOk;
}

absl::Status LinkImpl::FailureOf(ReadResult result, std::string_view where) {
  if (result == ReadResult::kEof) {
    return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                       absl::StrCat("connection closed", AsAbsl(where)));
  }
  return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                     absl::StrCat("connection lost", AsAbsl(where),
                                  ": recv: ", RecvErrorText(read_errno_, tls_.get())));
}

void LinkImpl::ReaderMain() {
  const uint32_t max_data = mesh_->options().max_data_payload;
  while (true) {
    ReadResult r = Fill(kFrameHeaderSize);
    if (r == ReadResult::kCancelled) return;
    if (r != ReadResult::kOk) {
      const size_t have = read_end_ - read_begin_;
      mesh_->Abort(FailureOf(r, have == 0 ? std::string()
                                          : absl::StrCat(" inside a frame header (", have, " of ",
                                                         kFrameHeaderSize, " bytes)")));
      return;
    }
    absl::StatusOr<FrameHeader> header = DecodeFrameHeader(
        std::string_view(read_buf_.data() + read_begin_, kFrameHeaderSize), max_data);
    if (!header.ok()) {
      mesh_->Abort(PeerFailure(header.status().code(), peer_, Msg(header.status())));
      return;
    }
    read_begin_ += kFrameHeaderSize;
    const size_t size = header->payload_size;
    if (header->type == FrameType::kData) {
      std::string payload = TakeBuffer(size);
      const size_t from_buf = std::min(size, read_end_ - read_begin_);
      if (from_buf > 0) std::memcpy(payload.data(), read_buf_.data() + read_begin_, from_buf);
      read_begin_ += from_buf;
      size_t have = from_buf;
      while (have < size) {
        size_t got = 0;
        r = ReadSome(payload.data() + have, size - have, &got);
        if (r == ReadResult::kCancelled) return;
        if (r != ReadResult::kOk) {
          mesh_->Abort(FailureOf(
              r, absl::StrCat(" inside a data frame (", have, " of ", size, " payload bytes)")));
          return;
        }
        have += got;
      }
      if (read_begin_ == read_end_) read_begin_ = read_end_ = 0;
      {
        absl::MutexLock lock(&mu_);
        queued_bytes_ += size;
        queue_.push_back(Frame{*header, std::move(payload)});
        data_cv_.Signal();
      }
      if (!WaitForQueueSpace()) return;
      continue;
    }
    // Control frames: small payloads (caps checked above), read through the buffer.
    r = Fill(size);
    if (r == ReadResult::kCancelled) return;
    if (r != ReadResult::kOk) {
      mesh_->Abort(FailureOf(r, absl::StrCat(" inside a frame (", read_end_ - read_begin_, " of ",
                                             size, " payload bytes)")));
      return;
    }
    const std::string_view payload(read_buf_.data() + read_begin_, size);
    read_begin_ += size;
    if (read_begin_ == read_end_) read_begin_ = read_end_ = 0;
    switch (header->type) {
      case FrameType::kHeartbeat:
        break;
      case FrameType::kClose:
        closed_by_peer_.store(true, std::memory_order_release);
        WakeAll();
        return;
      case FrameType::kAbort: {
        absl::StatusOr<AbortPayload> abort = DecodeAbort(payload);
        if (!abort.ok()) {
          mesh_->Abort(PeerFailure(abort.status().code(), peer_, Msg(abort.status())));
          return;
        }
        bool member = false;
        for (const GroupMember& m : mesh_->group().members) {
          member = member || (!abort->blamed_address.empty() && m.address == abort->blamed_address);
        }
        // DecodeAbort admits printable UTF-8 only: the reason can go into a status as is.
        const absl::Status status =
            PeerFailure(absl::StatusCode::kUnavailable, member ? abort->blamed_address : peer_,
                        absl::StrCat("aborted by ", peer_, ": ", abort->reason));
        // Passed on at once: a member that hears of the failure only later could meanwhile see
        // this host close and blame it instead.
        if (mesh_->Fail(status)) mesh_->SendAbort(status, this);
        return;
      }
      case FrameType::kHello:
      case FrameType::kHelloAck:
      case FrameType::kData:  // handled above
        mesh_->Abort(
            PeerFailure(absl::StatusCode::kInvalidArgument, peer_,
                        absl::StrCat("frame: unexpected type ", static_cast<int>(header->type),
                                     " (hello or ack) after the handshake")));
        return;
    }
  }
}

absl::Status LinkImpl::MaybeHeartbeat(int64_t now_ms, int64_t idle_ms) {
  if (closed_by_peer_.load(std::memory_order_acquire)) return absl::OkStatus();
  if (now_ms - last_sent_ms_.load(std::memory_order_relaxed) < idle_ms) return absl::OkStatus();
  // A Send in progress is traffic enough.
  if (!send_mu_.TryLock()) return absl::OkStatus();
  absl::Status cut_off;
  if (!broken_) {
    FrameHeader header;
    header.type = FrameType::kHeartbeat;
    char encoded[kFrameHeaderSize];
    EncodeFrameHeader(header, encoded);
    std::string_view bytes(encoded, kFrameHeaderSize);
    // Try once without waiting: a full send buffer means bytes are still on their way. Under
    // TLS the record is sealed only once the socket takes bytes (and then must all be sent).
    pollfd writable{fd_.get(), POLLOUT, 0};
    const bool skip =
        tls_ != nullptr && (::poll(&writable, 1, 0) <= 0 || (writable.revents & POLLOUT) == 0);
    std::string sealed;
    if (!skip && tls_ != nullptr && !tls_->Seal({bytes}, &sealed).ok()) broken_ = true;
    if (!skip && !broken_) {
      if (tls_ != nullptr) bytes = sealed;
      const ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      const size_t sent = n > 0 ? static_cast<size_t>(n) : 0;
      if (sent == bytes.size()) {
        bytes_sent_.fetch_add(sent, std::memory_order_relaxed);
        last_sent_ms_.store(now_ms, std::memory_order_relaxed);
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        // Not the failure to report: the link's reader sees why (the peer's kClose, EOF or
        // reset, read in order after the data before it), and a stopped peer by its silence.
        broken_ = true;
      } else if (sent > 0 || tls_ != nullptr) {
        // Rare: the rest must follow, or the stream is cut inside a frame (or a record).
        cut_off =
            WriteAll(fd_.get(), bytes.substr(sent), now_ms + kAbortDeadlineMs, -1, mesh_->clock());
        bytes_sent_.fetch_add(cut_off.ok() ? bytes.size() : sent, std::memory_order_relaxed);
        last_sent_ms_.store(now_ms, std::memory_order_relaxed);
        broken_ = !cut_off.ok();
      }
    }
  }
  send_mu_.Unlock();
  if (cut_off.ok() || mesh_->stopping()) return absl::OkStatus();
  return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                     absl::StrCat("heartbeat cut off: ", cut_off.message()));
}

std::string LinkImpl::WireBytesOf(std::string_view frame) {
  absl::MutexLock lock(&send_mu_);
  if (broken_) return std::string();
  std::string wire = WireBytes(tls_.get(), frame);
  if (wire.empty()) broken_ = true;
  return wire;
}

bool LinkImpl::WriteNow(std::string_view bytes, size_t* done) {
  absl::MutexLock lock(&send_mu_);
  if (broken_) return false;
  while (*done < bytes.size()) {
    const ssize_t n =
        ::send(fd_.get(), bytes.data() + *done, bytes.size() - *done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      bytes_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (*done > 0) broken_ = true;
    return false;
  }
  return true;
}

void LinkImpl::DrainInput() {
  char sink[16384];
  for (int i = 0; i < 64; ++i) {
    if (::recv(fd_.get(), sink, sizeof(sink), MSG_DONTWAIT) <= 0) return;
  }
}

int64_t LinkImpl::UnackedBytes() const {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      info.tcpi_state == TCP_CLOSE) {
    return 0;
  }
  int unacked = 0;
  if (::ioctl(fd_.get(), SIOCOUTQ, &unacked) != 0) return 0;
  return unacked;
}

absl::Status LinkImpl::CheckLiveness(int64_t now_ms, int64_t dead_after_ms) {
  if (closed_by_peer_.load(std::memory_order_acquire)) return absl::OkStatus();
  if (reader_paused_.load(std::memory_order_acquire)) return absl::OkStatus();
  const int64_t silent_ms = now_ms - last_heard_ms_.load(std::memory_order_relaxed);
  if (silent_ms < dead_after_ms) return absl::OkStatus();
  // Bytes waiting in the socket mean the peer spoke and this host's reader is behind.
  int pending = 0;
  if (::ioctl(fd_.get(), FIONREAD, &pending) == 0 && pending > 0) {
    last_heard_ms_.store(now_ms, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                     absl::StrCat("no frame or heartbeat for ", silent_ms, " ms"));
}

void LinkImpl::SendControl(FrameType type, std::string_view payload, int64_t deadline_ms) {
  if (closed_by_peer_.load(std::memory_order_acquire)) return;
  FrameHeader header;
  header.type = type;
  header.payload_size = static_cast<uint32_t>(payload.size());
  char encoded[kFrameHeaderSize];
  EncodeFrameHeader(header, encoded);
  absl::MutexLock lock(&send_mu_);
  if (broken_) {
    // A frame was cut off: the peer cannot parse what follows; EOF tells it instead.
    ::shutdown(fd_.get(), SHUT_WR);
    return;
  }
  size_t written = 0;
  const absl::Status status =
      WriteFrameLocked(encoded, payload, deadline_ms, /*cancellable=*/false, &written);
  if (!status.ok()) ::shutdown(fd_.get(), SHUT_WR);
}

}  // namespace ts::sidecar::tcp_internal
