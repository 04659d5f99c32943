// The chain module's state logic: the key layout (docs/chain-module.md, "State layout"), typed
// access to accounts, balances, PoC weights, proposals and shards, the execution of each
// message, and the end-of-block rules. A Keeper works on one KvOverlay at one height and
// appends the events it emits; the App decides which overlays are kept. Internal to the module.
//
// Everything here is deterministic: no time, randomness, floats or unordered iteration.
// Thread-safety: not thread-safe; one owner thread (the App's).
#ifndef TS_CHAIN_BRIDGE_MODULE_KEEPER_H_
#define TS_CHAIN_BRIDGE_MODULE_KEEPER_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chain-bridge/module/kv_overlay.h"
#include "chain-bridge/module/tx_errors.h"
#include "cosmos/auth/v1beta1/auth.pb.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "google/protobuf/any.pb.h"
#include "google/protobuf/message.h"
#include "inference/inference/trainshard.pb.h"
#include "tendermint/abci/types.pb.h"

namespace ts::bridge {

namespace pb = ::gonka::trainshard::v1;

// Type URLs of the messages a tx may carry.
inline constexpr std::string_view kMsgSendType = "/cosmos.bank.v1beta1.MsgSend";
inline constexpr std::string_view kMsgSubmitProposalType = "/cosmos.gov.v1.MsgSubmitProposal";
inline constexpr std::string_view kMsgVoteType = "/cosmos.gov.v1.MsgVote";
inline constexpr std::string_view kMsgDepositType = "/cosmos.gov.v1.MsgDeposit";
inline constexpr std::string_view kMsgSubmitPocWeightsType =
    "/gonka.trainshard.v1.MsgSubmitPocWeights";
inline constexpr std::string_view kMsgReserveType = "/gonka.trainshard.v1.MsgReserveTrainshard";
inline constexpr std::string_view kMsgAssembleType = "/gonka.trainshard.v1.MsgAssembleTrainshard";
inline constexpr std::string_view kMsgSettleType = "/gonka.trainshard.v1.MsgSettleTrainshard";
inline constexpr std::string_view kMsgCreateTrainshardProposalType =
    "/gonka.trainshard.v1.MsgCreateTrainshardProposal";
// Gonka's trainshards v0 (package inference.inference), accepted in the gonka-v0 profile only.
inline constexpr std::string_view kGonkaCreateProposalType =
    "/inference.inference.MsgCreateTrainshardProposal";
inline constexpr std::string_view kGonkaAssembleType = "/inference.inference.MsgAssembleTrainshard";
inline constexpr std::string_view kGonkaSettleType = "/inference.inference.MsgSettleTrainshard";
inline constexpr std::string_view kGonkaAutokickType =
    "/inference.inference.MsgAutokickTrainshardNode";
inline constexpr std::string_view kGonkaSetOptInType =
    "/inference.inference.MsgSetTrainingNodeOptIn";
inline constexpr std::string_view kGonkaRefreshOptInType =
    "/inference.inference.MsgRefreshTrainingNodeOptIn";

// Module account names (addresses are common::ModuleAddress of them).
inline constexpr std::string_view kGovModule = "gov";
inline constexpr std::string_view kEscrowModule = "trainshard";
inline constexpr std::string_view kCommunityPoolModule = "distribution";
// Where tx fees go (the SDK's auth fee collector; the devnet has no validators to pay them to).
inline constexpr std::string_view kFeeCollectorModule = "fee_collector";

// Big-endian fixed-width encoding of ids, heights and amounts in keys and values, so that the
// map's byte order is the numeric order.
std::string Be64(uint64_t value);
// DATA_LOSS naming `key` unless `bytes` is exactly 8 bytes.
absl::StatusOr<uint64_t> ReadBe64(std::string_view key, std::string_view bytes);

// The key layout. Every key starts with its module's prefix; ids and heights are Be64.
namespace keys {
inline constexpr std::string_view kGenesisHash = "meta/genesis_sha256";
inline constexpr std::string_view kNextAccountNumber = "auth/next_account_number";
inline constexpr std::string_view kAccountPrefix = "auth/account/";
inline constexpr std::string_view kSupply = "bank/supply";
inline constexpr std::string_view kBalancePrefix = "bank/balance/";
inline constexpr std::string_view kLatestEpoch = "poc/latest_epoch";
inline constexpr std::string_view kPreviousEpoch = "poc/previous_epoch";
inline constexpr std::string_view kEpochPrefix = "poc/epoch/";
inline constexpr std::string_view kWeightPrefix = "poc/weight/";
inline constexpr std::string_view kNextProposalId = "gov/next_proposal_id";
inline constexpr std::string_view kProposalPrefix = "gov/proposal/";
inline constexpr std::string_view kVotePrefix = "gov/vote/";
inline constexpr std::string_view kDepositPrefix = "gov/deposit/";
inline constexpr std::string_view kVotingEndPrefix = "gov/voting_end/";
inline constexpr std::string_view kNextShardId = "ts/next_shard_id";
inline constexpr std::string_view kShardPrefix = "ts/shard/";
inline constexpr std::string_view kMemberPrefix = "ts/member/";
inline constexpr std::string_view kMemberKeyPrefix = "ts/member_key/";
inline constexpr std::string_view kMemberCountPrefix = "ts/member_count/";
inline constexpr std::string_view kReservationDeadlinePrefix = "ts/reservation_deadline/";
inline constexpr std::string_view kDeadlinePrefix = "ts/deadline/";
inline constexpr std::string_view kSettlementPrefix = "ts/settlement/";

std::string Account(std::string_view address);
std::string Balance(std::string_view address);
std::string Epoch(uint64_t epoch);
std::string Weight(uint64_t epoch, std::string_view address);
std::string Proposal(uint64_t id);
std::string Vote(uint64_t proposal_id, std::string_view voter);
std::string Deposit(uint64_t proposal_id, std::string_view depositor);
std::string VotingEnd(int64_t height, uint64_t proposal_id);
std::string Shard(uint64_t id);
std::string Member(uint64_t shard_id, std::string_view host);
std::string MemberKey(uint64_t shard_id, std::string_view host);
std::string MemberCount(uint64_t shard_id);
std::string ReservationDeadline(int64_t height, uint64_t shard_id);
std::string Deadline(int64_t height, uint64_t shard_id);
std::string Settlement(uint64_t shard_id);
}  // namespace keys

// Memoised checks of 65-byte statement signatures. Recovery is a pure function of (digest,
// signature) and verification of (member key, digest, signature), so remembering them cannot
// change any result; it lets a settlement whose signatures were checked at CheckTx be applied
// at FinalizeBlock without checking them again (as Bitcoin Core's signature cache does between
// mempool and block). Bounded: each table is cleared when it reaches kEntriesMax.
class SigCache {
 public:
  static constexpr size_t kEntriesMax = 1 << 16;

