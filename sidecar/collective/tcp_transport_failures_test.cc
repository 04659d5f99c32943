// The TCP transport between real listeners on loopback, in one process: closed, vanished and
// stalled peers, aborts, deadlines and back-pressure. Peers that misbehave are hand-rolled on
// raw sockets.
#include <atomic>
#include <chrono>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/crypto/secp256k1.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/collective/tcp_transport_test_util.h"
#include "sidecar/collective/transport_test_util.h"

namespace ts::sidecar {
namespace {

// Sends `frames` copies of `payload` on `link`, chunk numbers 0, 1, ...; the first failure.
absl::Status SendNumbered(Link* link, int frames, const std::string& payload) {
  FrameHeader h;
  for (int i = 0; i < frames; ++i) {
    h.chunk = static_cast<uint32_t>(i);
    TS_RETURN_IF_ERROR(link->Send(h, payload, Now() + 10000));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Closed, vanished and stalled peers

TEST(TcpTransportTest, ClosedMeshDrainsThenFailsThatLinkOnly) {
  ConnectedGroup g(3);
  ASSERT_TRUE(g.status().ok()) << g.status();
  FrameHeader h;
  ASSERT_TRUE(g.link(2, 0)->Send(h, "last words 1", Now() + 1000).ok());
  ASSERT_TRUE(g.link(2, 0)->Send(h, "last words 2", Now() + 1000).ok());
  // Member 0 waits on member 2 while member 2 finishes and closes (kClose).
  auto recv = std::async(std::launch::async, [&] {
    Link* link = g.link(0, 2);
    std::vector<absl::StatusOr<Frame>> got;
    for (int i = 0; i < 3; ++i) got.push_back(link->Recv(Now() + 5000));
    return got;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int64_t closed_at = Now();
  g.meshes[2].value().reset();
  g.transports[2].reset();
  auto got = recv.get();
  const int64_t took = Now() - closed_at;
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(got[0]->payload, "last words 1");
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[1]->payload, "last words 2");
  ASSERT_FALSE(got[2].ok());
  EXPECT_EQ(got[2].status().code(), absl::StatusCode::kUnavailable) << got[2].status();
  EXPECT_EQ(FailedPeerOf(got[2].status()), g.address(2)) << got[2].status();
  EXPECT_TRUE(Contains(got[2].status(), "closed the link")) << got[2].status();
  EXPECT_LT(took, 1000);
  // The mesh has not failed: the others go on; sending to the closed member is refused.
  EXPECT_TRUE(g.mesh(0)->failure().ok());
  EXPECT_EQ(FailedPeerOf(g.link(0, 2)->Send(h, "x", Now() + 500)), g.address(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kHeartbeatMs));
  ASSERT_TRUE(g.link(1, 0)->Send(h, "still here", Now() + 1000).ok());
  auto f = g.link(0, 1)->Recv(Now() + 1000);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "still here");
  EXPECT_TRUE(g.mesh(0)->failure().ok()) << g.mesh(0)->failure();
  EXPECT_TRUE(g.mesh(1)->failure().ok()) << g.mesh(1)->failure();
}

TEST(TcpTransportTest, ClosingWaitsForQueuedDataToArrive) {
  // Member 0 sends its last frames and closes at once, while most of them still sit in its
  // socket (small buffers, a receiver that reads slowly). The receiver must get every byte
  // and then the close, not a reset.
  TcpTransportOptions o = TestOptions();
  o.socket_buffer_bytes = 256 << 10;
  o.max_queued_bytes = 128 << 10;
  ConnectedGroup g(2, o);
  ASSERT_TRUE(g.status().ok()) << g.status();
  constexpr int kFrames = 20;
  const std::string chunk(64 << 10, 'c');
  auto sender = std::async(std::launch::async, [&] {
    TS_RETURN_IF_ERROR(SendNumbered(g.link(0, 1), kFrames, chunk));
    g.meshes[0].value().reset();  // lingers until the bytes are acknowledged
    g.transports[0].reset();
    return absl::OkStatus();
  });
  Link* link = g.link(1, 0);
  for (int i = 0; i < kFrames; ++i) {
    auto f = link->Recv(Now() + 5000);
    ASSERT_TRUE(f.ok()) << i << ": " << f.status();
    EXPECT_EQ(f->header.chunk, static_cast<uint32_t>(i));
    EXPECT_EQ(f->payload.size(), chunk.size());
    // Slower than the heartbeats this member sends meanwhile (idle link: every 50-75 ms).
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const absl::Status end = link->Recv(Now() + 2000).status();
  EXPECT_TRUE(Contains(end, "closed the link")) << end;
  EXPECT_TRUE(sender.get().ok());
  EXPECT_TRUE(g.mesh(1)->failure().ok()) << g.mesh(1)->failure();
}

TEST(TcpTransportTest, ReceivedAbortIsPassedOn) {
  // Raw member 0 aborts towards member 1 only; member 2 learns of it from member 1.
  TcpTransportOptions o = TestOptions();
  o.heartbeat_interval_ms = 5000;  // raw member 0 sends no heartbeats
  o.dead_after_ms = 0;
  RawFirstOfThree f(o);
  ASSERT_TRUE(f.mesh1.ok()) << f.mesh1.status();
  ASSERT_TRUE(f.mesh2.ok()) << f.mesh2.status();
  const GroupSpec& g = f.group;
  auto blocked = std::async(std::launch::async,
                            [&] { return (*f.mesh2)->link(1)->Recv(Now() + 5000).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t at = Now();
  ASSERT_TRUE(f.raw[0].Write(
      FrameOf(FrameType::kAbort, EncodeAbort(g.members[0].address, "NaN in input"))));
  const absl::Status s = blocked.get();
  EXPECT_LT(Now() - at, 500);
  EXPECT_EQ(FailedPeerOf(s), g.members[0].address) << s;
  EXPECT_TRUE(Contains(s, absl::StrCat("aborted by ", g.members[1].address))) << s;
  EXPECT_TRUE(Contains(s, "NaN in input")) << s;
  // Destroying the failed mesh tells the raw member why, instead of closing with a bare EOF.
  f.mesh1->reset();
  std::string reason;
  for (int i = 0; i < 10 && reason.empty(); ++i) {
    auto frame = f.raw[0].ReadFrame(1000);
    if (!frame.ok()) break;
    if (frame->header.type != FrameType::kAbort) continue;
    auto abort = DecodeAbort(frame->payload);
    ASSERT_TRUE(abort.ok());
    reason = abort->reason;
  }
  EXPECT_NE(reason.find("NaN in input"), std::string::npos) << reason;
}

TEST(TcpTransportTest, VanishedPeerFailsTheMeshAtOnce) {
  // Member 0 is raw and dials members 1 and 2 (real transports), then its sockets close
  // without kClose, as a killed process's would.
  RawFirstOfThree f;
  ASSERT_TRUE(f.mesh1.ok()) << f.mesh1.status();
  ASSERT_TRUE(f.mesh2.ok()) << f.mesh2.status();
  const GroupSpec& g = f.group;
  // Member 1 is blocked on member 2 (which sends nothing) when member 0 vanishes.
  auto blocked = std::async(std::launch::async,
                            [&] { return (*f.mesh1)->link(2)->Recv(Now() + 10000).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const int64_t gone_at = Now();
  f.raw.clear();
  const absl::Status s = blocked.get();
  const int64_t took = Now() - gone_at;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(FailedPeerOf(s), g.members[0].address) << s;
  EXPECT_LT(took, 500) << s;
  std::cout << "vanished peer: blocked Recv returned after " << took << " ms: " << s << "\n";
  for (Mesh* m : {f.mesh1->get(), f.mesh2->get()}) {
    const int64_t until = Now() + 1000;
    while (m->failure().ok() && Now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(FailedPeerOf(m->failure()), g.members[0].address) << m->failure();
    // Every later call returns the failure at once.
    FrameHeader h;
    EXPECT_EQ(m->link(0)->Send(h, "x", Now() + 1000), m->failure());
    EXPECT_EQ(m->link(0)->Recv(Now() + 1000).status(), m->failure());
  }
}

TEST(TcpTransportTest, StalledPeerIsDetectedWithinTwoHeartbeatIntervals) {
  TcpTransportOptions o = TestOptions();
  o.heartbeat_interval_ms = 200;
  o.dead_after_ms = 0;  // the default: 1.5 intervals, 300 ms
  RawFixture f(2, 1, o);
  auto connect = f.ConnectAsync();
  // The transport last hears from the raw peer when its hello arrives, after this: time
  // measured from here is at least the peer's silence (and the bound below a strict one).
  const int64_t silent_from = Now();
  RawConn raw = f.Handshake(0);
  auto mesh = connect.get();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const absl::Status s = (*mesh)->link(0)->Recv(Now() + 5000).status();
  const int64_t detected_ms = Now() - silent_from;
  std::cout << "stalled peer detected after " << detected_ms << " ms (heartbeat "
            << o.heartbeat_interval_ms << " ms, dead after 300 ms): " << s << "\n";
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(FailedPeerOf(s), f.group.members[0].address) << s;
  EXPECT_TRUE(Contains(s, "no frame or heartbeat for")) << s;
  EXPECT_GE(detected_ms, 300);
  EXPECT_LE(detected_ms, 2 * o.heartbeat_interval_ms);
  // The stalled peer was sent heartbeats, then an abort that names it.
  int heartbeats = 0;
  while (true) {
    auto frame = raw.ReadFrame(1000);
    ASSERT_TRUE(frame.ok()) << frame.status();
    if (frame->header.type == FrameType::kHeartbeat) {
      ++heartbeats;
      continue;
    }
    ASSERT_EQ(frame->header.type, FrameType::kAbort);
    auto abort = DecodeAbort(frame->payload);
    ASSERT_TRUE(abort.ok()) << abort.status();
    EXPECT_EQ(abort->blamed_address, f.group.members[0].address);
    EXPECT_NE(abort->reason.find("no frame or heartbeat"), std::string::npos) << abort->reason;
    break;
  }
  EXPECT_GE(heartbeats, 1);
}

TEST(TcpTransportTest, HeartbeatsKeepAnIdleMeshAlive) {
  ConnectedGroup g(2);
  ASSERT_TRUE(g.status().ok()) << g.status();
  // Recv with a deadline: DEADLINE_EXCEEDED naming the peer, on time; the mesh stays up.
  const int64_t start = Now();
  const int64_t wait_ms = 5 * kHeartbeatMs;  // longer than dead_after_ms
  const absl::Status s = g.link(0, 1)->Recv(start + wait_ms).status();
  const int64_t took = Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(FailedPeerOf(s), g.address(1));
  EXPECT_GE(took, wait_ms);
  EXPECT_LT(took, wait_ms + 100);
  EXPECT_TRUE(g.mesh(0)->failure().ok()) << g.mesh(0)->failure();
  EXPECT_TRUE(g.mesh(1)->failure().ok()) << g.mesh(1)->failure();
  EXPECT_GE(g.link(0, 1)->bytes_received(), 4 * kFrameHeaderSize);
}

TEST(TcpTransportTest, FullQueuePausesWithoutCountingAsSilence) {
  TcpTransportOptions o = TestOptions();
  o.max_queued_bytes = 256 << 10;
  o.socket_buffer_bytes = 64 << 10;
  ConnectedGroup g(2, o);
  ASSERT_TRUE(g.status().ok()) << g.status();
  // 8 MiB towards a receiver that does not read for longer than dead_after_ms.
  constexpr int kFrames = 64;
  const std::string chunk(128 << 10, 'q');
  auto sender =
      std::async(std::launch::async, [&] { return SendNumbered(g.link(0, 1), kFrames, chunk); });
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * kHeartbeatMs));
  EXPECT_TRUE(g.mesh(0)->failure().ok()) << g.mesh(0)->failure();
  EXPECT_TRUE(g.mesh(1)->failure().ok()) << g.mesh(1)->failure();
  for (int i = 0; i < kFrames; ++i) {
    auto f = g.link(1, 0)->Recv(Now() + 5000);
    ASSERT_TRUE(f.ok()) << i << ": " << f.status();
    EXPECT_EQ(f->header.chunk, static_cast<uint32_t>(i));
    EXPECT_EQ(f->payload.size(), chunk.size());
    g.link(1, 0)->Recycle(std::move(f->payload));
  }
  EXPECT_TRUE(sender.get().ok());
}

TEST(TcpTransportTest, SendDeadlineWhenThePeerDoesNotRead) {
  TcpTransportOptions o = TestOptions();
  o.max_queued_bytes = 64 << 10;
  o.socket_buffer_bytes = 64 << 10;
  RawFixture f(2, 1, o);
  auto connect = f.ConnectAsync();
  RawConn raw = f.Handshake(0);
  auto mesh = connect.get();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  // The raw peer reads nothing, but keeps itself alive with heartbeats.
  std::atomic<bool> done{false};
  std::thread beats([&] {
    while (!done) {
      raw.Write(FrameOf(FrameType::kHeartbeat, ""));
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatMs / 2));
    }
  });
  const std::string chunk(1 << 20, 'z');
  absl::Status s;
  int64_t start = 0;
  for (int i = 0; i < 64 && s.ok(); ++i) {
    start = Now();
    FrameHeader h;
    s = (*mesh)->link(0)->Send(h, chunk, start + 300);
  }
  const int64_t took = Now() - start;
  done = true;
  beats.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(FailedPeerOf(s), f.group.members[0].address) << s;
  EXPECT_GE(took, 300);
  EXPECT_LT(took, 300 + 100);
  // Cut off inside a frame: the link cannot carry more, so the mesh fails with it.
  EXPECT_EQ((*mesh)->failure(), s);
}

TEST(TcpTransportTest, AbortReachesEveryMemberNamingTheBlamedOne) {
  ConnectedGroup g(3);
  ASSERT_TRUE(g.status().ok()) << g.status();
  auto blocked =
      std::async(std::launch::async, [&] { return g.link(1, 0)->Recv(Now() + 10000).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t at = Now();
  g.mesh(0)->Abort(PeerFailure(absl::StatusCode::kDataLoss, g.address(2), "commitment mismatch"));
  const absl::Status s = blocked.get();
  EXPECT_LT(Now() - at, 200);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(FailedPeerOf(s), g.address(2)) << s;
  EXPECT_TRUE(Contains(s, absl::StrCat("aborted by ", g.address(0)))) << s;
  EXPECT_TRUE(Contains(s, "commitment mismatch")) << s;
  EXPECT_EQ(g.mesh(0)->failure().code(), absl::StatusCode::kDataLoss);
  const int64_t until = Now() + 1000;
  while (g.mesh(2)->failure().ok() && Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(FailedPeerOf(g.mesh(2)->failure()), g.address(2));
  // First failure wins.
  g.mesh(0)->Abort(absl::InternalError("later"));
  EXPECT_EQ(g.mesh(0)->failure().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ts::sidecar
