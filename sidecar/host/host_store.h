// The host sidecar's records in RocksDB (state::Db): table names, key encodings, the meta
// values and typed reads. Layout (docs/host-sidecar.md, "Tables"):
//
//   shards             be64(shard_id)            -> HostShardRecord
//   reservations       be64(shard_id)            -> Reservation this host signed
//   weights            be64(epoch)               -> EpochWeights seen (own weight lookups)
//   pending_txs        txhash (upper hex)        -> PendingTx
//   settlement_drafts  be64(shard_id)            -> GetSettlementResponse (draft + signature)
//   events             be64(height) be32(index)  -> FollowedEvent
//   meta               "cursor_height" be64, "address", "chain_id", "events_processed" be64,
//                      "schema_version" "1"
//   artifacts          be64(shard_id) artifact id -> StoredArtifact (sidecar/artifacts/store.h)
//
// Writes are done by HostCore through state::WriteBatch (one synced batch per decision); this
// class only reads, and builds batch entries. The artifacts table is the shards' artifact
// stores' own: HostCore never reads or writes it.
//
// Thread-safety: thread-safe (state::Db is); reads may run on any thread while the owner
// thread writes, and see either all of a batch or none of it.
#ifndef TS_SIDECAR_HOST_HOST_STORE_H_
#define TS_SIDECAR_HOST_HOST_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/host.pb.h"
#include "proto/deterministic.h"
#include "state/db.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

inline constexpr std::string_view kTableShards = "shards";
inline constexpr std::string_view kTableReservations = "reservations";
inline constexpr std::string_view kTableWeights = "weights";
inline constexpr std::string_view kTablePendingTxs = "pending_txs";
inline constexpr std::string_view kTableSettlementDrafts = "settlement_drafts";
inline constexpr std::string_view kTableEvents = "events";
inline constexpr std::string_view kTableMeta = "meta";

inline constexpr std::string_view kMetaCursorHeight = "cursor_height";
inline constexpr std::string_view kMetaAddress = "address";
inline constexpr std::string_view kMetaChainId = "chain_id";
inline constexpr std::string_view kMetaEventsProcessed = "events_processed";
inline constexpr std::string_view kMetaSchemaVersion = "schema_version";
// gonka-v0: the height from which the host's next opt-in refresh is due (EncodeU64Key).
inline constexpr std::string_view kMetaGonkaOptInDue = "gonka_opt_in_due";

inline constexpr uint32_t kHostSchemaVersion = 1;

std::string ShardKey(uint64_t shard_id);
std::string EventKey(int64_t height, uint32_t index);

class HostStore {
 public:
  // Opens (creating if missing) the database at `path` with the tables above. `clock` (the
  // system clock when null) times the database's recovery from write errors; `disk_full_fault`
  // is for tests (state::DbOptions). Errors as state::Db::Open.
  static absl::StatusOr<std::unique_ptr<HostStore>> Open(
      const std::string& path, common::Clock* clock = nullptr,
      std::shared_ptr<state::DiskFullFault> disk_full_fault = nullptr);

  state::Db& db() { return *db_; }

  // Last height whose events are fully processed; 0 for a new database.
  // DATA_LOSS if the stored value is malformed.
  absl::StatusOr<int64_t> CursorHeight() const;
  absl::StatusOr<uint64_t> EventsProcessed() const;
  // Empty if not yet set.
  absl::StatusOr<std::string> MetaString(std::string_view key) const;

  // NOT_FOUND if absent; DATA_LOSS if unparsable.
  absl::StatusOr<pb::HostShardRecord> GetShard(uint64_t shard_id) const;
  absl::StatusOr<std::vector<pb::HostShardRecord>> ListShards(size_t limit) const;
  absl::StatusOr<std::vector<pb::FollowedEvent>> ListEvents(int64_t from_height,
                                                            size_t limit) const;
  absl::StatusOr<std::vector<pb::PendingTx>> ListPendingTxs() const;
  // NOT_FOUND if this host signed no draft for the shard.
  absl::StatusOr<pb::GetSettlementResponse> GetSettlementDraft(uint64_t shard_id) const;

 private:
  explicit HostStore(std::unique_ptr<state::Db> db) : db_(std::move(db)) {}
  std::unique_ptr<state::Db> db_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_HOST_STORE_H_