  struct Recovered {
    std::string public_key;  // 33 bytes, compressed
    std::string address;     // its bech32 address
  };
  // The key that produced `signature` over the 32-byte `digest`. Errors as
  // common::RecoverPublicKey (failures are not remembered).
  absl::StatusOr<Recovered> Recover(std::string_view digest, std::string_view signature);
  // VerifyWithMemberKey (member_key.h); successes are remembered.
  bool Verify(std::string_view member_key, std::string_view digest, std::string_view signature);

  size_t recovered_size() const { return recovered_.size(); }
  size_t verified_size() const { return verified_.size(); }

 private:
  absl::flat_hash_map<std::string, Recovered> recovered_;
  absl::flat_hash_set<std::string> verified_;
  // The lookup key is assembled here, so a hit allocates nothing.
  std::string scratch_;
};

// Chain constants derived once from the genesis.
struct GonkaV0Env;  // gonka_v0.h

struct ChainEnv {
  pb::Genesis genesis;
  // The gonka-v0 profile's constants when genesis.gonka_v0 is set; null otherwise.
  std::shared_ptr<const GonkaV0Env> gonka_v0;
  uint64_t min_deposit = 0;
  std::string gov_address;
  std::string escrow_address;
  std::string community_pool_address;
  std::string fee_collector_address;
  GasPrice min_gas_price;
  SigCache* sig_cache = nullptr;
};

enum class MsgKind {
  kSend,
  kSubmitProposal,
  kVote,
  kDeposit,
  kSubmitPocWeights,
  kReserve,
  kAssemble,
  kSettle,
  // Gonka's trainshards v0 (the gonka-v0 profile).
  kGonkaAssemble,
  kGonkaSettle,
  kGonkaAutokick,
  kGonkaSetOptIn,
  kGonkaRefreshOptIn,
};

// A tx message, parsed strictly, with the address its signer field names.
struct TxMsg {
  MsgKind kind;
  std::string type_url;
  std::unique_ptr<google::protobuf::Message> msg;
  std::string signer;
};

// INVALID_ARGUMENT naming `field` for an unknown type URL, MsgCreateTrainshardProposal outside
// a proposal, bytes that do not parse, or unknown fields.
absl::StatusOr<TxMsg> ParseTxMsg(std::string_view field, const google::protobuf::Any& any);

using Events = std::vector<tendermint::abci::Event>;

// Appends an event of `type` with `attributes`, every one indexed (both keepers' Emit).
void AppendEvent(Events* events, std::string_view type,
                 std::initializer_list<std::pair<std::string_view, std::string_view>> attributes);

class Keeper {
 public:
  // `kv` and `events` must outlive the keeper; `height` is the block being executed.
  Keeper(const ChainEnv& env, KvOverlay* kv, int64_t height, Events* events)
      : env_(env), kv_(kv), height_(height), events_(events) {}

