// Gonka's "trainshards v0" (its `inference` module, package inference.inference) as a standalone
// keeper, so the devnet can run a "gonka-v0 profile" and the sidecar can be tested against the
// primitives a real Gonka chain offers: governance-created proposals, deterministic assembly of
// opted-in ML nodes, a creator's unilateral settle, node kicks, opt-in with a TTL, and the
// per-block expiry / release / pruning. Semantics follow Gonka's keeper code (pull requests
// #1350 and #1790 of gonka-ai/gonka; docs/gonka-v0.md); there is no escrow, no payment and no
// quorum in v0. The App runs it when genesis.gonka_v0 is set (Keeper::ExecuteGonka, the gov
// proposal's execution, EndBlock).
//
// Like Keeper, a GonkaV0Keeper works on one KvOverlay at one height and appends the events it
// emits; the caller runs each message in a branch and drops it when the message fails (a failed
// message may have written part of its state). Everything is deterministic: no time, randomness,
// floats or unordered iteration. Every key it writes starts with "gv0/" (keys below).
//
// Thread-safety: not thread-safe; one owner thread (the App's).
//
// Errors. Gonka's own refusals (codespace "inference", codes 1198-1215 of its errors.go) are
// absl statuses whose message starts "inference <code>: <Gonka's error text>: <detail>", e.g.
// "inference 1203: insufficient free capacity: 2 of 3 nodes"; GonkaV0CodeOf() reads the number
// back so a later layer can report codespace "inference" and that code. The absl code of each:
//   1198 training disabled ................... FAILED_PRECONDITION
//   1199 proposal not found .................. NOT_FOUND
//   1200 proposal not open ................... FAILED_PRECONDITION
//   1201 gpu profile not allowed ............. INVALID_ARGUMENT
//   1202 proposal violates static caps ....... INVALID_ARGUMENT
//   1203 insufficient free capacity .......... RESOURCE_EXHAUSTED
//   1204 trainshard not found ................ NOT_FOUND
//   1205 not the creator ..................... PERMISSION_DENIED
//   1206 creator cooldown .................... FAILED_PRECONDITION
//   1207 active shard limit .................. RESOURCE_EXHAUSTED
//   1208 node reserved by active shard ....... FAILED_PRECONDITION
//   1209 node not owned by host .............. PERMISSION_DENIED
//   1210 empty gpu profile id ................ INVALID_ARGUMENT
//   1211 trainshard not active ............... FAILED_PRECONDITION
//   1212 node not an active node of shard .... FAILED_PRECONDITION
//   1213 signer may not autokick ............. PERMISSION_DENIED
//   1214 base image not pinned ............... INVALID_ARGUMENT
//   1215 invalid opt-in request .............. INVALID_ARGUMENT
// Refusals that Gonka raises from the SDK rather than its own codespace carry no "inference"
// prefix: a bad bech32 address (SDK ErrInvalidAddress) and malformed autokick fields (SDK
// ErrInvalidRequest) are INVALID_ARGUMENT naming the field; a CreateProposal not signed by the
// gov authority is PERMISSION_DENIED. ALREADY_EXISTS "inference: autokick request reused" is
// Gonka's ErrTrainshardAutokickRequestReused, whose number no stored copy shows (so none is
// quoted). DATA_LOSS means a stored record does not parse (corrupted state).
//
// Decisions where the notes left a choice (Gonka behaviour unknown or not expressible here):
// * The epoch's ML nodes come from GonkaV0Env::ml_nodes (one entry per node and model) instead
//   of Gonka's active participants + declared hardware; a node's GPU profile is the
//   gpu_profile_id of its first entry (ValidateEnv refuses entries that disagree). The same
//   list stands for "the host's declared hardware nodes" in the opt-in ownership checks.
// * ValidateParams(params) checks the epoch-free rules; the two rules that need the epoch
//   length (retention >= 2*epoch + release_buffer, opt_in_ttl >= epoch, when enabled) are in the
//   overload taking epoch_length_blocks. "Every cap > 0" is applied to max_nodes_per_shard,
//   max_active_shards, max_active_shards_per_creator, max_total_reserved_nodes,
//   max_expirations_per_block, both share bps (also <= 10000), min_duration_blocks and
//   opt_in_ttl_blocks; creator_cooldown_blocks (Gonka's default is 0), release_buffer_blocks and
//   settled_shard_retention_blocks must be >= 0; every *_blocks <= 1e15; allowed profile ids
//   must be non-empty strings.
// * An empty node_id in an opt-in (Gonka's ErrPocNodeIdEmpty, number unknown) is reported as
//   1215 (invalid opt-in request), as are duplicate ids in a refresh.
// * Stage 2's "no assembly during PoC" (ErrTrainshardAssemblyDuringPoC) is not implemented: the
//   devnet has no PoC phases. The stage-2 endpoint is stored per (participant, node) and read
//   with Endpoint(); assembly copies it into TrainshardReservedNode.endpoint, whose field
//   number (9) is an assumption (no stored copy of stage 2's trainshard.proto shows it).
// * EndBlock's per-step limit is max_expirations_per_block for each of its three steps, as in
//   Gonka. Gonka logs and defers a shard that fails to close; here a failure is corrupted state,
//   so EndBlock returns it (DATA_LOSS) and the caller decides.
// * As in Gonka: opting out checks no ownership (a host may clear an opt-in of a node it no
//   longer declares); proposals are never pruned; the "at least one node per model stays free"
//   and share caps count only nodes held ACTIVE by active shards (not nodes in their return
//   buffer, which are merely unselectable). RefreshOptIn checks every node before writing any,
//   where Gonka relies on the tx being reverted.
#ifndef TS_CHAIN_BRIDGE_MODULE_GONKA_V0_H_
#define TS_CHAIN_BRIDGE_MODULE_GONKA_V0_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chain-bridge/module/keeper.h"
#include "chain-bridge/module/kv_overlay.h"
#include "inference/inference/trainshard.pb.h"

