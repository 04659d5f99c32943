#include "sidecar/host/host_core.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/absl_view.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/status.h"
#include "sidecar/host/events.h"

namespace ts::sidecar {
namespace {

using cosmos::base::abci::v1beta1::TxResponse;

constexpr std::string_view kComponent = "host";
constexpr std::string_view kPurposeReservePrefix = "reserve:";
// Stored copies of chain events are capped; decisions use the event as received.
constexpr int kMaxStoredAttributes = 128;
constexpr size_t kMaxStoredValueBytes = 4096;
constexpr size_t kMaxLogBytes = 300;

std::string Truncate(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  return absl::StrCat(common::AsAbsl(s.substr(0, n)), "...");
}

tendermint::abci::Event CappedCopy(const tendermint::abci::Event& event) {
  tendermint::abci::Event copy;
  copy.set_type(Truncate(event.type(), 256));
  int n = std::min(event.attributes_size(), kMaxStoredAttributes);
  for (int i = 0; i < n; ++i) {
    const auto& a = event.attributes(i);
    auto* out = copy.add_attributes();
    out->set_key(Truncate(a.key(), 256));
    out->set_value(Truncate(a.value(), kMaxStoredValueBytes));
    out->set_index(a.index());
  }
  return copy;
}

std::string Ignore(const absl::Status& status) {
  return absl::StrCat("ignore:", Truncate(std::string(status.message()), kMaxLogBytes));
}

// What a broadcast's CheckTx answer means for a pending tx.
enum class CheckOutcome {
  kAccepted,          // in the mempool (or already there): wait for a block
  kRetryLater,        // the chain is busy (mempool full): broadcast again later
  kSequenceMismatch,  // signed with a sequence the chain does not expect: re-sign
  kAlreadyDone,       // the reservation already exists: nothing more to do
  kOutOfGas,          // the state moved after the simulation: re-sign with more gas
  kRefused,           // refused for good
};

bool IsSequenceMismatch(const TxResponse& r) {
  if (r.code() == 32 && (r.codespace() == "sdk" || r.codespace().empty())) return true;
  std::string log = absl::AsciiStrToLower(r.raw_log());
  return absl::StrContains(log, "sequence mismatch") ||
         absl::StrContains(log, "incorrect account sequence") ||
         (absl::StrContains(log, "sequence") && absl::StrContains(log, "expected"));
}

bool MentionsMempool(const TxResponse& r) {
  return absl::StrContains(absl::AsciiStrToLower(r.raw_log()), "mempool");
}

CheckOutcome Classify(const TxResponse& r) {
  if (r.code() == 0) return CheckOutcome::kAccepted;
  if (IsSequenceMismatch(r)) return CheckOutcome::kSequenceMismatch;
  if (MentionsMempool(r)) {
    // "tx already in mempool" / "mempool is full": the chain has it, or will take it later.
    return absl::StrContains(absl::AsciiStrToLower(r.raw_log()), "full") ? CheckOutcome::kRetryLater
                                                                         : CheckOutcome::kAccepted;
  }
  if (r.codespace() == "trainshard" &&
      r.code() == static_cast<uint32_t>(absl::StatusCode::kAlreadyExists)) {
    return CheckOutcome::kAlreadyDone;
  }
  if (r.codespace() == "sdk" && r.code() == static_cast<uint32_t>(bridge::SdkCode::kOutOfGas)) {
    return CheckOutcome::kOutOfGas;
  }
  return CheckOutcome::kRefused;
}

// "expected 7" in a sequence mismatch log: the sequence the chain wants next (a hint only).
uint64_t ExpectedSequenceHint(const TxResponse& r) {
  std::string log = absl::AsciiStrToLower(r.raw_log());
  size_t at = log.find("expected ");
  if (at == std::string::npos) return 0;
  at += 9;
  size_t end = at;
  while (end < log.size() && end - at < 20 && log[end] >= '0' && log[end] <= '9') ++end;
  uint64_t v = 0;
  if (end == at || !absl::SimpleAtoi(absl::string_view(log).substr(at, end - at), &v)) return 0;
  return v;
}

std::string DescribeResponse(const TxResponse& r) {
  return absl::StrCat("code ", r.code(), r.codespace().empty() ? "" : " (", r.codespace(),
                      r.codespace().empty() ? "" : ")", ": ", Truncate(r.raw_log(), kMaxLogBytes));
}

// Sequence a pending tx was signed with; nullopt if its bytes do not decode (never expected:
// the host wrote them itself).
std::optional<uint64_t> TxSequence(const pb::PendingTx& tx) {
  auto decoded = bridge::DecodeTx(tx.tx_bytes());
  if (!decoded.ok() || decoded->auth_info.signer_infos_size() != 1) return std::nullopt;
  return decoded->auth_info.signer_infos(0).sequence();
}

std::optional<uint64_t> ReservePurposeShard(std::string_view purpose) {
  if (!absl::StartsWith(common::AsAbsl(purpose), common::AsAbsl(kPurposeReservePrefix)))
    return std::nullopt;
  uint64_t id = 0;
  if (!absl::SimpleAtoi(common::AsAbsl(purpose.substr(kPurposeReservePrefix.size())), &id)) {
    return std::nullopt;
  }
  return id;
}

bool IsMember(const pb::HostShardRecord& rec, std::string_view host) {
  for (const auto& m : rec.members()) {
    if (m.host() == host) return true;
  }
  return false;
}

bool IsActive(const pb::HostShardRecord& rec) {
  return (rec.reserved() || rec.reservation_sent()) &&
         (rec.status() == pb::SHARD_STATUS_OPEN || rec.status() == pb::SHARD_STATUS_RUNNING);
}

std::string MetaU64(uint64_t v) { return state::EncodeU64Key(v); }

}  // namespace

HostCore::HostCore(std::unique_ptr<HostStore> store, const common::PrivateKey& key,
                   HostCoreOptions options, bridge::ChainClient* chain, common::Clock* clock)
    : store_(std::move(store)),
      key_(key),
      options_(std::move(options)),
      chain_(chain),
      clock_(clock),
      address_(common::AddressFromPublicKey(key.public_key())) {
  if (options_.tls_cert_sha256.empty()) {
    // Placeholder until the shard sidecar serves TLS: deterministic per host, 32 bytes.
    options_.tls_cert_sha256 = common::Sha256(address_);
  }
}

HostCore::~HostCore() = default;

absl::StatusOr<std::unique_ptr<HostCore>> HostCore::Open(const std::string& db_path,
                                                         const common::PrivateKey& key,
                                                         HostCoreOptions options,
                                                         bridge::ChainClient* chain,
                                                         common::Clock* clock) {
  TS_CHECK(chain != nullptr && clock != nullptr);
  if (!options.tls_cert_sha256.empty() && options.tls_cert_sha256.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls_cert_sha256: ", options.tls_cert_sha256.size(), " bytes, expected 32"));
  }
  TS_ASSIGN_OR_RETURN(auto store, HostStore::Open(db_path, clock, options.disk_full_fault));
  std::unique_ptr<HostCore> core(
      new HostCore(std::move(store), key, std::move(options), chain, clock));
  TS_ASSIGN_OR_RETURN(std::string stored, core->store_->MetaString(kMetaAddress));
  if (!stored.empty() && stored != core->address_) {
    return absl::FailedPreconditionError(absl::StrCat("data dir ", db_path,
                                                      " holds the records of ", stored,
                                                      " but the key file is for ", core->address_));
  }
  if (stored.empty()) {
    state::WriteBatch batch;
    batch.Put(kTableMeta, kMetaAddress, core->address_);
    batch.Put(kTableMeta, kMetaSchemaVersion, std::to_string(kHostSchemaVersion));
    TS_RETURN_IF_ERROR(core->store_->db().Write(batch, /*sync=*/true));
  }
  TS_ASSIGN_OR_RETURN(core->chain_id_, core->store_->MetaString(kMetaChainId));
  return core;
}

HostStatusSnapshot HostCore::Snapshot() const {
  HostStatusSnapshot s = last_snapshot_;
  s.address = address_;
  s.chain_id = chain_id_;
  s.chain_height = chain_height_;
  s.current_weight = current_weight_;
  s.last_error = last_error_;
  s.last_error_since_unix_ms = last_error_since_unix_ms_;
  auto cursor = store_->CursorHeight();
  if (cursor.ok()) s.cursor_height = *cursor;
  auto processed = store_->EventsProcessed();
  if (processed.ok()) s.events_processed = *processed;
  auto pending = store_->ListPendingTxs();
  if (pending.ok()) s.pending_txs = static_cast<uint32_t>(pending->size());
  const state::DbHealth health = store_->db().Health();
  s.records_path = store_->db().path();
  s.records_error = std::string(health.error.message());
  s.records_error_since_unix_ms = health.since_unix_ms;
  s.records_recoveries = health.recoveries;
  last_snapshot_ = s;
  return s;
}

absl::Status HostCore::SyncChain() {
  TS_ASSIGN_OR_RETURN(bridge::ChainStatus status, chain_->Status());
  if (status.chain_id.empty() || status.chain_id.size() > 64) {
    return absl::UnavailableError(
        absl::StrCat("chain reports chain id \"", Truncate(status.chain_id, 80), "\""));
  }
  if (chain_id_.empty()) {
    state::WriteBatch batch;
    batch.Put(kTableMeta, kMetaChainId, status.chain_id);
    TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));
    chain_id_ = status.chain_id;
    common::Log(common::LogLevel::kInfo, kComponent, "following chain",
                {{"chain_id", chain_id_}, {"address", address_}});
  } else if (status.chain_id != chain_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("chain id is \"", status.chain_id, "\" but the records were made on \"",
                     chain_id_, "\"; refusing to follow another chain"));
  }
  chain_height_ = std::max(chain_height_, status.latest_height);
  int64_t now = clock_->MonotonicMs();
  if (weight_refreshed_ms_ < 0 ||
      now - weight_refreshed_ms_ >= options_.weight_refresh_interval_ms) {
    auto weights = chain_->Weights(0, /*current=*/true);
    if (weights.ok()) {
      weight_refreshed_ms_ = now;
      current_weight_ = 0;
      for (const auto& w : weights->weights()) {
        if (w.host() == address_) current_weight_ = w.weight();
      }
    }
  }
  return absl::OkStatus();
}

