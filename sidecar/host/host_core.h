// HostCore: the host sidecar's control plane. It follows the chain height by height, decides
// what to do for each event (record it, reserve a place in a shard by policy, ignore a malformed
// one), keeps its own records of every shard, drives its pending transactions until the chain
// includes them, and checks and signs settlement drafts against those records.
//
// Exactly once: each height's events, the decisions taken for them (shard records, signed
// pending txs) and the new cursor are written in ONE synced state::WriteBatch; only then are the
// new txs broadcast. A crash before the write repeats the height from the same cursor; a crash
// after it finds the decision stored and only re-broadcasts the pending tx, which the chain
// accepts at most once (it refuses a second reservation by the same host). See
// docs/host-sidecar.md for the full argument.
//
// Thread-safety: NOT thread-safe, except where noted. One owner thread (HostDaemon's) calls
// everything that changes state; store() may be read from any thread (state::Db is thread-safe
// and every change is one atomic batch). SubmitSettlement and address() are thread-safe.
#ifndef TS_SIDECAR_HOST_HOST_CORE_H_
#define TS_SIDECAR_HOST_HOST_CORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/client/gonka_v0_client.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "cosmos/base/abci/v1beta1/abci.pb.h"
#include "gonka/trainshard/v1/host.pb.h"
#include "sidecar/host/config.h"
#include "sidecar/host/host_store.h"

namespace ts::sidecar {

// The purpose of a pending tx that opts the host's nodes in under gonka-v0.
inline constexpr std::string_view kPurposeGonkaOptIn = "gonka-opt-in";

struct HostCoreOptions {
  // host:port of this host's shard sidecar, advertised in reservations.
  std::string shard_endpoint;
  // SHA-256 of the shard sidecar's TLS certificate (32 bytes). Empty: SHA-256 of the host
  // address, a placeholder until the shard sidecar serves TLS.
  std::string tls_cert_sha256;
  ReservationPolicy policy;
  // A reservation statement is valid this many blocks past the height it is made at.
  int64_t reservation_validity_blocks = 50;
  // Pending txs not yet in a block are broadcast again at most this often...
  int64_t rebroadcast_interval_ms = 2000;
  // ...and at most this many times in all (re-signs included), then abandoned.
  uint32_t max_broadcast_attempts = 40;
  // Heights followed per Step, so commands queued for the owner thread are not starved.
  int64_t max_heights_per_step = 20;
  // Cap on unconfirmed txs of this host; a decision that would exceed it is skipped.
  size_t max_pending_txs = 64;
  // Cap on the payouts and signatures one settlement may carry (a request can grow them).
  size_t max_settlement_entries = 1024;
  // How often Step refreshes the host's own PoC weight for Status.
  int64_t weight_refresh_interval_ms = 10000;
  // Whether the host can run a shard's run spec (sidecar/host/run_check.h): empty, or the reason
  // it does not reserve. Asked with the shard's spec read from the chain, before the policy's
  // reservation and before a manual one. Unset: no check.
  std::function<std::string(const ::gonka::trainshard::v1::ShardSpec&)> run_check;
  // The chain's profile. Under gonka-v0 the host reserves nothing: the chain picks the nodes.
  // While its policy offers training (auto_reserve, fewer than max_shards active), the host keeps
  // gonka_node_ids opted in, re-arming them every gonka_refresh_every_blocks with
  // gonka_endpoint_url (GonkaV0EndpointUrl), and learns its shards from Gonka's events
  // (host_core_gonka.cc, docs/gonka-v0.md).
  bridge::ChainProfile chain_profile = bridge::ChainProfile::kTrainshard;
  std::vector<std::string> gonka_node_ids;
  std::string gonka_endpoint_url;
  int64_t gonka_refresh_every_blocks = 100;
  // Tests only: makes the records' file writes fail as on a full disk (state::DbOptions).
  std::shared_ptr<state::DiskFullFault> disk_full_fault;
};

// What Status reports; a copy taken on the owner thread.
struct HostStatusSnapshot {
  std::string address;
  std::string chain_id;
  int64_t cursor_height = 0;
  int64_t chain_height = 0;
  uint32_t pending_txs = 0;
  uint64_t events_processed = 0;
  uint64_t current_weight = 0;
  // Why the last Step failed (empty after a good one) and when the current run of failed steps
  // began (unix ms; 0 after a good step).
  std::string last_error;
  int64_t last_error_since_unix_ms = 0;
  // The records database: its path, why it refuses writes (empty while it takes them; a full
  // disk stops the follower) and since when, and how often it recovered since Open.
  std::string records_path;
  std::string records_error;
  int64_t records_error_since_unix_ms = 0;
  uint64_t records_recoveries = 0;
};

class HostCore {
 public:
  // Opens (or creates) the records at `db_path`. `chain` and `clock` are not owned and must
  // outlive the core. FAILED_PRECONDITION if the records belong to another address (a different
  // key file than the one they were made with); errors of HostStore::Open otherwise.
  static absl::StatusOr<std::unique_ptr<HostCore>> Open(const std::string& db_path,
                                                        const common::PrivateKey& key,
                                                        HostCoreOptions options,
                                                        bridge::ChainClient* chain,
                                                        common::Clock* clock);
  ~HostCore();