namespace ts::bridge {

namespace gv0 = ::inference::inference;

// The key layout (Gonka's store prefixes 130-142, under "gv0/"). Ids and heights are Be64 so
// byte order is numeric order; a node is "<participant>\0<node_id>" (a bech32 address holds no
// NUL, so the split is unambiguous).
namespace gv0_keys {
inline constexpr std::string_view kPrefix = "gv0/";
inline constexpr std::string_view kShardPrefix = "gv0/shard/";              // id -> Trainshard
inline constexpr std::string_view kShardCounter = "gv0/shard_counter";      // last id
inline constexpr std::string_view kActivePrefix = "gv0/active/";            // id -> ""
inline constexpr std::string_view kExpiryPrefix = "gv0/expiry/";            // height, id -> ""
inline constexpr std::string_view kClosedPrefix = "gv0/closed/";            // height, id -> ""
inline constexpr std::string_view kReservationPrefix = "gv0/reservation/";  // node -> Be64 id
inline constexpr std::string_view kOptInPrefix = "gv0/opt_in/";             // node -> Be64 height
inline constexpr std::string_view kProposalPrefix = "gv0/proposal/";        // id -> proposal
inline constexpr std::string_view kProposalCounter = "gv0/proposal_counter";
inline constexpr std::string_view kCooldownPrefix = "gv0/cooldown/";  // creator -> Be64 height
inline constexpr std::string_view kReleasePrefix = "gv0/release/";    // until, node -> ""
inline constexpr std::string_view kAutokickPrefix = "gv0/autokick/";  // id, request -> node
inline constexpr std::string_view kEndpointPrefix = "gv0/endpoint/";  // node -> URL

std::string Node(std::string_view participant, std::string_view node_id);
std::string Shard(uint64_t id);
std::string Active(uint64_t id);
std::string Expiry(int64_t height, uint64_t id);
std::string Closed(int64_t height, uint64_t id);
std::string Reservation(std::string_view participant, std::string_view node_id);
std::string OptIn(std::string_view participant, std::string_view node_id);
std::string Proposal(uint64_t id);
std::string Cooldown(std::string_view creator);
std::string Release(int64_t until_height, std::string_view participant, std::string_view node_id);
std::string Autokick(uint64_t shard_id, std::string_view request_id);
std::string Endpoint(std::string_view participant, std::string_view node_id);
}  // namespace gv0_keys

// Gonka's error codes (codespace "inference"), from its x/inference/types/errors.go.
enum class GonkaV0Code : uint32_t {
  kTrainingDisabled = 1198,
  kProposalNotFound = 1199,
  kProposalNotOpen = 1200,
  kGpuProfileNotAllowed = 1201,
  kStaticCaps = 1202,
  kInsufficientCapacity = 1203,
  kTrainshardNotFound = 1204,
  kNotCreator = 1205,
  kCreatorCooldown = 1206,
  kActiveLimit = 1207,
  kNodeReserved = 1208,
  kNodeNotOwned = 1209,
  kEmptyGpuProfile = 1210,
  kTrainshardNotActive = 1211,
  kNodeNotActive = 1212,
  kAutokickNotAllowed = 1213,
  kBaseImageInvalid = 1214,
  kOptInRequest = 1215,
};

inline constexpr std::string_view kGonkaV0Codespace = "inference";

// The status for a Gonka refusal: "inference <code>: <Gonka's text>: <detail>" with the absl
// code of the table above.
absl::Status GonkaV0Error(GonkaV0Code code, std::string_view detail);
// The Gonka code quoted by a status made by GonkaV0Error, nullopt for any other status.
std::optional<uint32_t> GonkaV0CodeOf(const absl::Status& status);

// One (ML node, model) pair of the epoch: a node serving two models appears twice.
struct GonkaMlNode {
  std::string participant;  // host account (bech32)
  std::string node_id;      // the host's local ML-node id
  std::string model_id;
  std::string gpu_profile_id;  // Gonka's CanonicalGpuProfileId of the node's hardware
  int64_t poc_weight = 0;      // copied into the reservation ("frozen") at assembly
};

// Chain constants the keeper reads; the devnet fills them from its genesis.
struct GonkaV0Env {
  gv0::TrainingParams params;
  std::string authority;  // the gov module account, the only signer of CreateProposal
  std::vector<GonkaMlNode> ml_nodes;
  std::set<std::string> guardians;  // genesis guardian participants, never selected
};

// Maximum sizes Gonka enforces on message fields.
inline constexpr size_t kGonkaMaxBaseImageBytes = 512;
inline constexpr size_t kGonkaMaxRefreshNodes = 256;
inline constexpr size_t kGonkaMaxEndpointBytes = 256;
inline constexpr size_t kGonkaMaxKickReasonBytes = 256;
inline constexpr size_t kGonkaMaxRequestIdBytes = 128;
// Gonka's bound on every *_blocks parameter, and the basis-point scale of its share caps.
inline constexpr int64_t kGonkaBlocksMax = 1'000'000'000'000'000;
inline constexpr int64_t kGonkaBpsMax = 10'000;

// Gonka's DefaultTrainingParams(), exactly (training_enabled is false).
gv0::TrainingParams DefaultTrainingParams();

// INVALID_ARGUMENT naming the field and value unless `endpoint` is an absolute http(s) base URL:
// host required, optional port 1..65535 and path, no userinfo/query/fragment, no trailing
// slash, at most kGonkaMaxEndpointBytes (reported as 1215, as Gonka does).
absl::Status ValidateTrainingEndpoint(std::string_view endpoint);

class GonkaV0Keeper {
 public:
  // `env`, `kv` and `events` must outlive the keeper; `height` is the block being executed.
  GonkaV0Keeper(const GonkaV0Env& env, KvOverlay* kv, int64_t height, Events* events)
      : env_(env), kv_(kv), height_(height), events_(events) {}

