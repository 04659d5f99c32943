// AbciServer: the chain's App served as an ABCI 2.0 application (CometBFT v0.38, "ABCI++") over
// CometBFT's socket protocol, so a CometBFT node — with as many validators as it likes — can run
// the module in place of the devnet's own block producer. What each request does is AbciApp's
// (abci_app.h); this file is the transport: framing (abci_wire.h), connections and bounds.
//
// A connection carries length-prefixed Requests and gets length-prefixed Responses in the same
// order. Responses are written at the latest when the server has no complete request left to
// serve and would wait for more bytes, so a ResponseFlush follows everything answered before it.
// CometBFT opens four connections (consensus, mempool, query, snapshot); each gets one thread.
//
// Bounds, each answered without harm to the other connections:
// - connections: at most max_connections at once; one more gets a ResponseException and is
//   closed.
// - message length: the varint is read first; a length over max_message_bytes, or a malformed
//   varint (over 10 bytes, past 64 bits, or padded), or a Request that does not parse gets a
//   ResponseException, and the connection is closed (its framing cannot be trusted any more).
// - time: a connection may stay idle between requests for as long as it likes (CometBFT's query
//   and snapshot connections often do), but once a request's first byte has arrived the rest
//   must follow within message_timeout_ms, and a client must take its responses within
//   write_timeout_ms; otherwise it is closed. The App's mutex is never held while reading or
//   writing, so a slow client holds only its own thread.
// - errors from the App (a wrong height, a request out of order) are ResponseExceptions, after
//   which the connection is closed, as CometBFT's own server does.
//
// The socket is meant for a CometBFT node on the same host (loopback or a unix socket): the
// bounds keep a stray client from exhausting memory or threads, not from occupying the
// connections.
//
// Thread-safety: thread-safe. Shutdown (also run by the destructor) waits for every connection
// thread.
#ifndef TS_CHAIN_BRIDGE_DEVNET_ABCI_SERVER_H_
#define TS_CHAIN_BRIDGE_DEVNET_ABCI_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "chain-bridge/devnet/abci_app.h"
#include "common/clock.h"
#include "gonka/trainshard/v1/chain.pb.h"

namespace ts::bridge::devnet {

inline constexpr int kAbciMaxConnections = 8;
// A block of txs at most: FinalizeBlock and PrepareProposal are the largest requests.
inline constexpr size_t kAbciMaxMessageBytes = 64 << 20;

struct AbciServerOptions {
  // "host:port" or "tcp://host:port" (port 0 picks a free one), or "unix:///absolute/path".
  std::string listen_address = "127.0.0.1:26658";
  int max_connections = kAbciMaxConnections;
  size_t max_message_bytes = kAbciMaxMessageBytes;
  // From a request's first byte to its last.
  int64_t message_timeout_ms = 30000;
  // For the client to take what the server writes.
  int64_t write_timeout_ms = 30000;
  AbciAppOptions app;
  // For the deadlines above; nullptr means the system clock. Not owned.
  common::Clock* clock = nullptr;
};

class AbciServer {
 public:
  // Checks the genesis (AbciApp::Create), binds and starts accepting. INVALID_ARGUMENT naming
  // the option for a bad address or bound, or naming the genesis's field; UNAVAILABLE (with
  // errno's text) when the address cannot be bound, or a unix socket path is served by a live
  // process.
  static absl::StatusOr<std::unique_ptr<AbciServer>> Start(pb::Genesis genesis,
                                                           AbciServerOptions options = {});
  ~AbciServer();

  AbciServer(const AbciServer&) = delete;
  AbciServer& operator=(const AbciServer&) = delete;

  // Stops accepting, closes every connection (a request being handled completes first) and
  // removes the unix socket file. Idempotent.
  void Shutdown();

  // "host:port" bound, or "unix:///path" as given.
  std::string listen_address() const;
  // Connections being served now.
  int connections() const;
  // The last committed height.
  int64_t committed_height() const;

 private:
  struct Impl;
  explicit AbciServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_ABCI_SERVER_H_