absl::Status HostCore::Step() {
  absl::Status status = SyncChain();
  if (status.ok()) status = Follow(options_.max_heights_per_step).status();
  if (status.ok() && gonka()) status = KeepOptedIn();
  if (status.ok()) status = ProcessPendingTxs();
  if (status.ok()) {
    last_error_.clear();
    last_error_since_unix_ms_ = 0;
  } else {
    if (last_error_since_unix_ms_ == 0) last_error_since_unix_ms_ = clock_->NowUnixMs();
    last_error_ = std::string(status.message());
  }
  return status;
}

absl::StatusOr<int64_t> HostCore::Follow(int64_t max_heights) {
  if (chain_id_.empty()) TS_RETURN_IF_ERROR(SyncChain());
  TS_ASSIGN_OR_RETURN(int64_t cursor, store_->CursorHeight());
  int64_t done = 0;
  while (done < max_heights && cursor + 1 <= chain_height_) {
    TS_RETURN_IF_ERROR(ProcessHeight(cursor + 1));
    ++cursor;
    ++done;
  }
  return done;
}

absl::StatusOr<pb::HostShardRecord*> HostCore::LoadShard(HeightContext& ctx, uint64_t shard_id) {
  auto it = ctx.shards.find(shard_id);
  if (it != ctx.shards.end()) return &it->second;
  pb::HostShardRecord rec;
  auto stored = store_->GetShard(shard_id);
  if (stored.ok()) {
    rec = *std::move(stored);
  } else if (absl::IsNotFound(stored.status())) {
    rec.set_shard_id(shard_id);
  } else {
    return stored.status();
  }
  return &ctx.shards.emplace(shard_id, std::move(rec)).first->second;
}

