#include "sidecar/peer/shard_directory.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/status.h"

namespace ts::sidecar {
namespace {

// A directory caches at most this many shards; a flood of requests naming shards that do not
// exist must not grow it without bound.
constexpr size_t kMaxCachedShards = 1024;

// Members keep their artifacts after the shard closes: the final checkpoint of a settled shard
// is fetched then. Only shards that never had members are refused.
absl::Status CheckServing(const ShardView& view) {
  switch (view.status) {
    case pb::SHARD_STATUS_OPEN:
    case pb::SHARD_STATUS_RUNNING:
    case pb::SHARD_STATUS_SETTLED:
    case pb::SHARD_STATUS_EXPIRED:
      return absl::OkStatus();
    default:
      return absl::FailedPreconditionError(absl::StrCat("shard ", view.shard_id, " is ",
                                                        pb::ShardStatus_Name(view.status),
                                                        ", it has no members"));
  }
}

absl::Status NotMember(uint64_t shard_id, std::string_view address) {
  return absl::PermissionDeniedError(absl::StrCat(
      "host ", absl::CHexEscape(common::AsAbsl(address)), " is not a member of shard ", shard_id));
}

absl::Status ShardNotFound(uint64_t shard_id) {
  return absl::NotFoundError(absl::StrCat("shard ", shard_id, ": not found"));
}

bool ChainUnreachable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

}  // namespace

const ShardMember* ShardView::Find(std::string_view address) const {
  for (const ShardMember& member : members) {
    if (member.address == address) return &member;
  }
  return nullptr;
}

ShardView ShardViewFromChain(const pb::Shard& shard) {
  ShardView view;
  view.shard_id = shard.id();
  view.status = shard.status();
  view.members.reserve(shard.reservations_size());
  for (const pb::Reservation& r : shard.reservations()) {
    view.members.push_back(ShardMember{r.host(), r.endpoint(), r.frozen_weight()});
  }
  view.quota_bytes_max = shard.spec().artifact_quota().bytes_max();
  view.quota_files_max = shard.spec().artifact_quota().files_max();
  return view;
}

// ---------------------------------------------------------------------------------------------
// ChainShardDirectory

ChainShardDirectory::ChainShardDirectory(bridge::ChainClient* chain, common::Clock* clock,
                                         ChainShardDirectoryOptions options)
    : chain_(chain), clock_(clock), options_(options) {}

absl::StatusOr<ShardView> ChainShardDirectory::Fetch(uint64_t shard_id) {
  const int64_t now = clock_->MonotonicMs();
  absl::StatusOr<pb::Shard> shard = chain_->Shard(shard_id);
  ShardView view;
  if (shard.ok()) {
    if (shard->id() != shard_id) {
      return absl::InternalError(
          absl::StrCat("chain answered shard ", shard->id(), " when asked for shard ", shard_id));
    }
    view = ShardViewFromChain(*shard);
  } else if (absl::IsNotFound(shard.status())) {
    // Remembered (status UNSPECIFIED, which the chain never records) for min_refresh_ms, so
    // requests naming a shard that does not exist do not each cost a chain query.
    view.shard_id = shard_id;
  } else {
    auto it = cache_.find(shard_id);
    if (!ChainUnreachable(shard.status()) || it == cache_.end() ||
        it->second.view.status == pb::SHARD_STATUS_UNSPECIFIED) {
      return shard.status();
    }
    // A chain that cannot be reached does not make a known shard unknown: the last view is
    // served, and the chain asked again only after another ttl, so a node restart neither
    // refuses every peer nor stalls each request on a chain call that times out.
    it->second.fetched_ms = now;
    return it->second.view;
  }
  if (cache_.size() >= kMaxCachedShards && !cache_.contains(shard_id)) {
    absl::erase_if(cache_, [&](const auto& entry) {
      return now - entry.second.fetched_ms >= options_.ttl_ms ||
             entry.second.view.status == pb::SHARD_STATUS_UNSPECIFIED;
    });
  }
  if (cache_.size() < kMaxCachedShards || cache_.contains(shard_id)) {
    cache_[shard_id] = Entry{view, now};
  }
  if (view.status == pb::SHARD_STATUS_UNSPECIFIED) return ShardNotFound(shard_id);
  return view;
}

absl::StatusOr<ShardView> ChainShardDirectory::Get(uint64_t shard_id) {
  absl::MutexLock lock(&mu_);
  auto it = cache_.find(shard_id);
  if (it != cache_.end()) {
    const int64_t age_ms = clock_->MonotonicMs() - it->second.fetched_ms;
    if (it->second.view.status == pb::SHARD_STATUS_UNSPECIFIED) {
      if (age_ms < options_.min_refresh_ms) return ShardNotFound(shard_id);
    } else if (age_ms < options_.ttl_ms) {
      return it->second.view;
    }
  }
  return Fetch(shard_id);
}

absl::Status ChainShardDirectory::CheckMember(uint64_t shard_id, std::string_view address) {
  TS_ASSIGN_OR_RETURN(ShardView view, Get(shard_id));
  if (view.Find(address) == nullptr) {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(shard_id);
    // A host that reserved since the last read is recognised on its first request; others
    // cost at most one chain query per min_refresh_ms.
    if (it == cache_.end() ||
        clock_->MonotonicMs() - it->second.fetched_ms >= options_.min_refresh_ms) {
      TS_ASSIGN_OR_RETURN(view, Fetch(shard_id));
    } else if (it->second.view.status == pb::SHARD_STATUS_UNSPECIFIED) {
      return ShardNotFound(shard_id);
    } else {
      view = it->second.view;  // another request may have refreshed it meanwhile
    }
  }
  TS_RETURN_IF_ERROR(CheckServing(view));
  if (view.Find(address) == nullptr) return NotMember(shard_id, address);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// StaticShardDirectory

void StaticShardDirectory::Set(ShardView view) {
  absl::MutexLock lock(&mu_);
  uint64_t id = view.shard_id;
  views_[id] = std::move(view);
}

absl::StatusOr<ShardView> StaticShardDirectory::Get(uint64_t shard_id) {
  absl::MutexLock lock(&mu_);
  auto it = views_.find(shard_id);
  if (it == views_.end()) return ShardNotFound(shard_id);
  return it->second;
}

absl::Status StaticShardDirectory::CheckMember(uint64_t shard_id, std::string_view address) {
  TS_ASSIGN_OR_RETURN(ShardView view, Get(shard_id));
  TS_RETURN_IF_ERROR(CheckServing(view));
  if (view.Find(address) == nullptr) return NotMember(shard_id, address);
  return absl::OkStatus();
}

}  // namespace ts::sidecar
