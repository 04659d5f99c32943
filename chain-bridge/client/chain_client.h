// ChainClient: what a host sidecar needs from a chain, as one small interface over plain values,
// so the devnet and a real Gonka node (Cosmos SDK gRPC) are served by the same client and tests
// may substitute a fake. GrpcChainClient is the real implementation over the Cosmos services
// (cosmos.tx.v1beta1.Service, cosmos.auth.v1beta1.Query, cosmos.bank.v1beta1.Query) and the
// module's gonka.trainshard.v1.Query.
//
// Every call has a deadline (ChainClientOptions::call_timeout_ms) and returns UNAVAILABLE or
// DEADLINE_EXCEEDED when the chain cannot be reached; the caller decides whether to retry.
// Thread-safety: implementations are thread-safe.
#ifndef TS_CHAIN_BRIDGE_CLIENT_CHAIN_CLIENT_H_
#define TS_CHAIN_BRIDGE_CLIENT_CHAIN_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "cosmos/base/abci/v1beta1/abci.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "google/protobuf/any.pb.h"
#include "tendermint/abci/types.pb.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace ts::bridge {

namespace pb = ::gonka::trainshard::v1;

struct ChainStatus {
  std::string chain_id;
  int64_t latest_height = 0;
  std::string app_hash;
  uint64_t epoch = 0;
};

struct AccountInfo {
  uint64_t account_number = 0;
  uint64_t sequence = 0;
};

struct ChainClientOptions {
  // The node's CometBFT JSON-RPC ("host:port"): when set, EventsAt reads `block_results` there,
  // as from any CometBFT node; empty reads the module's Query/BlockEvents over gRPC.
  std::string rpc_target;
  int64_t call_timeout_ms = 5000;
  // Retries of a broadcast after a sequence mismatch or UNAVAILABLE, each with a fresh sequence.
  int broadcast_attempts = 5;
  int64_t retry_backoff_ms = 200;
  // Waiting for a broadcast tx to be included in a block.
  int64_t inclusion_timeout_ms = 30000;
};

class ChainClient {
 public:
  virtual ~ChainClient() = default;

  virtual absl::StatusOr<ChainStatus> Status() = 0;
  // All events at `height`, in order (each tx's events, then end-block events). NOT_FOUND past
  // the latest height.
  virtual absl::StatusOr<std::vector<tendermint::abci::Event>> EventsAt(int64_t height) = 0;
  // NOT_FOUND if the account never appeared on chain.
  virtual absl::StatusOr<AccountInfo> Account(const std::string& address) = 0;
  virtual absl::StatusOr<uint64_t> Balance(const std::string& address) = 0;
  virtual absl::StatusOr<pb::Shard> Shard(uint64_t shard_id) = 0;
  virtual absl::StatusOr<std::vector<pb::Shard>> Shards(pb::ShardStatus status) = 0;
  virtual absl::StatusOr<pb::EpochWeights> Weights(uint64_t epoch, bool current) = 0;
  virtual absl::StatusOr<pb::Proposal> Proposal(uint64_t proposal_id) = 0;
  virtual absl::StatusOr<pb::QueryEscrowResponse> Escrow(uint64_t shard_id) = 0;
  virtual absl::StatusOr<pb::SettlementRecord> Settlement(uint64_t shard_id) = 0;
  virtual absl::StatusOr<pb::QueryParamsResponse> Params() = 0;

  // Broadcasts already-signed tx bytes (sync mode). The response's code tells whether the chain
  // accepted it into its mempool; a non-zero code is returned as OK with that response.
  virtual absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> BroadcastRaw(
      const std::string& tx_bytes) = 0;
  // Simulates a tx (one BuildSimulateTx built) against the chain's pending state: the response
  // carries gas_used, and a non-zero code with its log for a tx the chain would refuse.
  virtual absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> Simulate(
      const std::string& tx_bytes) = 0;

  // NOT_FOUND until the tx is in a block.
  virtual absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> GetTx(
      const std::string& txhash) = 0;

  // Signs `msgs` with `key` (account number and sequence fetched from the chain, fee and gas
  // as BuildPaidTx), broadcasts,
  // retries with a fresh sequence on a sequence mismatch, and, if `wait` is set, waits until the
  // tx is in a block and returns its delivered response (whose code may be non-zero).
  virtual absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> SignAndBroadcast(
      const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs, bool wait) = 0;
};

// What a client asks for: the gas a simulation used times kGasAdjustmentPercent / 100 plus
// kGasMargin (a simulated tx lacks its signature and fee bytes, and the state may move before
// delivery); kDefaultGasLimit when the chain refuses the simulation.
inline constexpr uint64_t kGasAdjustmentPercent = 130;
inline constexpr uint64_t kGasMargin = 5000;
inline constexpr uint64_t kDefaultGasLimit = 200000;

// Builds and signs `msgs` paying for their gas, as Cosmos clients do with "auto" gas: simulates
// them, asks for the gas above, and pays the chain's minimum gas price (Params) for it. A
// simulation the chain refuses (a sequence mismatch, a message it would reject) falls back to
// kDefaultGasLimit, so that the broadcast reports the refusal as any tx's. Errors: the chain's
// (UNAVAILABLE, DEADLINE_EXCEEDED) from Simulate or Params, INVALID_ARGUMENT for a minimum gas
// price that does not parse. `min_gas_limit` is a floor on the limit asked: a tx that ran out
// of gas is signed again above what it used (GasToAsk).
absl::StatusOr<std::string> BuildPaidTx(ChainClient& chain, const common::PrivateKey& key,
                                        const std::string& chain_id, uint64_t account_number,
                                        uint64_t sequence,
                                        const std::vector<google::protobuf::Any>& msgs,
                                        uint64_t min_gas_limit = 0);

// The limit to ask for a tx whose simulation used `gas_used`, or that ran out of gas after
// using it: the client's margin above, at most kMaxTxGas.
uint64_t GasToAsk(int64_t gas_used);

// Connects (lazily) to `target` ("host:port"). Never fails at construction.
std::unique_ptr<ChainClient> NewGrpcChainClient(const std::string& target,
                                                ChainClientOptions options = {});
// The same over a channel the caller shares (one connection for its own queries and these).
std::unique_ptr<ChainClient> NewGrpcChainClient(std::shared_ptr<grpc::Channel> channel,
                                                ChainClientOptions options = {});
// The channel both forms use to `target`: insecure, receiving messages of up to 16 MiB.
std::shared_ptr<grpc::Channel> NewChainChannel(const std::string& target);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_CLIENT_CHAIN_CLIENT_H_