absl::Status HostCore::ProcessHeight(int64_t height) {
  TS_ASSIGN_OR_RETURN(int64_t cursor, store_->CursorHeight());
  if (height != cursor + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("height ", height, " is not the next one after the cursor ", cursor));
  }
  if (chain_id_.empty()) return absl::UnavailableError("chain id not known yet");
  TS_ASSIGN_OR_RETURN(std::vector<tendermint::abci::Event> events, chain_->EventsAt(height));
  if (events.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::ResourceExhaustedError(absl::StrCat("height ", height, ": too many events"));
  }

  HeightContext ctx;
  ctx.height = height;
  state::WriteBatch batch;
  std::vector<std::pair<uint32_t, std::string>> decisions;
  for (size_t i = 0; i < events.size(); ++i) {
    // A chain error aborts the height before anything is written: the cursor stays, and the
    // whole height is decided again on the next call.
    TS_ASSIGN_OR_RETURN(std::string action, Decide(ctx, events[i]));
    pb::FollowedEvent row;
    row.set_height(height);
    row.set_index(static_cast<uint32_t>(i));
    *row.mutable_event() = CappedCopy(events[i]);
    row.set_action(action);
    batch.PutProto(kTableEvents, EventKey(height, static_cast<uint32_t>(i)), row);
    if (action != "record") decisions.emplace_back(static_cast<uint32_t>(i), std::move(action));
  }
  for (const auto& [id, rec] : ctx.shards) batch.PutProto(kTableShards, ShardKey(id), rec);
  for (const auto& r : ctx.reservations) {
    batch.PutProto(kTableReservations, ShardKey(r.shard_id()), r);
  }
  if (ctx.weights) {
    batch.PutProto(kTableWeights, state::EncodeU64Key(ctx.weights->epoch()), *ctx.weights);
  }
  for (const auto& tx : ctx.new_txs) batch.PutProto(kTablePendingTxs, tx.txhash(), tx);
  TS_ASSIGN_OR_RETURN(uint64_t processed, store_->EventsProcessed());
  batch.Put(kTableMeta, kMetaEventsProcessed, MetaU64(processed + events.size()));
  batch.Put(kTableMeta, kMetaCursorHeight, MetaU64(static_cast<uint64_t>(height)));
  TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));

  for (const auto& [index, action] : decisions) {
    common::Log(
        absl::StartsWith(action, "ignore:") ? common::LogLevel::kWarn : common::LogLevel::kInfo,
        kComponent, "event decided",
        {{"height", std::to_string(height)},
         {"index", std::to_string(index)},
         {"type", Truncate(events[index].type(), 80)},
         {"action", action}});
  }
  // Only now, with the decision durable, may the txs leave the host.
  for (auto& tx : ctx.new_txs) {
    absl::Status sent = BroadcastPending(tx);
    if (!sent.ok()) {
      common::Log(common::LogLevel::kWarn, kComponent, "broadcast failed; will retry",
                  {{"txhash", tx.txhash()}, {"error", std::string(sent.message())}});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HostCore::Decide(HeightContext& ctx,
                                             const tendermint::abci::Event& event) {
  if (gonka()) return DecideGonka(ctx, event);
  const std::string& type = event.type();
  if (type == kEventShardProposed) {
    auto e = ParseShardProposed(event);
    if (!e.ok()) return Ignore(e.status());
    TS_ASSIGN_OR_RETURN(pb::HostShardRecord * rec, LoadShard(ctx, e->shard_id));
    if (rec->status() == pb::SHARD_STATUS_UNSPECIFIED) rec->set_status(pb::SHARD_STATUS_PROPOSED);
    rec->set_hardware_profile(e->hardware_profile);
    rec->set_max_nodes(e->max_nodes);
    rec->set_escrow(common::FormatAmount(e->escrow));
    return std::string("record");
  }
  if (type == kEventShardOpened) return OnShardOpened(ctx, event);
  if (type == kEventReservationAdded) {
    auto e = ParseReservationAdded(event);
    if (!e.ok()) return Ignore(e.status());
    TS_ASSIGN_OR_RETURN(pb::HostShardRecord * rec, LoadShard(ctx, e->shard_id));
    if (rec->status() == pb::SHARD_STATUS_UNSPECIFIED) rec->set_status(pb::SHARD_STATUS_OPEN);
    if (IsMember(*rec, e->host)) {
      return Ignore(absl::AlreadyExistsError(absl::StrCat(
          "reservation_added: ", e->host, " already a member of shard ", e->shard_id)));
    }
    auto* m = rec->add_members();
    m->set_host(e->host);
    m->set_weight(e->frozen_weight);
    uint64_t total = rec->total_weight();
    rec->set_total_weight(total > UINT64_MAX - e->frozen_weight ? UINT64_MAX
                                                                : total + e->frozen_weight);
    if (e->host == address_) {
      rec->set_reserved(true);
      rec->set_reservation_sent(true);
      rec->set_frozen_weight(e->frozen_weight);
      rec->clear_skip_reason();
    }
    return std::string("record");
  }
  if (type == kEventShardRunning) {
    auto e = ParseShardRunning(event);
    if (!e.ok()) return Ignore(e.status());
    TS_ASSIGN_OR_RETURN(pb::HostShardRecord * rec, LoadShard(ctx, e->shard_id));
    rec->set_status(pb::SHARD_STATUS_RUNNING);
    if (static_cast<uint32_t>(rec->members_size()) != e->members ||
        rec->total_weight() != e->total_weight) {
      // The host started after some reservations, or the chain and the host disagree; the
      // host's own member list is what it checks settlements against, so keep it and say so.
      common::Log(common::LogLevel::kWarn, kComponent, "members differ from the chain's",
                  {{"shard_id", std::to_string(e->shard_id)},
                   {"chain_members", std::to_string(e->members)},
                   {"chain_total_weight", std::to_string(e->total_weight)},
                   {"own_members", std::to_string(rec->members_size())},
                   {"own_total_weight", std::to_string(rec->total_weight())}});
    }
    return std::string("record");
  }
  if (type == kEventShardSettled) {
    auto e = ParseShardSettled(event);
    if (!e.ok()) return Ignore(e.status());
    TS_ASSIGN_OR_RETURN(pb::HostShardRecord * rec, LoadShard(ctx, e->shard_id));
    rec->set_status(pb::SHARD_STATUS_SETTLED);
    return std::string("record");
  }
  if (type == kEventPayout) {
    auto e = ParsePayout(event);
    if (!e.ok()) return Ignore(e.status());
    return std::string("record");
  }
  if (type == kEventShardExpired || type == kEventShardRejected) {
    auto e = type == kEventShardExpired ? ParseShardExpired(event) : ParseShardRejected(event);
    if (!e.ok()) return Ignore(e.status());
    TS_ASSIGN_OR_RETURN(pb::HostShardRecord * rec, LoadShard(ctx, e->shard_id));
    rec->set_status(type == kEventShardExpired ? pb::SHARD_STATUS_EXPIRED
                                               : pb::SHARD_STATUS_REJECTED);
    return std::string("record");
  }
  if (type == kEventWeightsSubmitted) {
    auto e = ParseWeightsSubmitted(event);
    if (!e.ok()) return Ignore(e.status());
    return std::string("record");
  }
  return std::string("record");
}

absl::StatusOr<uint64_t> HostCore::OwnWeight(HeightContext& ctx) {
  if (!ctx.weights) {
    TS_ASSIGN_OR_RETURN(pb::EpochWeights weights, chain_->Weights(0, /*current=*/true));
    ctx.weights = std::move(weights);
  }
  for (const auto& w : ctx.weights->weights()) {
    if (w.host() == address_) return w.weight();
  }
  return 0;
}

absl::Status HostCore::CountActive(HeightContext& ctx, uint32_t* active) {
  *active = 0;
  absl::Status parse = absl::OkStatus();
  TS_RETURN_IF_ERROR(
      store_->db().Scan(kTableShards, "", [&](std::string_view key, std::string_view v) {
        uint64_t id = state::DecodeU64Key(key);
        if (ctx.shards.count(id) != 0) return true;  // counted from the working copy below
        pb::HostShardRecord rec;
        if (!rec.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
          parse = absl::DataLossError(absl::StrCat("shards: record ", id, " does not parse"));
          return false;
        }
        if (IsActive(rec)) ++*active;
        return true;
      }));
  TS_RETURN_IF_ERROR(parse);
  for (const auto& [id, rec] : ctx.shards) {
    if (IsActive(rec)) ++*active;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HostCore::PolicySkipReason(HeightContext& ctx,
                                                       const pb::HostShardRecord& rec,
                                                       uint64_t min_host_weight, uint32_t max_nodes,
                                                       uint64_t escrow) {
  const ReservationPolicy& p = options_.policy;
  if (!p.auto_reserve) return std::string("auto_reserve is off");
  if (!p.hardware_profiles.empty() &&
      std::find(p.hardware_profiles.begin(), p.hardware_profiles.end(), rec.hardware_profile()) ==
          p.hardware_profiles.end()) {
    return absl::StrCat("hardware_profile ", rec.hardware_profile(),
                        " is not in policy.hardware_profiles");
  }
  if (rec.reserved() || rec.reservation_sent()) return std::string("already reserved");
  uint32_t active = 0;
  TS_RETURN_IF_ERROR(CountActive(ctx, &active));
  if (active >= p.max_shards) {
    return absl::StrCat("policy.max_shards ", p.max_shards, " reached (", active, " active)");
  }
  if (max_nodes == 0) return std::string("max_nodes is 0");
  uint64_t per_node = escrow / max_nodes;
  if (per_node < p.min_escrow_per_node) {
    return absl::StrCat("escrow per node ", per_node, " is below policy.min_escrow_per_node ",
                        p.min_escrow_per_node);
  }
  TS_ASSIGN_OR_RETURN(uint64_t weight, OwnWeight(ctx));
  if (weight < min_host_weight) {
    return absl::StrCat("own weight ", weight, " is below min_host_weight ", min_host_weight);
  }
  return std::string();
}

absl::StatusOr<std::string> HostCore::RunSkipReason(uint64_t shard_id) {
  if (!options_.run_check) return std::string();
  auto shard = chain_->Shard(shard_id);
  // A shard the chain no longer knows cannot be reserved either; any other error is the chain's
  // and the height is tried again.
  if (absl::IsNotFound(shard.status())) return absl::StrCat("shard ", shard_id, " not on chain");
  if (!shard.ok()) return shard.status();
  return options_.run_check(shard->spec());
}

absl::StatusOr<std::string> HostCore::OnShardOpened(HeightContext& ctx,
                                                    const tendermint::abci::Event& event) {
  auto e = ParseShardOpened(event);
  if (!e.ok()) return Ignore(e.status());
  TS_ASSIGN_OR_RETURN(pb::HostShardRecord * rec, LoadShard(ctx, e->shard_id));
  rec->set_status(pb::SHARD_STATUS_OPEN);
  rec->set_hardware_profile(e->hardware_profile);
  rec->set_max_nodes(e->max_nodes);
  rec->set_escrow(common::FormatAmount(e->escrow));
  rec->set_deadline_height(e->deadline_height);

  TS_ASSIGN_OR_RETURN(std::string skip,
                      PolicySkipReason(ctx, *rec, e->min_host_weight, e->max_nodes, e->escrow));
  // A host catching up on old heights must not reserve shards whose window has closed.
  if (skip.empty() && e->reservation_deadline_height < chain_height_) {
    skip = absl::StrCat("reservation window closed at height ", e->reservation_deadline_height,
                        " (chain is at ", chain_height_, ")");
  }
  if (skip.empty()) {
    TS_ASSIGN_OR_RETURN(skip, RunSkipReason(e->shard_id));
  }
  if (skip.empty()) {
    size_t pending = 0;
    TS_RETURN_IF_ERROR(
        store_->db().Scan(kTablePendingTxs, "", [&](std::string_view, std::string_view) {
          ++pending;
          return true;
        }));
    if (pending + ctx.new_txs.size() >= options_.max_pending_txs) {
      skip = absl::StrCat(pending + ctx.new_txs.size(), " txs pending, the cap is ",
                          options_.max_pending_txs);
    }
  }
  if (skip.empty() && !ctx.account) {
    auto next = NextSequence(ctx.new_txs, "");
    if (absl::IsNotFound(next.status())) {
      skip = absl::StrCat("account ", address_, " is not on chain");
    } else if (!next.ok()) {
      return next.status();
    } else {
      ctx.account = *next;
    }
  }
  if (!skip.empty()) {
    rec->set_skip_reason(skip);
    return absl::StrCat("skip:", skip);
  }
  // Valid from whichever is later, the event or the chain's head (a host catching up).
  int64_t valid_until = std::max(ctx.height, chain_height_) + options_.reservation_validity_blocks;
  TS_ASSIGN_OR_RETURN(SignedReservation signed_tx,
                      BuildReservationTx(e->shard_id, valid_until, ctx.account->first,
                                         ctx.account->second, ctx.height));
  ++ctx.account->second;
  rec->set_reservation_sent(true);
  rec->clear_skip_reason();
  ctx.reservations.push_back(std::move(signed_tx.reservation));
  ctx.new_txs.push_back(std::move(signed_tx.pending));
  return std::string("reserve");
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> HostCore::NextSequence(
    const std::vector<pb::PendingTx>& extra, const std::string& exclude_txhash) {
  TS_ASSIGN_OR_RETURN(bridge::AccountInfo account, chain_->Account(address_));
  uint64_t next = account.sequence;
  auto consider = [&](const pb::PendingTx& tx) {
    if (tx.txhash() == exclude_txhash) return;
    std::optional<uint64_t> seq = TxSequence(tx);
    if (seq && *seq >= account.sequence && *seq + 1 > next) next = *seq + 1;
  };
  TS_ASSIGN_OR_RETURN(std::vector<pb::PendingTx> pending, store_->ListPendingTxs());
  for (const auto& tx : pending) consider(tx);
  for (const auto& tx : extra) consider(tx);
  return std::make_pair(account.account_number, next);
}

absl::StatusOr<HostCore::SignedReservation> HostCore::BuildReservationTx(uint64_t shard_id,
                                                                         int64_t valid_until_height,
                                                                         uint64_t account_number,
                                                                         uint64_t sequence,
                                                                         int64_t created_height) {
  SignedReservation out;
  pb::Reservation& r = out.reservation;
  r.set_shard_id(shard_id);
  r.set_host(address_);
  r.set_endpoint(options_.shard_endpoint);
  r.set_tls_cert_sha256(options_.tls_cert_sha256);
  r.set_valid_until_height(valid_until_height);
  // Signed over the canonical bytes with the signature and the chain-set fields cleared (they
  // are unset here).
  TS_ASSIGN_OR_RETURN(std::string signature,
                      common::SignStatement(key_, protocol::kSignReservation, chain_id_, shard_id,
                                            DeterministicBytes(r)));
  r.set_signature(signature);
  pb::MsgReserveTrainshard msg;
  *msg.mutable_reservation() = r;
  TS_ASSIGN_OR_RETURN(std::string tx_bytes,
                      bridge::BuildPaidTx(*chain_, key_, chain_id_, account_number, sequence,
                                          {bridge::PackMsg(msg)}));
  out.pending.set_txhash(bridge::TxHash(tx_bytes));
  out.pending.set_tx_bytes(std::move(tx_bytes));
  out.pending.set_purpose(absl::StrCat(common::AsAbsl(kPurposeReservePrefix), shard_id));
  out.pending.set_created_height(created_height);
  return out;
}

absl::Status HostCore::BroadcastPending(pb::PendingTx tx) {
  auto response = chain_->BroadcastRaw(tx.tx_bytes());
  last_broadcast_ms_[tx.txhash()] = clock_->MonotonicMs();
  tx.set_attempts(tx.attempts() + 1);
  {
    state::WriteBatch batch;
    batch.PutProto(kTablePendingTxs, tx.txhash(), tx);
    TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));
  }
  if (!response.ok()) return response.status();
  switch (Classify(*response)) {
    case CheckOutcome::kAccepted:
    case CheckOutcome::kRetryLater:
      return absl::OkStatus();
    case CheckOutcome::kSequenceMismatch:
      common::Log(common::LogLevel::kInfo, kComponent, "sequence mismatch; re-signing",
                  {{"txhash", tx.txhash()}, {"response", DescribeResponse(*response)}});
      return Resign(tx, ExpectedSequenceHint(*response), /*refresh=*/false);
    case CheckOutcome::kAlreadyDone:
      return FinishPending(tx, /*reserved=*/true, "");
    case CheckOutcome::kOutOfGas:
      if (tx.attempts() < options_.max_broadcast_attempts) return MoreGas(tx, *response);
      break;
    case CheckOutcome::kRefused:
      break;
  }
  return Refused(tx, absl::StrCat("refused by the chain: ", DescribeResponse(*response)));
}

absl::Status HostCore::MoreGas(const pb::PendingTx& tx, const TxResponse& response) {
  // Another tx changed the state between the simulation and this one (the reservation that
  // fills a shard starts it): simulate again, and ask at least the margin above what it used.
  common::Log(common::LogLevel::kInfo, kComponent, "out of gas; re-signing with more",
              {{"txhash", tx.txhash()},
               {"gas_wanted", std::to_string(response.gas_wanted())},
               {"gas_used", std::to_string(response.gas_used())}});
  return Resign(tx, 0, /*refresh=*/false, bridge::GasToAsk(response.gas_used()));
}

absl::Status HostCore::Refused(const pb::PendingTx& tx, const std::string& why) {
  // A reservation refused only because its statement ran out of validity (a chain that was
  // down, a long mempool wait) is made again, as long as the shard is still open to this host.
  std::optional<uint64_t> shard_id = ReservePurposeShard(tx.purpose());
  if (shard_id) {
    pb::Reservation stored;
    auto rec = store_->GetShard(*shard_id);
    absl::Status got = store_->db().GetProto(kTableReservations, ShardKey(*shard_id), &stored);
    if (got.ok() && rec.ok() && rec->status() == pb::SHARD_STATUS_OPEN && !rec->reserved() &&
        stored.valid_until_height() <= chain_height_ + 1 &&
        tx.attempts() < options_.max_broadcast_attempts) {
      common::Log(common::LogLevel::kInfo, kComponent, "reservation expired; renewing",
                  {{"txhash", tx.txhash()}, {"shard_id", std::to_string(*shard_id)}});
      return Resign(tx, 0, /*refresh=*/true);
    }
  }
  common::Log(common::LogLevel::kWarn, kComponent, "tx refused",
              {{"txhash", tx.txhash()}, {"purpose", tx.purpose()}, {"why", why}});
  return FinishPending(tx, /*reserved=*/false, why);
}

absl::Status HostCore::Resign(const pb::PendingTx& tx, uint64_t expected_hint, bool refresh,
                              uint64_t min_gas_limit) {
  auto decoded = bridge::DecodeTx(tx.tx_bytes());
  if (!decoded.ok()) {
    return FinishPending(tx, false,
                         absl::StrCat("stored tx does not decode: ", decoded.status().message()));
  }
  std::vector<google::protobuf::Any> msgs(decoded->body.messages().begin(),
                                          decoded->body.messages().end());
  TS_ASSIGN_OR_RETURN(auto account, NextSequence({}, tx.txhash()));
  uint64_t sequence = std::max(account.second, expected_hint);
  state::WriteBatch batch;
  std::optional<uint64_t> shard_id = ReservePurposeShard(tx.purpose());
  if (refresh && shard_id) {
    int64_t valid_until = chain_height_ + options_.reservation_validity_blocks;
    TS_ASSIGN_OR_RETURN(
        SignedReservation fresh,
        BuildReservationTx(*shard_id, valid_until, account.first, sequence, tx.created_height()));
    batch.PutProto(kTableReservations, ShardKey(*shard_id), fresh.reservation);
    msgs.assign(1, bridge::PackMsg([&] {
                  pb::MsgReserveTrainshard m;
                  *m.mutable_reservation() = fresh.reservation;
                  return m;
                }()));
  }
  TS_ASSIGN_OR_RETURN(
      std::string bytes,
      bridge::BuildPaidTx(*chain_, key_, chain_id_, account.first, sequence, msgs, min_gas_limit));
  pb::PendingTx replacement = tx;
  replacement.set_txhash(bridge::TxHash(bytes));
  replacement.set_tx_bytes(std::move(bytes));
  if (replacement.txhash() == tx.txhash()) return absl::OkStatus();  // nothing changed
  // One batch: the old row goes exactly when the new one arrives, so a crash leaves one of them.
  batch.Delete(kTablePendingTxs, tx.txhash());
  batch.PutProto(kTablePendingTxs, replacement.txhash(), replacement);
  TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));
  last_broadcast_ms_.erase(tx.txhash());
  common::Log(common::LogLevel::kInfo, kComponent, "tx re-signed",
              {{"old_txhash", tx.txhash()},
               {"txhash", replacement.txhash()},
               {"sequence", std::to_string(sequence)}});
  return absl::OkStatus();
}

absl::Status HostCore::FinishPending(const pb::PendingTx& tx, bool reserved,
                                     const std::string& failure) {
  state::WriteBatch batch;
  batch.Delete(kTablePendingTxs, tx.txhash());
  if (tx.purpose() == kPurposeGonkaOptIn) OnGonkaOptInFinished(failure, &batch);
  std::optional<uint64_t> shard_id = ReservePurposeShard(tx.purpose());
  if (shard_id) {
    auto rec = store_->GetShard(*shard_id);
    if (rec.ok()) {
      if (reserved) {
        rec->set_reserved(true);
        rec->set_reservation_sent(true);
        rec->clear_skip_reason();
      } else if (!rec->reserved()) {
        // Frees the slot (policy.max_shards) and lets the operator reserve by hand.
        rec->set_reservation_sent(false);
        rec->set_skip_reason(Truncate(failure, 2 * kMaxLogBytes));
      }
      batch.PutProto(kTableShards, ShardKey(*shard_id), *rec);
    } else if (!absl::IsNotFound(rec.status())) {
      return rec.status();
    }
  }
  TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));
  last_broadcast_ms_.erase(tx.txhash());
  common::Log(reserved || failure.empty() ? common::LogLevel::kInfo : common::LogLevel::kWarn,
              kComponent, "pending tx done",
              {{"txhash", tx.txhash()},
               {"purpose", tx.purpose()},
               {"result", failure.empty() ? "ok" : failure}});
  return absl::OkStatus();
}