  // One poll: checks the chain id, follows up to max_heights_per_step heights, then drives the
  // pending txs. Errors: UNAVAILABLE/DEADLINE_EXCEEDED when the chain cannot be reached (the
  // cursor has not moved past anything not fully processed; call again later);
  // FAILED_PRECONDITION if the chain id differs from the one the records were made on;
  // INTERNAL/DATA_LOSS for local storage failures.
  absl::Status Step();

  // Follows heights cursor+1 .. min(latest, cursor+max_heights); returns how many were
  // processed. Errors as Step.
  absl::StatusOr<int64_t> Follow(int64_t max_heights);

  // Processes one height; it must be cursor+1 (FAILED_PRECONDITION otherwise).
  absl::Status ProcessHeight(int64_t height);

  // Checks each pending tx: included -> result recorded and row removed; missing -> broadcast
  // again (rate-limited, bounded); refused for a sequence mismatch -> re-signed with a fresh
  // sequence, replacing the row in one batch. Errors: the first chain error (the rest is left
  // for the next call).
  absl::Status ProcessPendingTxs();

  // A manual reservation through the same pending-tx path; returns the txhash. NOT_FOUND if the
  // host has no record of the shard; FAILED_PRECONDITION if its records say the shard is not
  // OPEN, or this host already reserved (or has a reservation in flight);
  // RESOURCE_EXHAUSTED if max_pending_txs are in flight; UNAVAILABLE if the chain id is not
  // known yet or the chain cannot be reached.
  absl::StatusOr<std::string> Reserve(uint64_t shard_id);

  // Checks `draft` against the host's own records and signs it, storing the draft and the
  // signature (synced) before returning. The same draft again returns the same signature.
  // INVALID_ARGUMENT for a malformed draft (bad root size, bad amounts, too many payouts);
  // NOT_FOUND for an unknown shard; FAILED_PRECONDITION naming what disagrees: another chain
  // id, the shard not RUNNING, this host not a member, a payee the host did not see reserve,
  // payouts + refund not equal to the escrow, or a different draft already signed.
  absl::StatusOr<pb::SettlementSignature> SignSettlement(const pb::Settlement& draft);

  // Wraps MsgSettleTrainshard{submitter = this host} and broadcasts it, waiting for inclusion.
  // Thread-safe (it uses only the chain client and the key). INVALID_ARGUMENT for a missing
  // settlement or too many signatures; chain errors as ChainClient::SignAndBroadcast. Under
  // gonka-v0 nothing is sent (only the shard's creator settles there, with no result): the
  // answer is code 0 with an empty txhash, and the signed settlement stays in the records.
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> SubmitSettlement(
      const pb::Settlement& settlement, const std::vector<pb::SettlementSignature>& signatures);

  // Owner thread. Values read from the records keep their last known value while the records
  // cannot be read.
  HostStatusSnapshot Snapshot() const;
  const HostStore& store() const { return *store_; }
  // The records' database, shared with components that keep tables of their own in it (the
  // artifact stores' index, kTableArtifacts), which HostCore never touches. Thread-safe.
  state::Db* shared_db() { return &store_->db(); }
  const std::string& address() const { return address_; }

 private:
  // What one height's decisions build up before its batch is written.
  struct HeightContext {
    int64_t height = 0;
    // Records touched at this height, written with the batch.
    std::map<uint64_t, pb::HostShardRecord> shards;
    std::vector<pb::PendingTx> new_txs;
    std::vector<pb::Reservation> reservations;
    std::optional<pb::EpochWeights> weights;
    // Account number and next sequence, fetched once per height when needed.
    std::optional<std::pair<uint64_t, uint64_t>> account;
  };