  // Writes the genesis state. INVALID_ARGUMENT naming the field for a bad genesis.
  absl::Status InitGenesis();

  // --- auth
  absl::StatusOr<std::optional<cosmos::auth::v1beta1::BaseAccount>> GetAccount(
      std::string_view address) const;
  void PutAccount(const cosmos::auth::v1beta1::BaseAccount& account);

  // --- bank
  absl::StatusOr<uint64_t> Balance(std::string_view address) const;
  absl::StatusOr<uint64_t> Supply() const;
  // Moves `amount` and emits the bank's coin_spent, coin_received and transfer events; the
  // recipient's account is created if new. SDK code 5 (insufficient funds) if `from` holds less.
  absl::Status Transfer(std::string_view from, std::string_view to, uint64_t amount);
  // The credit half of a Transfer (no event): adds `amount` to `to`, creating its account if
  // new. INTERNAL if the balance would overflow (impossible below the total supply).
  absl::Status Credit(std::string_view to, uint64_t amount);

  // The bank's events for `amount` moved from `from` to `to`, as the SDK emits them.
  void EmitTransfer(std::string_view from, std::string_view to, uint64_t amount);
  // A `message` event for message `index` of a tx: action (its type URL), sender, module.
  void EmitMessage(const TxMsg& msg, size_t index);
  // Appends an event (every attribute indexed).
  void Emit(std::string_view type,
            std::initializer_list<std::pair<std::string_view, std::string_view>> attributes);

  // --- poc
  absl::StatusOr<uint64_t> LatestEpoch() const;
  // The latest recorded epoch <= height / epoch_length_blocks.
  absl::StatusOr<uint64_t> EpochInForce(int64_t height) const;
  absl::StatusOr<uint64_t> Weight(uint64_t epoch, std::string_view host) const;
  // NOT_FOUND for an epoch never recorded. Weights are listed in address order.
  absl::StatusOr<pb::EpochWeights> GetEpochWeights(uint64_t epoch, bool with_weights) const;

  // --- gov
  // NOT_FOUND "proposal N not found".
  absl::StatusOr<pb::Proposal> GetProposal(uint64_t id) const;

  // --- trainshard
  // NOT_FOUND "shard N not found". With `with_members`, reservations are listed (address order).
  absl::StatusOr<pb::Shard> GetShard(uint64_t id, bool with_members) const;
  absl::StatusOr<pb::SettlementRecord> GetSettlement(uint64_t shard_id) const;