absl::Status HostCore::ProcessPendingTxs() {
  if (chain_id_.empty()) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(std::vector<pb::PendingTx> pending, store_->ListPendingTxs());
  // Lowest sequence first, so a gap left by a dropped tx is filled before later ones retry.
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t i = 0; i < pending.size(); ++i) {
    order.emplace_back(TxSequence(pending[i]).value_or(UINT64_MAX), i);
  }
  std::sort(order.begin(), order.end());
  int64_t now = clock_->MonotonicMs();
  for (const auto& [seq, i] : order) {
    const pb::PendingTx& tx = pending[i];
    auto included = chain_->GetTx(tx.txhash());
    if (included.ok()) {
      CheckOutcome outcome = Classify(*included);
      if (included->code() == 0 || outcome == CheckOutcome::kAlreadyDone) {
        TS_RETURN_IF_ERROR(FinishPending(tx, /*reserved=*/true, ""));
      } else if (outcome == CheckOutcome::kOutOfGas &&
                 tx.attempts() < options_.max_broadcast_attempts) {
        TS_RETURN_IF_ERROR(MoreGas(tx, *included));
      } else {
        TS_RETURN_IF_ERROR(Refused(tx, absl::StrCat("failed in block ", included->height(), ": ",
                                                    DescribeResponse(*included))));
      }
      continue;
    }
    if (!absl::IsNotFound(included.status())) return included.status();
    auto last = last_broadcast_ms_.find(tx.txhash());
    if (last != last_broadcast_ms_.end() && now - last->second < options_.rebroadcast_interval_ms) {
      continue;
    }
    if (tx.attempts() >= options_.max_broadcast_attempts) {
      TS_RETURN_IF_ERROR(FinishPending(
          tx, /*reserved=*/false,
          absl::StrCat("tx ", tx.txhash(), " abandoned after ", tx.attempts(), " broadcasts")));
      continue;
    }
    TS_RETURN_IF_ERROR(BroadcastPending(tx));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> HostCore::Reserve(uint64_t shard_id) {
  if (chain_id_.empty()) return absl::UnavailableError("the host has not reached the chain yet");
  auto stored = store_->GetShard(shard_id);
  if (absl::IsNotFound(stored.status())) {
    return absl::NotFoundError(absl::StrCat("shard ", shard_id, " is unknown to this host"));
  }
  if (!stored.ok()) return stored.status();
  pb::HostShardRecord rec = *std::move(stored);
  if (rec.status() != pb::SHARD_STATUS_OPEN) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", shard_id, " is ",
                                                      pb::ShardStatus_Name(rec.status()),
                                                      " in this host's records, not OPEN"));
  }
  if (rec.reserved()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": this host already reserved"));
  }
  if (rec.reservation_sent()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": a reservation by this host is already in flight"));
  }
  TS_ASSIGN_OR_RETURN(std::vector<pb::PendingTx> pending, store_->ListPendingTxs());
  if (pending.size() >= options_.max_pending_txs) {
    return absl::ResourceExhaustedError(
        absl::StrCat(pending.size(), " txs pending, the cap is ", options_.max_pending_txs));
  }
  TS_ASSIGN_OR_RETURN(std::string cannot_run, RunSkipReason(shard_id));
  if (!cannot_run.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", shard_id, ": ", cannot_run));
  }
  TS_ASSIGN_OR_RETURN(bridge::ChainStatus status, chain_->Status());
  chain_height_ = std::max(chain_height_, status.latest_height);
  TS_ASSIGN_OR_RETURN(auto account, NextSequence({}, ""));
  TS_ASSIGN_OR_RETURN(
      SignedReservation signed_tx,
      BuildReservationTx(shard_id, chain_height_ + options_.reservation_validity_blocks,
                         account.first, account.second, chain_height_));
  rec.set_reservation_sent(true);
  rec.clear_skip_reason();
  state::WriteBatch batch;
  batch.PutProto(kTableShards, ShardKey(shard_id), rec);
  batch.PutProto(kTableReservations, ShardKey(shard_id), signed_tx.reservation);
  batch.PutProto(kTablePendingTxs, signed_tx.pending.txhash(), signed_tx.pending);
  TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));
  common::Log(common::LogLevel::kInfo, kComponent, "manual reservation",
              {{"shard_id", std::to_string(shard_id)}, {"txhash", signed_tx.pending.txhash()}});
  absl::Status sent = BroadcastPending(signed_tx.pending);
  if (!sent.ok()) {
    common::Log(common::LogLevel::kWarn, kComponent, "broadcast failed; will retry",
                {{"txhash", signed_tx.pending.txhash()}, {"error", std::string(sent.message())}});
  }
  return signed_tx.pending.txhash();
}