  // INVALID_ARGUMENT "training_params.<field>: ..." for params Gonka would refuse (see the
  // decisions above); the overload also applies the epoch-length rules when enabled.
  static absl::Status ValidateParams(const gv0::TrainingParams& params);
  static absl::Status ValidateParams(const gv0::TrainingParams& params,
                                     int64_t epoch_length_blocks);
  // INVALID_ARGUMENT naming the entry for an env the keeper cannot use: bad params or
  // authority, an ML node without participant/node/model, a negative weight, a node listed with
  // two GPU profiles or the same (node, model) twice.
  static absl::Status ValidateEnv(const GonkaV0Env& env);

  // --- messages (each returns the refusal, or writes its state and events)
  absl::StatusOr<gv0::MsgCreateTrainshardProposalResponse> CreateProposal(
      const gv0::MsgCreateTrainshardProposal& msg);
  absl::StatusOr<gv0::MsgAssembleTrainshardResponse> Assemble(
      const gv0::MsgAssembleTrainshard& msg);
  // Settling a shard that is no longer active succeeds and changes nothing.
  absl::Status Settle(const gv0::MsgSettleTrainshard& msg);
  // A repeat of a handled (shard, request_id) for the same node succeeds and changes nothing.
  absl::Status Autokick(const gv0::MsgAutokickTrainshardNode& msg);
  absl::Status SetOptIn(const gv0::MsgSetTrainingNodeOptIn& msg);
  absl::StatusOr<gv0::MsgRefreshTrainingNodeOptInResponse> RefreshOptIn(
      const gv0::MsgRefreshTrainingNodeOptIn& msg);