  // Executes one message of a tx signed by `signer` (already checked against the message's
  // signer field). Errors are the message's rejection: see docs/chain-module.md. A message
  // that succeeds may have parts moved out of it (a settlement moves into its record).
  absl::Status Execute(TxMsg* msg);
  // A message of Gonka's trainshards v0, by GonkaV0Keeper (the gonka-v0 profile only).
  absl::Status ExecuteGonka(const TxMsg& msg);

  // End of block: tallies at voting_end_height, shard reservation deadlines and deadlines.
  // An error means the state is inconsistent (DATA_LOSS or INTERNAL).
  absl::Status EndBlock();

 private:
  absl::Status Send(const cosmos::bank::v1beta1::MsgSend& msg);
  absl::Status SubmitProposal(const cosmos::gov::v1::MsgSubmitProposal& msg);
  absl::Status Vote(const cosmos::gov::v1::MsgVote& msg);
  absl::Status Deposit(const cosmos::gov::v1::MsgDeposit& msg);
  absl::Status SubmitPocWeights(const pb::MsgSubmitPocWeights& msg);
  absl::Status Reserve(const pb::MsgReserveTrainshard& msg);
  absl::Status Assemble(const pb::MsgAssembleTrainshard& msg);
  absl::Status Settle(pb::MsgSettleTrainshard* msg);
  // Whether `signature` over `digest` is by `host`, a member whose key would be stored under
  // `key_name` (keys::MemberKey): verified against that key, or, for a member recorded without
  // one, recovered to the host's address. DATA_LOSS for a stored key of the wrong size.
  absl::StatusOr<bool> SignedByMember(std::string_view key_name, std::string_view host,
                                      std::string_view digest, std::string_view signature);

  absl::Status Tally(uint64_t proposal_id);
  absl::Status ExecuteProposal(const pb::Proposal& proposal);
  // SubmitProposal in the gonka-v0 profile: messages of Gonka's MsgCreateTrainshardProposal,
  // executed by its keeper when the proposal passes; no shard record until then.
  absl::Status SubmitGonkaProposal(const cosmos::gov::v1::MsgSubmitProposal& msg, uint64_t deposit);
  // What every accepted proposal does first: takes the deposit, records it with `messages`, in
  // its voting period over the weights in force, and emits gov.proposal_submitted. The caller
  // adds what its kind needs and stores it (PutProposal).
  absl::StatusOr<pb::Proposal> OpenVoting(const cosmos::gov::v1::MsgSubmitProposal& msg,
                                          uint64_t deposit,
                                          std::vector<google::protobuf::Any> messages);
  absl::Status RefundDeposits(uint64_t proposal_id, bool to_community_pool);
  absl::Status ReservationDeadline(uint64_t shard_id);
  absl::Status Deadline(uint64_t shard_id);

  absl::Status RecordEpoch(uint64_t epoch, const std::vector<pb::HostWeight>& weights);
  void PutProposal(const pb::Proposal& proposal);
  void PutShard(const pb::Shard& shard);
  absl::StatusOr<uint64_t> MemberCount(uint64_t shard_id) const;
  absl::StatusOr<std::optional<pb::Reservation>> GetMember(uint64_t shard_id,
                                                           std::string_view host) const;
  absl::StatusOr<uint64_t> NextId(std::string_view key);
  absl::Status EnsureAccount(std::string_view address);
  void SetBalance(std::string_view address, uint64_t amount);
  // Balance and SetBalance by the balance key (keys::Balance), built once by the caller.
  absl::StatusOr<uint64_t> BalanceAt(std::string_view key) const;
  void SetBalanceAt(std::string_view key, uint64_t amount);
  // OPEN -> RUNNING: drops the reservation deadline and emits shard_running.
  absl::Status StartShard(pb::Shard* shard, uint64_t members);
  // Ends an OPEN or RUNNING shard: refunds what it holds, drops its deadlines.
  absl::Status ExpireShard(pb::Shard* shard, pb::CloseReason reason);

  const pb::Params& params() const { return env_.genesis.params(); }

  const ChainEnv& env_;
  KvOverlay* kv_;
  int64_t height_;
  Events* events_;
};

// Lower-case status name used in messages, e.g. "running".
std::string ShardStatusName(pb::ShardStatus status);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_KEEPER_H_