absl::StatusOr<pb::SettlementSignature> HostCore::SignSettlement(const pb::Settlement& draft) {
  const uint64_t shard_id = draft.shard_id();
  std::string canonical = DeterministicBytes(draft);
  // The same draft again gets the same signature, whatever happened since; a different one
  // never gets a second signature from this host.
  auto existing = store_->GetSettlementDraft(shard_id);
  if (existing.ok()) {
    if (DeterministicBytes(existing->settlement()) == canonical) return existing->signature();
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": this host already signed a different settlement (root ",
                     common::HexEncode(existing->settlement().final_checkpoint_root()), ")"));
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();

  if (draft.final_checkpoint_root().size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("settlement.final_checkpoint_root: ", draft.final_checkpoint_root().size(),
                     " bytes, expected 32"));
  }
  if (static_cast<size_t>(draft.payouts_size()) > options_.max_settlement_entries) {
    return absl::InvalidArgumentError(absl::StrCat("settlement.payouts: ", draft.payouts_size(),
                                                   " entries, at most ",
                                                   options_.max_settlement_entries));
  }
  if (chain_id_.empty()) return absl::UnavailableError("the host has not reached the chain yet");
  if (draft.chain_id() != chain_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("settlement.chain_id: \"", Truncate(draft.chain_id(), 80),
                     "\" is not this host's chain \"", chain_id_, "\""));
  }
  auto stored = store_->GetShard(shard_id);
  if (absl::IsNotFound(stored.status())) {
    return absl::NotFoundError(absl::StrCat("shard ", shard_id, " is unknown to this host"));
  }
  if (!stored.ok()) return stored.status();
  pb::HostShardRecord rec = *std::move(stored);
  if (rec.status() != pb::SHARD_STATUS_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", shard_id, " is ",
                                                      pb::ShardStatus_Name(rec.status()),
                                                      " in this host's records, not RUNNING"));
  }
  if (!IsMember(rec, address_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": this host (", address_, ") is not a member"));
  }
  uint64_t total = 0;
  std::set<std::string> payees;
  for (int i = 0; i < draft.payouts_size(); ++i) {
    const pb::HostPayout& p = draft.payouts(i);
    std::string field = absl::StrCat("settlement.payouts[", i, "]");
    if (!IsMember(rec, p.host())) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ".host: ", Truncate(p.host(), 100), " was not seen reserving shard ", shard_id));
    }
    if (!payees.insert(p.host()).second) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ".host: ", p.host(), " is paid twice"));
    }
    TS_ASSIGN_OR_RETURN(uint64_t amount, common::ParseAmount(field + ".amount", p.amount()));
    TS_ASSIGN_OR_RETURN(total, common::CheckedAdd("settlement.payouts", total, amount));
  }
  TS_ASSIGN_OR_RETURN(uint64_t refund, common::ParseAmount("settlement.refund", draft.refund()));
  TS_ASSIGN_OR_RETURN(total, common::CheckedAdd("settlement payouts + refund", total, refund));
  auto escrow = common::ParseAmount("recorded escrow", rec.escrow());
  if (!escrow.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_id, ": this host recorded no usable escrow (\"", rec.escrow(), "\")"));
  }
  if (total != *escrow) {
    return absl::FailedPreconditionError(absl::StrCat("settlement: payouts + refund = ", total,
                                                      " but the escrow this host recorded is ",
                                                      *escrow));
  }

  TS_ASSIGN_OR_RETURN(std::string signature, common::SignStatement(key_, protocol::kSignSettlement,
                                                                   chain_id_, shard_id, canonical));
  pb::GetSettlementResponse row;
  *row.mutable_settlement() = draft;
  row.mutable_signature()->set_host(address_);
  row.mutable_signature()->set_signature(signature);
  rec.set_settlement_signed(true);
  rec.set_settlement_root(draft.final_checkpoint_root());
  state::WriteBatch batch;
  batch.PutProto(kTableSettlementDrafts, ShardKey(shard_id), row);
  batch.PutProto(kTableShards, ShardKey(shard_id), rec);
  // Durable before the signature leaves the host: after a crash the host still knows what it
  // signed and refuses to sign anything else for this shard.
  TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));
  common::Log(common::LogLevel::kInfo, kComponent, "settlement signed",
              {{"shard_id", std::to_string(shard_id)},
               {"root", common::HexEncode(draft.final_checkpoint_root())}});
  return row.signature();
}

absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> HostCore::SubmitSettlement(
    const pb::Settlement& settlement, const std::vector<pb::SettlementSignature>& signatures) {
  if (settlement.shard_id() == 0) {
    return absl::InvalidArgumentError("settlement.shard_id: 0 is not a shard id");
  }
  if (signatures.empty() || signatures.size() > options_.max_settlement_entries) {
    return absl::InvalidArgumentError(absl::StrCat("signatures: ", signatures.size(),
                                                   " entries, expected 1..",
                                                   options_.max_settlement_entries));
  }
  if (gonka()) {
    TxResponse kept;
    kept.set_raw_log(
        "gonka-v0: no settlement is sent; the shard's creator settles it on chain, and the signed "
        "settlement stays with the members");
    return kept;
  }
  pb::MsgSettleTrainshard msg;
  msg.set_submitter(address_);
  *msg.mutable_settlement() = settlement;
  for (const auto& s : signatures) *msg.add_signatures() = s;
  return chain_->SignAndBroadcast(key_, {bridge::PackMsg(msg)}, /*wait=*/true);
}

}  // namespace ts::sidecar
