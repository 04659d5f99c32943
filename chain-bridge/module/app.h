// The trainshard chain application: a deterministic state machine shaped like an ABCI
// application (CheckTx / FinalizeBlock / Commit), holding the bank, PoC weight records,
// governance and trainshard modules. Same genesis and same blocks give the same app hash after
// every block; nothing in it reads time, randomness, files or sockets.
//
// State is an ordered key-value map held in memory; each block's changes are returned as a
// change set so the caller (the devnet node) can persist them atomically with the block.
//
// Thread-safety: not thread-safe. One owner thread calls everything; queries included.
#ifndef TS_CHAIN_BRIDGE_MODULE_APP_H_
#define TS_CHAIN_BRIDGE_MODULE_APP_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cosmos/base/abci/v1beta1/abci.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "inference/inference/trainshard.pb.h"
#include "tendermint/abci/types.pb.h"
#include "tendermint/types/types.pb.h"

namespace ts::bridge {

// Txs in one block at most (each also capped at kMaxTxBytes); FinalizeBlock refuses more.
inline constexpr size_t kMaxTxsPerBlock = 100'000;

namespace pb = ::gonka::trainshard::v1;

// One key's new value in a block; nullopt means deleted.
struct StateChange {
  std::string key;
  std::optional<std::string> value;
};

struct BlockOutcome {
  pb::BlockResults results;          // height, per-tx responses, end-block events, app hash
  std::vector<StateChange> changes;  // sorted by key; apply to persist the state after the block
};

class App {
 public:
  // A fresh chain at height 0. INVALID_ARGUMENT naming the field for a bad genesis.
  static absl::StatusOr<std::unique_ptr<App>> InitChain(const pb::Genesis& genesis);

  // A chain restored from persisted state (the full key-value map after `height`) and the app
  // hash after `height`. The genesis must be the one the chain started from.
  static absl::StatusOr<std::unique_ptr<App>> Restore(const pb::Genesis& genesis,
                                                      std::map<std::string, std::string> state,
                                                      int64_t height, std::string app_hash);

  // Validates a tx against the state after the last commit plus the txs already accepted since
  // (decode, size caps, signature, sequence, and a dry run of its messages). Code 0 = accepted.
  // Accepted txs advance the check state's sequences, so several txs of one account may queue.
  cosmos::base::abci::v1beta1::TxResponse CheckTx(std::string_view tx_bytes);

  // Runs a tx as the SDK's Simulate does, over the check state, and drops its writes: the
  // signature is not checked (its gas is charged all the same), may be empty, and the sign mode
  // may be unspecified; no gas limit or minimum fee applies; a fee given is paid. The response
  // carries gas_used, the events, and a non-zero code for a tx that would fail.
  cosmos::base::abci::v1beta1::TxResponse Simulate(std::string_view tx_bytes);

  // Executes a block: header.height must be height()+1. Each tx runs in its own branch; a
  // failing tx leaves no state change except its signer's sequence bump (as Cosmos), and is
  // reported with its code and log. Then the end-block logic runs (tallies, expiries).
  // The outcome's app hash = SHA256(previous app hash || height || SHA256(sorted changes)).
  absl::StatusOr<BlockOutcome> FinalizeBlock(const tendermint::types::Header& header,
                                             const std::vector<std::string>& txs);

  // Makes the last finalized block's state the base for the next CheckTx calls.
  void Commit();

  int64_t height() const;
  const std::string& app_hash() const;  // 32 bytes; all zeros at height 0
  const pb::Genesis& genesis() const;
  std::string chain_id() const;

  // Queries against the last finalized state. NOT_FOUND for unknown ids.
  absl::StatusOr<pb::Shard> GetShard(uint64_t shard_id) const;
  std::vector<pb::Shard> ListShards(pb::ShardStatus status, uint64_t start_after_id,
                                    uint32_t limit) const;
  absl::StatusOr<pb::SettlementRecord> GetSettlement(uint64_t shard_id) const;
  // Gonka's trainshards v0 queries, over the committed state (found = false for an unknown id,
  // as Gonka answers). FAILED_PRECONDITION on a chain without the gonka-v0 profile.
  absl::StatusOr<inference::inference::QueryGetTrainshardResponse> GonkaTrainshard(
      uint64_t id) const;
  absl::StatusOr<inference::inference::QueryActiveTrainshardsResponse> GonkaActiveTrainshards()
      const;
  absl::StatusOr<inference::inference::QueryGetTrainshardProposalResponse> GonkaProposal(
      uint64_t id) const;
  absl::StatusOr<pb::EpochWeights> GetWeights(uint64_t epoch) const;
  // The epoch whose weights are in force at the latest height (latest recorded <= current).
  uint64_t CurrentEpoch() const;
  absl::StatusOr<pb::Proposal> GetProposal(uint64_t proposal_id) const;
  uint64_t Balance(std::string_view address) const;
  uint64_t TotalSupply() const;
  // account_number and sequence; NOT_FOUND for an account that never appeared.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Account(std::string_view address) const;
  std::string AccountPublicKey(std::string_view address) const;  // empty if not yet known
  std::string GovAddress() const;
  std::string FeeCollectorAddress() const;
  std::string EscrowAddress() const;

  // The whole state map (for tests and consistency checks).
  const std::map<std::string, std::string>& state() const;

  ~App();

 private:
  struct Impl;
  explicit App(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_APP_H_
