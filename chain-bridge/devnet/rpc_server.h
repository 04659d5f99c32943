// The devnet's CometBFT JSON-RPC: the HTTP and WebSocket face a Cosmos client (CosmJS, an
// explorer, an indexer) meets on port 26657 of a CometBFT node. JSON-RPC 2.0 over POST (and the
// URI form over GET): health, status, abci_info, abci_query (the node's own gRPC query paths),
// broadcast_tx_sync / _async / _commit, tx, tx_search, block, block_search, block_results,
// blockchain, validators; and /websocket with subscribe / unsubscribe / unsubscribe_all to
// NewBlock and Tx events. Shapes and encodings are CometBFT 0.38's (docs/devnet.md, "CometBFT
// JSON-RPC").
//
// Every request is bounded: its body (kMaxRpcRequestBytes), its read deadline, the page sizes of
// the searches, the WebSocket clients and their subscriptions, and each subscriber's queue of
// unsent events (a client that does not read loses its connection, never the node's memory).
//
// Thread-safety: RpcServer is thread-safe; Publish may be called from any thread.
#ifndef TS_CHAIN_BRIDGE_DEVNET_RPC_SERVER_H_
#define TS_CHAIN_BRIDGE_DEVNET_RPC_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "chain-bridge/devnet/services.h"
#include "gonka/trainshard/v1/chain.pb.h"

namespace ts::bridge::devnet {

// A body holds at most one tx (1 MiB) in base64 and the envelope.
inline constexpr size_t kMaxRpcRequestBytes = 2 << 20;
inline constexpr int kRpcThreads = 24;
// WebSocket clients each hold one of civetweb's threads; the rest serve HTTP.
inline constexpr int kMaxWebsocketClients = 16;
inline constexpr int kMaxSubscriptionsPerClient = 5;
// Events waiting for a slow WebSocket client; past this the client is disconnected.
inline constexpr size_t kMaxPendingEvents = 256;
inline constexpr int kRpcRequestTimeoutMs = 10000;
inline constexpr int64_t kMaxBlockchainRange = 20;

struct RpcServerOptions {
  // "host:port"; port 0 picks a free one.
  std::string listen_address = "127.0.0.1:26657";
  // The node's gRPC address, which abci_query calls with the query's path and bytes.
  std::string grpc_target;
  // Longest wait of broadcast_tx_commit.
  int64_t commit_timeout_ms = 30000;
};

class RpcServer {
 public:
  // Indexes the stored blocks (for tx_search and block_search) and starts serving.
  // UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<RpcServer>> Start(Backend* backend,
                                                          RpcServerOptions options);
  ~RpcServer();

  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // "host:port" bound.
  std::string listen_address() const;

  // A block was committed and persisted: index it and send its events to subscribers.
  void Publish(std::shared_ptr<const pb::StoredBlock> block);

 private:
  struct Impl;
  explicit RpcServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_RPC_SERVER_H_