  // Expiry (TIMEOUT) of shards with expires_at <= height, release of reservations whose buffer
  // ended, pruning of shards closed more than settled_shard_retention_blocks ago; each step
  // handles at most max_expirations_per_block entries (the rest wait for the next block).
  absl::Status EndBlock();

  // --- queries (not-found is found=false, as Gonka answers)
  absl::StatusOr<gv0::QueryGetTrainshardResponse> GetTrainshard(uint64_t id) const;
  // Every ACTIVE shard, in id order.
  absl::StatusOr<gv0::QueryActiveTrainshardsResponse> ActiveTrainshards() const;
  absl::StatusOr<gv0::QueryGetTrainshardProposalResponse> GetProposal(uint64_t id) const;
  // The host daemon endpoint last refreshed for the node, "" when none.
  std::string Endpoint(std::string_view participant, std::string_view node_id) const;
  // The node's opt-in expiry height, nullopt when it never opted in or opted out.
  absl::StatusOr<std::optional<int64_t>> OptInExpiry(std::string_view participant,
                                                     std::string_view node_id) const;
  // The shard id holding the node's reservation (active or in its return buffer), if any.
  absl::StatusOr<std::optional<uint64_t>> ReservationOf(std::string_view participant,
                                                        std::string_view node_id) const;

 private:
  struct ReservedCounts;
  struct EpochView;

  EpochView BuildEpochView() const;
  absl::Status CheckStaticLimits(std::string_view gpu_profile_id, uint32_t max_nodes,
                                 int64_t max_duration_blocks) const;
  absl::StatusOr<ReservedCounts> CountReserved() const;
  absl::StatusOr<std::vector<gv0::TrainshardReservedNode>> SelectNodes(
      uint64_t trainshard_id, std::string_view gpu_profile_id, uint32_t max_nodes);
  absl::StatusOr<std::optional<gv0::Trainshard>> LoadShard(uint64_t id) const;
  void PutShard(const gv0::Trainshard& shard);
  // Marks the selected ACTIVE entries released and indexes each physical node once for the end
  // of its return buffer. `participant` empty selects every active entry.
  void ReleaseNodes(gv0::Trainshard* shard, gv0::TrainshardNodeStatus status,
                    std::string_view reason, std::string_view participant,
                    std::string_view node_id);
  // Releases every active node, drops the active and expiry entries, records the close and
  // moves the creator's cooldown forward. DATA_LOSS for a corrupted cooldown record.
  absl::Status CloseShard(gv0::Trainshard* shard, gv0::TrainshardStatus status,
                          gv0::TrainshardCloseReason reason);
  bool OwnsNode(std::string_view participant, std::string_view node_id) const;
  absl::StatusOr<bool> NodeActivelyReserved(std::string_view participant,
                                            std::string_view node_id) const;
  absl::StatusOr<uint64_t> ReadCounter(std::string_view key) const;
  absl::Status ExpireShards();
  absl::Status ReleaseReturned();
  absl::Status PruneClosed();
  void Emit(std::string_view type,
            std::initializer_list<std::pair<std::string_view, std::string_view>> attributes);

  const gv0::TrainingParams& params() const { return env_.params; }

  const GonkaV0Env& env_;
  KvOverlay* kv_;
  int64_t height_;
  Events* events_;
};

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_GONKA_V0_H_
