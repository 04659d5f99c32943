// The devnet node: runs the chain App locally as a single block producer, persists every block in
// RocksDB (state/), and serves the Cosmos gRPC services (cosmos.tx.v1beta1.Service,
// cosmos.auth.v1beta1.Query, cosmos.bank.v1beta1.Query) and the module's gonka.trainshard.v1.Query
// on a loopback address. Storage layout, block production and the crash-consistency argument are
// in docs/devnet.md.
//
// A home directory holds genesis.json (written once by InitHome), data/ (the RocksDB database)
// and node.addr (the bound "host:port", rewritten at every start).
//
// Thread-safety: DevnetNode is thread-safe; its methods may be called from any thread. Replay and
// InitHome are free functions that must not run on a home a live node has open (the database
// lock makes Replay fail with UNAVAILABLE then).
#ifndef TS_CHAIN_BRIDGE_DEVNET_NODE_H_
#define TS_CHAIN_BRIDGE_DEVNET_NODE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "gonka/trainshard/v1/chain.pb.h"

namespace ts::bridge {

namespace pb = ::gonka::trainshard::v1;

struct DevnetOptions {
  // "host:port"; port 0 picks a free port (the bound one is in node.addr and listen_address()).
  std::string listen_address = "127.0.0.1:0";
  // The CometBFT JSON-RPC and WebSocket ("host:port", docs/devnet.md); empty serves none. The
  // bound address is in rpc.addr and rpc_listen_address().
  std::string rpc_listen_address;
  // A block is produced every interval, with or without txs: end-block deadlines need heights.
  int64_t block_interval_ms = 500;
  // Caps on one block; a block always takes at least one tx when the mempool has one.
  size_t max_block_txs = 5000;
  size_t max_block_bytes = 2 << 20;
  // Txs waiting for a block; a broadcast beyond it is refused with code RESOURCE_EXHAUSTED (8)
  // in its TxResponse, as the chain refuses txs (docs/protocol.md, "Error codes").
  size_t mempool_max_txs = 20000;
  // BROADCAST_MODE_BLOCK waits at most this long (and never past the call's deadline).
  int64_t broadcast_block_timeout_ms = 30000;
  // Concurrent BROADCAST_MODE_BLOCK calls; more are RESOURCE_EXHAUSTED.
  int max_block_waiters = 256;
  // Largest gRPC request accepted.
  int max_receive_message_bytes = 4 << 20;
  // Wall clock for block times; nullptr means the system clock. Not owned.
  common::Clock* clock = nullptr;
};

// Creates `home` if needed and writes <home>/genesis.json (protobuf JSON; temp file, fsync,
// rename). The genesis is first validated by App::InitChain. Errors: ALREADY_EXISTS if
// genesis.json is present, INVALID_ARGUMENT (from InitChain) for a bad genesis, INTERNAL for
// file-system failures.
absl::Status InitHome(const std::string& home, const pb::Genesis& genesis);

// Reads <home>/genesis.json. NOT_FOUND if absent, DATA_LOSS if it does not parse.
absl::StatusOr<pb::Genesis> ReadGenesis(const std::string& home);

// Counters of the work the node did since Open, for benchmarks and operators. Times are wall
// milliseconds spent in each step.
struct DevnetStats {
  int64_t blocks = 0;      // blocks produced
  int64_t block_txs = 0;   // txs in them
  double block_ms = 0;     // whole block: execute, persist, commit, recheck
  double finalize_ms = 0;  // App::FinalizeBlock
  double recheck_ms = 0;   // building the batch, Commit, CheckTx over the mempool
  double persist_ms = 0;   // the synced write (the App's mutex is free meanwhile)
  int64_t rechecked_txs = 0;
  int64_t check_txs = 0;  // CheckTx calls from broadcasts
  double check_ms = 0;    // time in those calls
};

class DevnetNode {
 public:
  // Opens the node's database and restores the App from it (or starts the chain from genesis on
  // a new database). Does not listen yet. Errors: NOT_FOUND (no genesis.json), DATA_LOSS
  // (genesis.json or a stored record does not parse), FAILED_PRECONDITION (the database belongs to
  // another genesis, or its schema differs), UNAVAILABLE (another process has the database open),
  // INVALID_ARGUMENT (bad options), INTERNAL (I/O).
  static absl::StatusOr<std::unique_ptr<DevnetNode>> Open(const std::string& home,
                                                          DevnetOptions options = {});
  // Shuts down if running.
  ~DevnetNode();

  DevnetNode(const DevnetNode&) = delete;
  DevnetNode& operator=(const DevnetNode&) = delete;

  // Binds the gRPC server, writes <home>/node.addr and starts producing blocks. UNAVAILABLE if
  // the address cannot be bound, FAILED_PRECONDITION if already started or shut down.
  absl::Status Start();
  // Stops producing blocks (a block in progress completes and is persisted) and stops the server.
  // Idempotent.
  void Shutdown();

  // "127.0.0.1:PORT" once started; empty before.
  std::string listen_address() const;
  // The JSON-RPC's "host:port" once started; empty before or without one.
  std::string rpc_listen_address() const;
  // Latest persisted height and the app hash after it.
  int64_t height() const;
  std::string app_hash() const;
  std::string chain_id() const;
  // Txs waiting for a block (once a block being written is durable).
  size_t mempool_size() const;
  DevnetStats stats() const;

 private:
  struct Impl;
  explicit DevnetNode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ReplayReport {
  int64_t blocks_replayed = 0;  // blocks re-executed whose results matched
  int64_t latest_height = 0;    // height of the last stored block
  // First height whose stored block, header chain or app hash disagrees with re-execution.
  std::optional<int64_t> first_mismatch_height;
  // What disagreed (empty when everything matched).
  std::string mismatch;
  // The state after the last block equals the stored "state" table and meta app hash.
  bool state_matches = false;

  bool ok() const { return !first_mismatch_height.has_value() && state_matches; }
};

// Re-executes every stored block of `home` on a fresh App from genesis.json and compares each
// block's header chain (last_block_id, data_hash, app_hash = app hash after the previous block)
// and its resulting app hash with what is stored, then the final state with the "state" table.
// A mismatch is reported in the ReplayReport, not as an error. The node must not be running:
// UNAVAILABLE if the database is locked. Other errors: NOT_FOUND (no genesis.json or database),
// FAILED_PRECONDITION (database of another genesis), DATA_LOSS (meta records unreadable).
absl::StatusOr<ReplayReport> Replay(const std::string& home);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_DEVNET_NODE_H_
