// The devnet's on-disk layout (internal to ts_bridge_devnet): table names, key and value
// encodings, the header hash chain, and readers shared by the node and Replay. The layout is
// specified in docs/devnet.md.
//
// Thread-safety: pure functions, plus readers over a thread-safe state::Db.
#ifndef TS_CHAIN_BRIDGE_DEVNET_STORE_H_
#define TS_CHAIN_BRIDGE_DEVNET_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "state/db.h"
#include "tendermint/types/types.pb.h"

namespace ts::bridge::devnet {

namespace pb = ::gonka::trainshard::v1;

inline constexpr char kStateTable[] = "state";      // App key -> value
inline constexpr char kBlocksTable[] = "blocks";    // be64(height) -> StoredBlock
inline constexpr char kTxsTable[] = "txs";          // SHA-256(tx) -> be64(height) || be32(index)
inline constexpr char kMetaTable[] = "meta";        // see kMeta* keys
inline constexpr char kMempoolTable[] = "mempool";  // be64(arrival number) -> tx bytes

inline constexpr char kMetaLatestHeight[] = "latest_height";  // be64
inline constexpr char kMetaAppHash[] = "app_hash";            // app hash after latest_height
inline constexpr char kMetaGenesisHash[] = "genesis_hash";    // SHA-256 of genesis.json bytes

inline constexpr uint32_t kSchemaVersion = 1;

inline constexpr char kGenesisFile[] = "genesis.json";
inline constexpr char kAddrFile[] = "node.addr";
inline constexpr char kRpcAddrFile[] = "rpc.addr";  // the CometBFT JSON-RPC's bound address
inline constexpr char kDataDir[] = "data";

struct Meta {
  int64_t latest_height = 0;
  std::string app_hash;
  std::string genesis_hash;
};

struct TxLocation {
  int64_t height = 0;
  uint32_t index = 0;
};

// Opens <home>/data with the devnet's tables.
absl::StatusOr<std::unique_ptr<state::Db>> OpenStore(const std::string& home,
                                                     bool create_if_missing);

// NOT_FOUND if the database has no meta yet (never initialised); DATA_LOSS if a meta record is
// malformed.
absl::StatusOr<Meta> ReadMeta(const state::Db& db);

// NOT_FOUND if absent; DATA_LOSS if the stored bytes do not parse or name another height.
absl::StatusOr<pb::StoredBlock> ReadBlock(const state::Db& db, int64_t height);

// NOT_FOUND if the tx (by its 32-byte SHA-256) is in no stored block.
absl::StatusOr<TxLocation> ReadTxLocation(const state::Db& db, std::string_view tx_hash);

// The whole "state" table.
absl::StatusOr<std::map<std::string, std::string>> ReadState(const state::Db& db);

std::string EncodeTxLocation(const TxLocation& loc);
// DATA_LOSS unless 12 bytes.
absl::StatusOr<TxLocation> DecodeTxLocation(std::string_view bytes);

// SHA-256 of the header's deterministic serialization: the next block's last_block_id.hash.
std::string HeaderHash(const tendermint::types::Header& header);
// SHA-256 over the concatenated SHA-256 of each tx, in order (the header's data_hash).
std::string DataHash(const std::vector<std::string>& txs);

// Atomic file replacement: writes `path`.tmp, fsyncs it, renames it over `path`, fsyncs the
// directory. INTERNAL naming the path on failure.
absl::Status WriteFileAtomic(const std::string& path, std::string_view content);
// NOT_FOUND if absent; FAILED_PRECONDITION if not a regular file (a FIFO is refused, not waited
// on) or larger than 256 MiB; INTERNAL on other errors.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_STORE_H_
