#include "sidecar/peer/shard_directory.h"

#include <algorithm>
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

absl::Status NotReader(uint64_t shard_id, std::string_view address) {
  return absl::PermissionDeniedError(absl::StrCat(absl::CHexEscape(common::AsAbsl(address)),
                                                  " is neither a member nor a reader of shard ",
                                                  shard_id));
}

// The role of `address` in the view, or why it has none.
absl::StatusOr<ShardRole> RoleIn(const ShardView& view, std::string_view address) {
  TS_RETURN_IF_ERROR(CheckServing(view));
  if (view.Find(address) != nullptr) return ShardRole::kMember;
  if (view.IsReader(address)) return ShardRole::kReader;
  return NotReader(view.shard_id, address);
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

bool ShardView::IsReader(std::string_view address) const {
  if (!address.empty() && address == creator) return true;
  return std::find(readers.begin(), readers.end(), address) != readers.end();
}

ShardView ShardViewFromChain(const pb::Shard& shard) {
  ShardView view;
  view.shard_id = shard.id();
  view.status = shard.status();
  view.members.reserve(shard.reservations_size());
  for (const pb::Reservation& r : shard.reservations()) {
    view.members.push_back(
        ShardMember{r.host(), r.endpoint(), r.frozen_weight(), r.tls_cert_sha256()});
  }
  view.quota_bytes_max = shard.spec().artifact_quota().bytes_max();
  view.quota_files_max = shard.spec().artifact_quota().files_max();
  view.creator = shard.creator();
  view.readers.assign(shard.spec().readers().begin(), shard.spec().readers().end());
  return view;
}

// ---------------------------------------------------------------------------------------------
// ChainShardDirectory

ChainShardDirectory::ChainShardDirectory(bridge::ChainClient* chain, common::Clock* clock,
                                         ChainShardDirectoryOptions options)
    : chain_(chain), clock_(clock), options_(options) {
  absl::MutexLock lock(&mu_);
  query_tokens_ = static_cast<double>(std::max<int64_t>(options_.max_chain_queries_per_s, 1));
  query_tokens_ms_ = clock_->MonotonicMs();
}

absl::StatusOr<ShardView> ChainShardDirectory::Answer(const Entry& entry) {
  if (entry.view.status == pb::SHARD_STATUS_UNSPECIFIED) return ShardNotFound(entry.view.shard_id);
  return entry.view;
}

bool ChainShardDirectory::TakeQuery(int64_t now_ms) {
  const double rate = static_cast<double>(std::max<int64_t>(options_.max_chain_queries_per_s, 1));
  if (now_ms > query_tokens_ms_) {
    query_tokens_ = std::min(
        rate, query_tokens_ + rate * static_cast<double>(now_ms - query_tokens_ms_) / 1000);
    query_tokens_ms_ = now_ms;
  }
  if (query_tokens_ < 1) return false;
  query_tokens_ -= 1;
  return true;
}

absl::StatusOr<ShardView> ChainShardDirectory::Store(uint64_t shard_id,
                                                     absl::StatusOr<pb::Shard> shard,
                                                     int64_t now_ms) {
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
    it->second.fetched_ms = now_ms;
    return it->second.view;
  }
  if (cache_.size() >= kMaxCachedShards && !cache_.contains(shard_id)) {
    absl::erase_if(cache_, [&](const auto& entry) {
      return now_ms - entry.second.fetched_ms >= options_.ttl_ms ||
             entry.second.view.status == pb::SHARD_STATUS_UNSPECIFIED;
    });
  }
  if (cache_.size() < kMaxCachedShards || cache_.contains(shard_id)) {
    cache_[shard_id] = Entry{view, now_ms};
  }
  if (view.status == pb::SHARD_STATUS_UNSPECIFIED) return ShardNotFound(shard_id);
  return view;
}

absl::StatusOr<ShardView> ChainShardDirectory::Read(uint64_t shard_id, int64_t max_age_ms) {
  int64_t asked_ms = 0;
  {
    absl::MutexLock lock(&mu_);
    asked_ms = clock_->MonotonicMs();
    auto it = cache_.find(shard_id);
    if (it != cache_.end()) {
      const Entry& entry = it->second;
      const int64_t limit_ms =
          entry.view.status == pb::SHARD_STATUS_UNSPECIFIED ? options_.min_refresh_ms : max_age_ms;
      if (asked_ms - entry.fetched_ms < limit_ms) return Answer(entry);
    }
    if (!TakeQuery(asked_ms)) {
      // Over budget: an old answer is better than none, and no answer costs the chain nothing.
      if (it != cache_.end()) return Answer(it->second);
      return absl::UnavailableError(absl::StrCat(
          "shard ", shard_id, ": not cached, and the chain is asked at most ",
          options_.max_chain_queries_per_s, " times a second (peers name too many shards)"));
    }
  }
  absl::MutexLock chain_lock(&chain_mu_);
  {
    // Another lookup may have read the shard while this one waited for the chain.
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(shard_id);
    if (it != cache_.end() && it->second.fetched_ms >= asked_ms) return Answer(it->second);
    ++chain_queries_;
  }
  absl::StatusOr<pb::Shard> shard = chain_->Shard(shard_id);
  absl::MutexLock lock(&mu_);
  return Store(shard_id, std::move(shard), clock_->MonotonicMs());
}

absl::StatusOr<ShardView> ChainShardDirectory::Get(uint64_t shard_id) {
  return Read(shard_id, options_.ttl_ms);
}

absl::Status ChainShardDirectory::CheckMember(uint64_t shard_id, std::string_view address) {
  TS_ASSIGN_OR_RETURN(ShardView view, Read(shard_id, options_.ttl_ms));
  if (view.Find(address) == nullptr) {
    // A host that reserved since the last read is recognised on its first request; others
    // cost at most one chain query per min_refresh_ms.
    TS_ASSIGN_OR_RETURN(view, Read(shard_id, options_.min_refresh_ms));
  }
  TS_RETURN_IF_ERROR(CheckServing(view));
  if (view.Find(address) == nullptr) return NotMember(shard_id, address);
  return absl::OkStatus();
}

absl::StatusOr<ShardRole> ChainShardDirectory::CheckReader(uint64_t shard_id,
                                                           std::string_view address) {
  TS_ASSIGN_OR_RETURN(ShardView view, Read(shard_id, options_.ttl_ms));
  if (view.Find(address) == nullptr && !view.IsReader(address)) {
    TS_ASSIGN_OR_RETURN(view, Read(shard_id, options_.min_refresh_ms));
  }
  return RoleIn(view, address);
}

uint64_t ChainShardDirectory::chain_queries() const {
  absl::MutexLock lock(&mu_);
  return chain_queries_;
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

absl::StatusOr<ShardRole> StaticShardDirectory::CheckReader(uint64_t shard_id,
                                                            std::string_view address) {
  TS_ASSIGN_OR_RETURN(ShardView view, Get(shard_id));
  return RoleIn(view, address);
}

}  // namespace ts::sidecar
