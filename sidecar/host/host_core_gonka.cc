// HostCore under the gonka-v0 profile (docs/gonka-v0.md): the chain, not the host, picks a
// shard's nodes. The host keeps its nodes opted in while its policy offers training, learns
// that it was picked from trainshard_node_reserved, and follows the shard to its close. The
// same exactly-once rules hold as for the module's events: decisions go into the height's
// batch, the opt-in tx goes through the pending-tx path.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "chain-bridge/module/tx.h"
#include "common/log.h"
#include "common/status.h"
#include "inference/inference/trainshard.pb.h"
#include "sidecar/host/events.h"
#include "sidecar/host/host_core.h"

namespace ts::sidecar {
namespace {

namespace gv0 = ::inference::inference;

constexpr std::string_view kComponent = "host";
// A refused or abandoned opt-in is tried again after at most this many blocks.
constexpr int64_t kOptInRetryBlocks = 10;

pb::HostWeight* FindMember(pb::HostShardRecord* rec, const std::string& host) {
  for (auto& m : *rec->mutable_members()) {
    if (m.host() == host) return &m;
  }
  return nullptr;
}

std::string IgnoreGonka(const absl::Status& status) {
  return absl::StrCat("ignore:", status.message().substr(0, 300));
}

}  // namespace

absl::StatusOr<std::string> HostCore::DecideGonka(HeightContext& ctx,
                                                  const tendermint::abci::Event& event) {
  const std::string& type = event.type();
  if (type != kEventGonkaAssembled && type != kEventGonkaNodeReserved &&
      type != kEventGonkaNodeKicked && type != kEventGonkaSettled && type != kEventGonkaExpired) {
    return std::string("record");
  }
  auto e = ParseGonkaShardEvent(event);
  if (!e.ok()) return IgnoreGonka(e.status());
  TS_ASSIGN_OR_RETURN(pb::HostShardRecord * rec, LoadShard(ctx, e->shard_id));
  if (type == kEventGonkaAssembled) {
    // The members and their frozen weights as the chain holds them now (its events name the
    // nodes, not their weights); a shard already pruned leaves them to the node events.
    rec->set_status(pb::SHARD_STATUS_RUNNING);
    rec->set_escrow("0");  // v0 pays through epoch rewards; the settlement divides nothing
    auto shard = chain_->Shard(e->shard_id);
    if (shard.ok()) {
      rec->set_hardware_profile(shard->spec().hardware_profile().substr(0, 64));
      rec->set_max_nodes(shard->spec().max_nodes());
      rec->set_deadline_height(shard->deadline_height());
      rec->clear_members();
      rec->set_total_weight(0);
      for (const pb::Reservation& r : shard->reservations()) {
        auto* m = rec->add_members();
        m->set_host(r.host());
        m->set_weight(r.frozen_weight());
        rec->set_total_weight(rec->total_weight() + r.frozen_weight());
        if (r.host() == address_) rec->set_frozen_weight(r.frozen_weight());
      }
    } else if (!absl::IsNotFound(shard.status())) {
      return shard.status();  // the chain's error: the height is decided again
    }
    return std::string("record");
  }
  if (type == kEventGonkaNodeReserved) {
    if (rec->status() == pb::SHARD_STATUS_UNSPECIFIED) rec->set_status(pb::SHARD_STATUS_RUNNING);
    if (FindMember(rec, e->participant) == nullptr) rec->add_members()->set_host(e->participant);
    if (e->participant != address_) return std::string("record");
    rec->set_reserved(true);
    rec->set_reservation_sent(true);
    rec->clear_skip_reason();
    return absl::StrCat("picked:", e->node_id.substr(0, 128));
  }
  if (type == kEventGonkaNodeKicked) {
    // The chain's Trainshard query drops the node from the members the shard processes see;
    // the records keep the host, whose signature stays valid for what it already did.
    return std::string("record");
  }
  rec->set_status(type == kEventGonkaSettled ? pb::SHARD_STATUS_SETTLED : pb::SHARD_STATUS_EXPIRED);
  return std::string("record");
}

absl::Status HostCore::KeepOptedIn() {
  if (options_.gonka_node_ids.empty() || chain_id_.empty()) return absl::OkStatus();
  const ReservationPolicy& p = options_.policy;
  if (!p.auto_reserve) return absl::OkStatus();  // not offering: the opt-in lapses by itself
  // Cheapest first: this runs on every poll, and is due once a period.
  TS_ASSIGN_OR_RETURN(std::string due_text, store_->MetaString(kMetaGonkaOptInDue));
  const int64_t due = due_text.empty() ? 0 : static_cast<int64_t>(state::DecodeU64Key(due_text));
  if (chain_height_ < due) return absl::OkStatus();
  HeightContext none;
  uint32_t active = 0;
  TS_RETURN_IF_ERROR(CountActive(none, &active));
  if (active >= p.max_shards) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(std::vector<pb::PendingTx> pending, store_->ListPendingTxs());
  for (const auto& tx : pending) {
    if (tx.purpose() == kPurposeGonkaOptIn) return absl::OkStatus();  // one in flight
  }
  if (pending.size() >= options_.max_pending_txs) return absl::OkStatus();

  // Opting in is idempotent, and a refresh alone may not opt a node in on every chain: both,
  // in one tx, every period.
  std::vector<google::protobuf::Any> msgs;
  gv0::MsgRefreshTrainingNodeOptIn refresh;
  refresh.set_creator(address_);
  refresh.set_endpoint(options_.gonka_endpoint_url);
  for (const std::string& node_id : options_.gonka_node_ids) {
    gv0::MsgSetTrainingNodeOptIn opt_in;
    opt_in.set_creator(address_);
    opt_in.set_node_id(node_id);
    opt_in.set_opt_in(true);
    msgs.push_back(bridge::PackMsg(opt_in));
    refresh.add_node_ids(node_id);
  }
  msgs.push_back(bridge::PackMsg(refresh));
  auto account = NextSequence({}, "");
  if (absl::IsNotFound(account.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("account ", address_, " is not on chain; it cannot opt its nodes in"));
  }
  if (!account.ok()) return account.status();
  TS_ASSIGN_OR_RETURN(
      std::string bytes,
      bridge::BuildPaidTx(*chain_, key_, chain_id_, account->first, account->second, msgs));
  pb::PendingTx tx;
  tx.set_txhash(bridge::TxHash(bytes));
  tx.set_tx_bytes(std::move(bytes));
  tx.set_purpose(std::string(kPurposeGonkaOptIn));
  tx.set_created_height(chain_height_);
  state::WriteBatch batch;
  batch.PutProto(kTablePendingTxs, tx.txhash(), tx);
  batch.Put(kTableMeta, kMetaGonkaOptInDue,
            state::EncodeU64Key(static_cast<uint64_t>(
                chain_height_ + std::max<int64_t>(1, options_.gonka_refresh_every_blocks))));
  TS_RETURN_IF_ERROR(store_->db().Write(batch, /*sync=*/true));
  common::Log(common::LogLevel::kInfo, kComponent, "opting nodes in for training",
              {{"nodes", std::to_string(options_.gonka_node_ids.size())},
               {"endpoint", options_.gonka_endpoint_url},
               {"txhash", tx.txhash()}});
  absl::Status sent = BroadcastPending(tx);
  if (!sent.ok()) {
    common::Log(common::LogLevel::kWarn, kComponent, "broadcast failed; will retry",
                {{"txhash", tx.txhash()}, {"error", std::string(sent.message())}});
  }
  return absl::OkStatus();
}

void HostCore::OnGonkaOptInFinished(const std::string& failure, state::WriteBatch* batch) {
  if (failure.empty()) return;
  const int64_t retry =
      chain_height_ + std::min<int64_t>(kOptInRetryBlocks, options_.gonka_refresh_every_blocks);
  batch->Put(kTableMeta, kMetaGonkaOptInDue, state::EncodeU64Key(static_cast<uint64_t>(retry)));
}

}  // namespace ts::sidecar
