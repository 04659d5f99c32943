#include "sidecar/host/host_store.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "sidecar/artifacts/store.h"

namespace ts::sidecar {
namespace {

absl::StatusOr<uint64_t> ReadU64Meta(const state::Db& db, std::string_view key) {
  auto value = db.Get(kTableMeta, key);
  if (absl::IsNotFound(value.status())) return 0;
  if (!value.ok()) return value.status();
  if (value->size() != 8) {
    return absl::DataLossError(absl::StrCat("meta ", absl::string_view(key.data(), key.size()),
                                            ": ", value->size(), " bytes, expected 8"));
  }
  return state::DecodeU64Key(*value);
}

}  // namespace

std::string ShardKey(uint64_t shard_id) { return state::EncodeU64Key(shard_id); }

std::string EventKey(int64_t height, uint32_t index) {
  std::string key = state::EncodeU64Key(static_cast<uint64_t>(height));
  for (int shift = 24; shift >= 0; shift -= 8) key.push_back(static_cast<char>(index >> shift));
  return key;
}

absl::StatusOr<std::unique_ptr<HostStore>> HostStore::Open(
    const std::string& path, common::Clock* clock,
    std::shared_ptr<state::DiskFullFault> disk_full_fault) {
  state::DbOptions options;
  options.clock = clock;
  options.disk_full_fault = std::move(disk_full_fault);
  options.tables = {std::string(kTableShards), std::string(kTableReservations),
                    std::string(kTableWeights), std::string(kTablePendingTxs),
                    std::string(kTableSettlementDrafts), std::string(kTableEvents),
                    std::string(kTableMeta),
                    // Written by the shards' artifact stores (sidecar/artifacts), not by HostCore.
                    // Adding it keeps older data dirs opening: state::Db creates a missing table.
                    std::string(kTableArtifacts),
                    // The shards whose process this host runs (ShardProcesses).
                    "shard_processes",
                    // Written by the shard runs before they moved into shard processes (each
                    // has a database of its own now); kept so older data dirs open.
                    "rounds", "run_specs"};
  options.schema_version = kHostSchemaVersion;
  TS_ASSIGN_OR_RETURN(auto db, state::Db::Open(path, options));
  return std::unique_ptr<HostStore>(new HostStore(std::move(db)));
}

absl::StatusOr<int64_t> HostStore::CursorHeight() const {
  TS_ASSIGN_OR_RETURN(uint64_t v, ReadU64Meta(*db_, kMetaCursorHeight));
  return static_cast<int64_t>(v);
}

absl::StatusOr<uint64_t> HostStore::EventsProcessed() const {
  return ReadU64Meta(*db_, kMetaEventsProcessed);
}

absl::StatusOr<std::string> HostStore::MetaString(std::string_view key) const {
  auto value = db_->Get(kTableMeta, key);
  if (absl::IsNotFound(value.status())) return std::string();
  return value;
}

absl::StatusOr<pb::HostShardRecord> HostStore::GetShard(uint64_t shard_id) const {
  pb::HostShardRecord record;
  TS_RETURN_IF_ERROR(db_->GetProto(kTableShards, ShardKey(shard_id), &record));
  return record;
}

absl::StatusOr<std::vector<pb::HostShardRecord>> HostStore::ListShards(size_t limit) const {
  std::vector<pb::HostShardRecord> out;
  absl::Status parse = absl::OkStatus();
  TS_RETURN_IF_ERROR(db_->Scan(kTableShards, "", [&](std::string_view key, std::string_view v) {
    pb::HostShardRecord record;
    if (!record.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
      parse = absl::DataLossError(
          absl::StrCat("shards: record ", state::DecodeU64Key(key), " does not parse"));
      return false;
    }
    out.push_back(std::move(record));
    return out.size() < limit;
  }));
  TS_RETURN_IF_ERROR(parse);
  return out;
}

absl::StatusOr<std::vector<pb::FollowedEvent>> HostStore::ListEvents(int64_t from_height,
                                                                     size_t limit) const {
  std::vector<pb::FollowedEvent> out;
  if (limit == 0) return out;
  absl::Status parse = absl::OkStatus();
  std::string start = state::EncodeU64Key(static_cast<uint64_t>(from_height < 0 ? 0 : from_height));
  TS_RETURN_IF_ERROR(
      db_->ScanFrom(kTableEvents, "", start, [&](std::string_view, std::string_view v) {
        pb::FollowedEvent event;
        if (!event.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
          parse = absl::DataLossError("events: a row does not parse");
          return false;
        }
        out.push_back(std::move(event));
        return out.size() < limit;
      }));
  TS_RETURN_IF_ERROR(parse);
  return out;
}

absl::StatusOr<std::vector<pb::PendingTx>> HostStore::ListPendingTxs() const {
  std::vector<pb::PendingTx> out;
  absl::Status parse = absl::OkStatus();
  TS_RETURN_IF_ERROR(db_->Scan(kTablePendingTxs, "", [&](std::string_view key, std::string_view v) {
    pb::PendingTx tx;
    if (!tx.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
      parse = absl::DataLossError(absl::StrCat(
          "pending_txs: ", absl::string_view(key.data(), key.size()), " does not parse"));
      return false;
    }
    out.push_back(std::move(tx));
    return true;
  }));
  TS_RETURN_IF_ERROR(parse);
  return out;
}

absl::StatusOr<pb::GetSettlementResponse> HostStore::GetSettlementDraft(uint64_t shard_id) const {
  pb::GetSettlementResponse draft;
  TS_RETURN_IF_ERROR(db_->GetProto(kTableSettlementDrafts, ShardKey(shard_id), &draft));
  return draft;
}

}  // namespace ts::sidecar
