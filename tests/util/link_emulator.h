// An emulated wide-area link in user space, for benchmarks and tests on machines where netem is
// not available: a TCP relay on 127.0.0.1 in front of one target endpoint. Every connection
// made to the relay is relayed to the target, and each of its two directions behaves as a link
// of `rate_bytes_per_s` with `latency_ms` of one-way delay: a chunk read at time t leaves the
// link's queue once the bytes before it have (serialization at the rate) and is written to the
// other side latency_ms later. At most max_buffered_bytes wait per direction; past that the relay
// stops reading, so the sender sees TCP back-pressure as on a full link.
//
// Put one in front of each host's listener and hand the relays' endpoints to the dialers: every
// pair of hosts then talks over its own emulated link (both directions shaped).
//
// Thread-safety: thread-safe. Destruction closes the listener and every relayed connection and
// joins the relay's threads.
#ifndef TS_TESTS_UTIL_LINK_EMULATOR_H_
#define TS_TESTS_UTIL_LINK_EMULATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ts::test_util {

struct LinkOptions {
  double rate_bytes_per_s = 12.5e6;  // 100 Mbit/s; > 0
  int64_t latency_ms = 50;           // one-way, >= 0
  // Per direction of a connection; 0: the bandwidth-delay product plus 256 KiB.
  size_t max_buffered_bytes = 0;
};

class LinkEmulator {
 public:
  // Listens on 127.0.0.1 (a kernel-chosen port) and relays to `target` (host:port, IPv4).
  // INVALID_ARGUMENT for a bad target or options; UNAVAILABLE when the listener cannot be made.
  static absl::StatusOr<std::unique_ptr<LinkEmulator>> Start(const std::string& target,
                                                             const LinkOptions& options);
  ~LinkEmulator();
  LinkEmulator(const LinkEmulator&) = delete;
  LinkEmulator& operator=(const LinkEmulator&) = delete;

  // 127.0.0.1:port of the relay.
  std::string endpoint() const;
  // Bytes written to either side so far, both directions of every connection.
  uint64_t bytes_relayed() const;

  struct Impl;

 private:
  explicit LinkEmulator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::test_util

#endif  // TS_TESTS_UTIL_LINK_EMULATOR_H_
