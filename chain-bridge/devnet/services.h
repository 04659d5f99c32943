// The devnet's gRPC services (internal to ts_bridge_devnet): cosmos.tx.v1beta1.Service (Simulate
// included), cosmos.auth.v1beta1.Query, cosmos.bank.v1beta1.Query, gonka.trainshard.v1.Query,
// cosmos.base.tendermint.v1beta1.Service (node info, syncing, blocks, validator sets),
// cosmos.base.node.v1beta1.Service (the minimum gas price) and inference.inference.Query (Gonka's
// trainshards v0, in the gonka-v0 profile), written against the small Backend interface the node
// implements, so the RPC edge (request checks, caps, status mapping) stays apart from block
// production.
//
// Thread-safety: the services are called on gRPC's threads; Backend implementations must be
// thread-safe.
#ifndef TS_CHAIN_BRIDGE_DEVNET_SERVICES_H_
#define TS_CHAIN_BRIDGE_DEVNET_SERVICES_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/impl/service_type.h>

#include "absl/status/statusor.h"
#include "chain-bridge/module/app.h"
#include "cosmos/base/abci/v1beta1/abci.pb.h"
#include "cosmos/tx/v1beta1/service.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"

namespace ts::bridge::devnet {

// Shards listed by one Query/Shards call at most.
inline constexpr uint32_t kShardsPageMax = 100;
// Decoded txs returned by one GetBlockWithTxs call at most (the raw block is always whole).
inline constexpr uint64_t kBlockTxsPageMax = 100;

class Backend {
 public:
  virtual ~Backend() = default;

  // Runs CheckTx and, on code 0, queues the tx. SYNC and ASYNC return the CheckTx response;
  // BLOCK then waits (until `deadline` at most) for the tx to be in a block and returns its
  // delivered response. A full mempool or a tx already queued is a response with code
  // RESOURCE_EXHAUSTED (8) or ALREADY_EXISTS (6). Errors: RESOURCE_EXHAUSTED when the BLOCK
  // waiters are at their cap,
  // DEADLINE_EXCEEDED when BLOCK mode times out, ABORTED when a queued tx was dropped by a
  // recheck, UNAVAILABLE when the node is stopping or cannot produce blocks.
  virtual absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> Broadcast(
      std::string tx_bytes, cosmos::tx::v1beta1::BroadcastMode mode,
      std::chrono::system_clock::time_point deadline) = 0;

  // App::Simulate over the check state. UNAVAILABLE if the node stopped producing blocks.
  virtual absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> Simulate(
      std::string_view tx_bytes) = 0;

  // The stored block at `height`; NOT_FOUND past the latest height, DATA_LOSS if unreadable.
  virtual absl::StatusOr<std::shared_ptr<const pb::StoredBlock>> Block(int64_t height) = 0;
  // Where the tx with this 32-byte SHA-256 was included; NOT_FOUND until it is.
  virtual absl::StatusOr<std::pair<std::shared_ptr<const pb::StoredBlock>, uint32_t>> FindTx(
      std::string_view tx_hash) = 0;

  // Runs `fn` with the App locked, for queries, once the latest committed block is durable.
  // `fn` must not call back into the Backend. UNAVAILABLE if the node stopped producing blocks.
  virtual absl::Status WithApp(const std::function<void(const App&)>& fn) = 0;
};

// The delivered TxResponse of tx `index` of `block`, completed as Cosmos returns it from GetTx:
// height, txhash, timestamp and the decoded tx (as Any of cosmos.tx.v1beta1.Tx).
cosmos::base::abci::v1beta1::TxResponse DeliveredTxResponse(const pb::StoredBlock& block,
                                                            uint32_t index);

// The seven services, ready for grpc::ServerBuilder::RegisterService. `backend` must outlive
// them.
std::vector<std::unique_ptr<grpc::Service>> MakeServices(Backend* backend);

// A genesis min_gas_price ("0.002") as the SDK's node Config prints it
// ("0.002000000000000000ngonka"); "" for a price of zero or one that does not parse.
std::string MinimumGasPriceText(std::string_view min_gas_price);

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_SERVICES_H_