  HostCore(std::unique_ptr<HostStore> store, const common::PrivateKey& key, HostCoreOptions options,
           bridge::ChainClient* chain, common::Clock* clock);

  absl::Status SyncChain();
  bool gonka() const { return options_.chain_profile == bridge::ChainProfile::kGonkaV0; }
  // gonka-v0 (host_core_gonka.cc): what Gonka's events mean for the records, and the opt-in
  // kept armed while the policy offers training.
  absl::StatusOr<std::string> DecideGonka(HeightContext& ctx, const tendermint::abci::Event& event);
  absl::Status KeepOptedIn();
  // A failed opt-in is tried again a few blocks later instead of a whole period later.
  void OnGonkaOptInFinished(const std::string& failure, state::WriteBatch* batch);
  absl::StatusOr<std::string> Decide(HeightContext& ctx, const tendermint::abci::Event& event);
  absl::StatusOr<std::string> OnShardOpened(HeightContext& ctx,
                                            const tendermint::abci::Event& event);
  absl::StatusOr<pb::HostShardRecord*> LoadShard(HeightContext& ctx, uint64_t shard_id);
  absl::StatusOr<std::string> PolicySkipReason(HeightContext& ctx, const pb::HostShardRecord& rec,
                                               uint64_t min_host_weight, uint32_t max_nodes,
                                               uint64_t escrow);
  // Why this host cannot run the shard's chain-pinned run spec (options_.run_check), read from
  // the chain; empty if it can or no check is set.
  absl::StatusOr<std::string> RunSkipReason(uint64_t shard_id);
  absl::StatusOr<uint64_t> OwnWeight(HeightContext& ctx);
  // Account number and next free sequence: the chain's sequence, past every pending tx of this
  // host that has not yet been included (those in `extra` too), skipping `exclude_txhash`.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> NextSequence(
      const std::vector<pb::PendingTx>& extra, const std::string& exclude_txhash);
  // Builds, signs and packs a reservation tx for `shard_id`.
  struct SignedReservation {
    pb::Reservation reservation;
    pb::PendingTx pending;
  };
  absl::StatusOr<SignedReservation> BuildReservationTx(uint64_t shard_id,
                                                       int64_t valid_until_height,
                                                       uint64_t account_number, uint64_t sequence,
                                                       int64_t created_height);
  absl::Status CountActive(HeightContext& ctx, uint32_t* active);
  // Broadcasts a pending tx, counts the attempt, and acts on the chain's answer.
  absl::Status BroadcastPending(pb::PendingTx tx);
  // A tx the chain refused for good: renewed if only its reservation statement expired,
  // otherwise finished as failed.
  absl::Status Refused(const pb::PendingTx& tx, const std::string& why);
  // Signs the same messages again with a fresh sequence (at least `expected_hint`) and replaces
  // the row in one batch. With `refresh`, a reservation is re-made with a new validity; the
  // gas asked is at least `min_gas_limit`.
  absl::Status Resign(const pb::PendingTx& tx, uint64_t expected_hint, bool refresh,
                      uint64_t min_gas_limit = 0);
  // Signs a tx refused out of gas again, asking more than `response` says it used.
  absl::Status MoreGas(const pb::PendingTx& tx,
                       const cosmos::base::abci::v1beta1::TxResponse& response);
  // Records the end of a pending tx (included, refused, abandoned) and deletes its row.
  absl::Status FinishPending(const pb::PendingTx& tx, bool reserved, const std::string& failure);

  std::unique_ptr<HostStore> store_;
  common::PrivateKey key_;
  HostCoreOptions options_;
  bridge::ChainClient* chain_;
  common::Clock* clock_;
  std::string address_;

  // Owner-thread state.
  std::string chain_id_;
  int64_t chain_height_ = 0;
  uint64_t current_weight_ = 0;
  int64_t weight_refreshed_ms_ = -1;
  std::string last_error_;
  int64_t last_error_since_unix_ms_ = 0;
  // The last snapshot, whose stored values stand in for reads that fail.
  mutable HostStatusSnapshot last_snapshot_;
  // txhash -> monotonic ms of the last broadcast; lost on restart, which only means the first
  // poll after a restart broadcasts every pending tx again.
  std::map<std::string, int64_t> last_broadcast_ms_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_HOST_CORE_H_
