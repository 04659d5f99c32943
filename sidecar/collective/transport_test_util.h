// Helpers of the TCP transport's tests (tcp_transport_*test.cc):
// options for loopback meshes, starting transports, connecting every member at once (a whole
// connected group of real transports), and payloads that differ for every sender, receiver and
// frame.
#ifndef TS_SIDECAR_COLLECTIVE_TRANSPORT_TEST_UTIL_H_
#define TS_SIDECAR_COLLECTIVE_TRANSPORT_TEST_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "gtest/gtest.h"
#include "sidecar/collective/tcp_transport.h"

namespace ts::sidecar {
namespace {

constexpr char kChain[] = "trainshard-test";
constexpr int64_t kHeartbeatMs = 100;

inline common::Clock* Clock() { return &common::SystemClock(); }
inline int64_t Now() { return Clock()->MonotonicMs(); }

inline std::string AddressOf(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

inline TcpTransportOptions TestOptions() {
  TcpTransportOptions o;
  o.chain_id = kChain;
  o.heartbeat_interval_ms = kHeartbeatMs;
  // Tests that are not about detection leave a wide margin: the sanitizer build on a busy
  // two-core machine can hold a heartbeat back for tens of milliseconds.
  o.dead_after_ms = 3 * kHeartbeatMs;
  o.handshake_timeout_ms = 2000;
  return o;
}

inline std::unique_ptr<TcpTransport> StartOrDie(const common::PrivateKey& key,
                                                TcpTransportOptions options = TestOptions()) {
  auto t = TcpTransport::Start(key, std::move(options), Clock());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

inline bool Contains(const absl::Status& s, std::string_view text) {
  return absl::StrContains(s.message(), absl::string_view(text.data(), text.size()));
}

// Bytes of a data frame's payload, different for every (from, to, index).
inline std::string Pattern(size_t from, size_t to, size_t index, size_t size) {
  std::string out(size, '\0');
  uint64_t x = (from + 1) * 0x9E3779B97F4A7C15ULL ^ (to + 1) * 0xC2B2AE3D27D4EB4FULL ^ index;
  for (size_t i = 0; i < size; i += sizeof(x)) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, std::min(sizeof(x), size - i));
  }
  return out;
}

// Connects every member of `group` (transports[i] is member i) concurrently; member i starts
// after delays_ms[i].
inline std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> ConnectAll(
    const std::vector<TcpTransport*>& transports, const GroupSpec& group, int64_t deadline_ms,
    const std::vector<int64_t>& delays_ms = {}) {
  std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> out;
  for (size_t i = 0; i < transports.size(); ++i) out.emplace_back(absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < transports.size(); ++i) {
    threads.emplace_back([&, i] {
      if (i < delays_ms.size() && delays_ms[i] > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(delays_ms[i]));
      }
      out[i] = transports[i]->Connect(group, i, deadline_ms);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// n real transports on loopback (member i is transports[i]), connected at once into one mesh
// per member.
struct ConnectedGroup {
  std::vector<common::PrivateKey> keys;
  std::vector<std::unique_ptr<TcpTransport>> transports;
  GroupSpec group;
  std::vector<absl::StatusOr<std::unique_ptr<Mesh>>> meshes;

  explicit ConnectedGroup(size_t n, const TcpTransportOptions& options = TestOptions()) {
    std::vector<TcpTransport*> members;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(common::PrivateKey::Generate());
      transports.push_back(StartOrDie(keys.back(), options));
      members.push_back(transports.back().get());
      group.members.push_back({transports.back()->address(), transports.back()->endpoint()});
    }
    meshes = ConnectAll(members, group, Now() + 5000);
  }

  // OK when every member connected; else the first member's failure.
  absl::Status status() const {
    for (const auto& m : meshes) {
      if (!m.ok()) return m.status();
    }
    return absl::OkStatus();
  }
  Mesh* mesh(size_t i) { return meshes[i].value().get(); }
  Link* link(size_t from, size_t to) { return mesh(from)->link(to); }
  const std::string& address(size_t i) const { return group.members[i].address; }
};

// Waits until `t` has recorded `count` refusals; returns the latest.
inline absl::Status LatestRefusal(TcpTransport* t, size_t count, int64_t timeout_ms = 3000) {
  const int64_t deadline = Now() + timeout_ms;
  while (Now() < deadline) {
    std::vector<absl::Status> r = t->RecentRefusals();
    if (r.size() >= count) return r.back();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_TRANSPORT_TEST_UTIL_H_
