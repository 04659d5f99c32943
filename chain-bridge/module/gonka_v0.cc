// Gonka trainshards v0: messages, selection, end-block and queries (contract in gonka_v0.h).
#include "chain-bridge/module/gonka_v0.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "chain-bridge/module/keeper_util.h"
#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/str_cat.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/status.h"

namespace ts::bridge {

using keeper_util::Invalid;
using keeper_util::Load;
using keeper_util::LoadU64;

namespace gv0_keys {
namespace {
std::string HeightBytes(int64_t height) { return Be64(static_cast<uint64_t>(height)); }
}  // namespace

std::string Node(std::string_view participant, std::string_view node_id) {
  return Cat(participant, std::string_view("\0", 1), node_id);
}
std::string Shard(uint64_t id) { return Cat(kShardPrefix, Be64(id)); }
std::string Active(uint64_t id) { return Cat(kActivePrefix, Be64(id)); }
std::string Expiry(int64_t height, uint64_t id) {
  return Cat(kExpiryPrefix, HeightBytes(height), Be64(id));
}
std::string Closed(int64_t height, uint64_t id) {
  return Cat(kClosedPrefix, HeightBytes(height), Be64(id));
}
std::string Reservation(std::string_view participant, std::string_view node_id) {
  return Cat(kReservationPrefix, Node(participant, node_id));
}
std::string OptIn(std::string_view participant, std::string_view node_id) {
  return Cat(kOptInPrefix, Node(participant, node_id));
}
std::string Proposal(uint64_t id) { return Cat(kProposalPrefix, Be64(id)); }
std::string Cooldown(std::string_view creator) { return Cat(kCooldownPrefix, creator); }
std::string Release(int64_t until_height, std::string_view participant, std::string_view node_id) {
  return Cat(kReleasePrefix, HeightBytes(until_height), Node(participant, node_id));
}
std::string Autokick(uint64_t shard_id, std::string_view request_id) {
  return Cat(kAutokickPrefix, Be64(shard_id), request_id);
}
std::string Endpoint(std::string_view participant, std::string_view node_id) {
  return Cat(kEndpointPrefix, Node(participant, node_id));
}
}  // namespace gv0_keys

namespace {

constexpr std::string_view kPinnedDigestSeparator = "@sha256:";
constexpr size_t kPinnedDigestChars = 64;

struct CodeInfo {
  GonkaV0Code code;
  absl::StatusCode status_code;
  std::string_view text;
};

// Indexed by code - 1198; the table in gonka_v0.h.
constexpr CodeInfo kCodes[] = {
    {GonkaV0Code::kTrainingDisabled, absl::StatusCode::kFailedPrecondition, "training disabled"},
    {GonkaV0Code::kProposalNotFound, absl::StatusCode::kNotFound, "trainshard proposal not found"},
    {GonkaV0Code::kProposalNotOpen, absl::StatusCode::kFailedPrecondition,
     "trainshard proposal not open"},
    {GonkaV0Code::kGpuProfileNotAllowed, absl::StatusCode::kInvalidArgument,
     "gpu profile not allowed"},
    {GonkaV0Code::kStaticCaps, absl::StatusCode::kInvalidArgument, "proposal violates static caps"},
    {GonkaV0Code::kInsufficientCapacity, absl::StatusCode::kResourceExhausted,
     "insufficient free capacity"},
    {GonkaV0Code::kTrainshardNotFound, absl::StatusCode::kNotFound, "trainshard not found"},
    {GonkaV0Code::kNotCreator, absl::StatusCode::kPermissionDenied, "not the trainshard creator"},
    {GonkaV0Code::kCreatorCooldown, absl::StatusCode::kFailedPrecondition, "creator cooldown"},
    {GonkaV0Code::kActiveLimit, absl::StatusCode::kResourceExhausted, "active trainshard limit"},
    {GonkaV0Code::kNodeReserved, absl::StatusCode::kFailedPrecondition,
     "node reserved by an active trainshard"},
    {GonkaV0Code::kNodeNotOwned, absl::StatusCode::kPermissionDenied, "node not owned by host"},
    {GonkaV0Code::kEmptyGpuProfile, absl::StatusCode::kInvalidArgument, "empty gpu profile id"},
    {GonkaV0Code::kTrainshardNotActive, absl::StatusCode::kFailedPrecondition,
     "trainshard not active"},
    {GonkaV0Code::kNodeNotActive, absl::StatusCode::kFailedPrecondition,
     "node not an active node of the trainshard"},
    {GonkaV0Code::kAutokickNotAllowed, absl::StatusCode::kPermissionDenied,
     "signer may not autokick"},
    {GonkaV0Code::kBaseImageInvalid, absl::StatusCode::kInvalidArgument,
     "base image not pinned repo@sha256:<digest>"},
    {GonkaV0Code::kOptInRequest, absl::StatusCode::kInvalidArgument, "invalid opt-in request"},
};
constexpr uint32_t kFirstCode = 1198;
constexpr uint32_t kLastCode = kFirstCode + std::size(kCodes) - 1;

const CodeInfo& Info(GonkaV0Code code) {
  const uint32_t number = static_cast<uint32_t>(code);
  TS_CHECK(number >= kFirstCode && number <= kLastCode);
  const CodeInfo& info = kCodes[number - kFirstCode];
  TS_CHECK(info.code == code);
  return info;
}

bool IsActive(const gv0::TrainshardReservedNode& node) {
  return node.status() == gv0::TRAINSHARD_NODE_STATUS_ACTIVE;
}

bool HasActiveNode(const gv0::Trainshard& shard, std::string_view participant,
                   std::string_view node_id) {
  for (const auto& node : shard.nodes()) {
    if (IsActive(node) && node.participant() == participant && node.node_id() == node_id) {
      return true;
    }
  }
  return false;
}

bool HasAnyActiveNode(const gv0::Trainshard& shard) {
  return std::any_of(shard.nodes().begin(), shard.nodes().end(), IsActive);
}

// Gonka's reserveShareCap: the share of `capacity` nodes that may be reserved, rounded down.
int64_t ShareCap(int64_t capacity, uint32_t bps) {
  return capacity * static_cast<int64_t>(bps) / kGonkaBpsMax;
}

// Gonka's candidateSortKey: SHA-256(Be64(shard id) || participant || 0x00 || node_id).
std::string CandidateSortKey(uint64_t trainshard_id, std::string_view participant,
                             std::string_view node_id) {
  return common::Sha256(Cat(Be64(trainshard_id), gv0_keys::Node(participant, node_id)));
}

absl::Status ValidatePinnedImage(std::string_view image) {
  size_t at = image.find(kPinnedDigestSeparator);
  bool ok = at != std::string_view::npos && at > 0 && image.size() <= kGonkaMaxBaseImageBytes;
  std::string_view digest =
      ok ? image.substr(at + kPinnedDigestSeparator.size()) : std::string_view();
  ok = ok && digest.size() == kPinnedDigestChars &&
       std::all_of(digest.begin(), digest.end(),
                   [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  if (ok) return absl::OkStatus();
  return GonkaV0Error(GonkaV0Code::kBaseImageInvalid, Cat("base_image \"", image, "\""));
}

}  // namespace

absl::Status GonkaV0Error(GonkaV0Code code, std::string_view detail) {
  const CodeInfo& info = Info(code);
  return absl::Status(info.status_code, Cat(kGonkaV0Codespace, " ", static_cast<uint32_t>(code),
                                            ": ", info.text, ": ", detail));
}

std::optional<uint32_t> GonkaV0CodeOf(const absl::Status& status) {
  std::string_view message(status.message().data(), status.message().size());
  std::string prefix = Cat(kGonkaV0Codespace, " ");
  if (status.ok() || message.substr(0, prefix.size()) != prefix) return std::nullopt;
  message.remove_prefix(prefix.size());
  uint32_t code = 0;
  size_t digits = 0;
  while (digits < message.size() && digits < 5 && message[digits] >= '0' &&
         message[digits] <= '9') {
    code = code * 10 + static_cast<uint32_t>(message[digits] - '0');
    ++digits;
  }
  if (digits == 0 || digits >= message.size() || message[digits] != ':') return std::nullopt;
  if (code < kFirstCode || code > kLastCode) return std::nullopt;
  return code;
}

// --- CreateProposal

absl::Status GonkaV0Keeper::CheckStaticLimits(std::string_view gpu_profile_id, uint32_t max_nodes,
                                              int64_t max_duration_blocks) const {
  if (gpu_profile_id.empty()) {
    return GonkaV0Error(GonkaV0Code::kEmptyGpuProfile, "gpu_profile_id is empty");
  }
  const auto& allowed = params().allowed_gpu_profile_ids();
  if (!allowed.empty() &&
      std::find(allowed.begin(), allowed.end(), gpu_profile_id) == allowed.end()) {
    return GonkaV0Error(GonkaV0Code::kGpuProfileNotAllowed,
                        Cat("gpu_profile_id \"", gpu_profile_id,
                            "\" is not in training_params.allowed_gpu_profile_ids"));
  }
  if (max_nodes == 0 || max_nodes > params().max_nodes_per_shard()) {
    return GonkaV0Error(GonkaV0Code::kStaticCaps, Cat("max_nodes ", max_nodes, " not in (0, ",
                                                      params().max_nodes_per_shard(), "]"));
  }
  if (max_duration_blocks < params().min_duration_blocks() ||
      max_duration_blocks > params().max_duration_blocks()) {
    return GonkaV0Error(GonkaV0Code::kStaticCaps, Cat("max_duration_blocks ", max_duration_blocks,
                                                      " not in [", params().min_duration_blocks(),
                                                      ", ", params().max_duration_blocks(), "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<gv0::MsgCreateTrainshardProposalResponse> GonkaV0Keeper::CreateProposal(
    const gv0::MsgCreateTrainshardProposal& msg) {
  if (msg.authority() != env_.authority) {
    return absl::PermissionDeniedError(
        Cat("authority: expected ", env_.authority, ", got ", msg.authority()));
  }
  TS_RETURN_IF_ERROR(
      CheckStaticLimits(msg.gpu_profile_id(), msg.max_nodes(), msg.max_duration_blocks()));
  TS_RETURN_IF_ERROR(common::ParseAddress("creator", msg.creator()).status());
  TS_RETURN_IF_ERROR(ValidatePinnedImage(msg.base_image()));
  if (!msg.run_key().empty()) {
    TS_RETURN_IF_ERROR(common::ParseAddress("run_key", msg.run_key()).status());
  }
  TS_ASSIGN_OR_RETURN(uint64_t last, ReadCounter(gv0_keys::kProposalCounter));
  const uint64_t id = last + 1;
  gv0::TrainshardProposal proposal;
  proposal.set_creator(msg.creator());
  proposal.set_gpu_profile_id(msg.gpu_profile_id());
  proposal.set_max_nodes(msg.max_nodes());
  proposal.set_max_duration_blocks(msg.max_duration_blocks());
  proposal.set_id(id);
  proposal.set_status(gv0::TRAINSHARD_PROPOSAL_STATUS_OPEN);
  proposal.set_base_image(msg.base_image());
  proposal.set_run_key(msg.run_key());
  kv_->Set(gv0_keys::Proposal(id), DeterministicBytes(proposal));
  kv_->Set(gv0_keys::kProposalCounter, Be64(id));
  Emit("trainshard_proposal_created", {{"proposal_id", Cat(id)},
                                       {"creator", msg.creator()},
                                       {"gpu_profile_id", msg.gpu_profile_id()}});
  gv0::MsgCreateTrainshardProposalResponse response;
  response.set_proposal_id(id);
  return response;
}

// --- Assemble and selection

struct GonkaV0Keeper::ReservedCounts {
  int64_t total = 0;  // physical nodes held ACTIVE by active shards
  std::map<std::string, int64_t> per_model;
  std::map<std::string, int64_t> per_profile;
  int64_t active_shards = 0;
  std::map<std::string, int64_t> per_creator;
};

// The epoch's physical nodes with their (model) entries, and capacities counting each physical
// node once per model and once per profile. std::map keeps every walk deterministic.
struct GonkaV0Keeper::EpochView {
  struct Node {
    std::string participant;
    std::string node_id;
    std::string profile;
    std::vector<const GonkaMlNode*> entries;  // one per model, env order
  };
  std::map<std::string, Node> nodes;  // by gv0_keys::Node
  std::map<std::string, int64_t> model_capacity;
  std::map<std::string, int64_t> profile_capacity;
};

GonkaV0Keeper::EpochView GonkaV0Keeper::BuildEpochView() const {
  EpochView view;
  std::set<std::string> counted_pairs;  // a (node, model) listed twice adds nothing
  for (const GonkaMlNode& ml : env_.ml_nodes) {
    if (ml.participant.empty() || ml.node_id.empty()) continue;
    std::string key = gv0_keys::Node(ml.participant, ml.node_id);
    if (!counted_pairs.insert(Cat(ml.model_id, std::string_view("\0", 1), key)).second) continue;
    auto [it, inserted] = view.nodes.try_emplace(key);
    EpochView::Node& node = it->second;
    if (inserted) {
      node.participant = ml.participant;
      node.node_id = ml.node_id;
      node.profile = ml.gpu_profile_id;
      if (!node.profile.empty()) ++view.profile_capacity[node.profile];
    }
    node.entries.push_back(&ml);
    ++view.model_capacity[ml.model_id];
  }
  return view;
}

absl::StatusOr<GonkaV0Keeper::ReservedCounts> GonkaV0Keeper::CountReserved() const {
  ReservedCounts counts;
  for (const auto& [key, value] : kv_->Scan(gv0_keys::kActivePrefix)) {
    std::string_view id_bytes = std::string_view(key).substr(gv0_keys::kActivePrefix.size());
    TS_ASSIGN_OR_RETURN(uint64_t id, ReadBe64(key, id_bytes));
    TS_ASSIGN_OR_RETURN(std::optional<gv0::Trainshard> shard, LoadShard(id));
    if (!shard.has_value()) {
      return absl::DataLossError(Cat("active trainshard ", id, " has no record"));
    }
    ++counts.active_shards;
    ++counts.per_creator[shard->creator()];
    std::set<std::string> seen;
    for (const auto& node : shard->nodes()) {
      if (!IsActive(node)) continue;
      ++counts.per_model[node.model_id()];
      if (seen.insert(gv0_keys::Node(node.participant(), node.node_id())).second) {
        ++counts.total;
        ++counts.per_profile[shard->gpu_profile_id()];
      }
    }
  }
  return counts;
}

absl::StatusOr<std::vector<gv0::TrainshardReservedNode>> GonkaV0Keeper::SelectNodes(
    uint64_t trainshard_id, std::string_view gpu_profile_id, uint32_t max_nodes) {
  EpochView view = BuildEpochView();
  TS_ASSIGN_OR_RETURN(ReservedCounts reserved, CountReserved());

  std::vector<std::pair<std::string, const EpochView::Node*>> candidates;  // (sort key, node)
  for (const auto& [key, node] : view.nodes) {
    if (node.profile.empty() || node.profile != gpu_profile_id) continue;
    if (env_.guardians.count(node.participant) > 0) continue;
    TS_ASSIGN_OR_RETURN(std::optional<int64_t> expiry, OptInExpiry(node.participant, node.node_id));
    if (!expiry.has_value() || *expiry <= height_) continue;
    if (kv_->Contains(gv0_keys::Reservation(node.participant, node.node_id))) continue;
    candidates.emplace_back(CandidateSortKey(trainshard_id, node.participant, node.node_id), &node);
  }
  // Ties in SHA-256 are not expected; Gonka breaks them by participant then node id, which the
  // node key order gives here.
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return gv0_keys::Node(a.second->participant, a.second->node_id) <
           gv0_keys::Node(b.second->participant, b.second->node_id);
  });

  const std::string profile(gpu_profile_id);
  const int64_t profile_cap =
      ShareCap(view.profile_capacity[profile], params().max_reserved_share_per_profile_bps());
  const int64_t profile_reserved = reserved.per_profile[profile];
  std::map<std::string, int64_t> taken_model;
  int64_t taken = 0;
  std::vector<gv0::TrainshardReservedNode> picked;
  for (const auto& [sort_key, node] : candidates) {
    if (taken >= static_cast<int64_t>(max_nodes)) break;
    if (reserved.total + taken + 1 > static_cast<int64_t>(params().max_total_reserved_nodes())) {
      break;
    }
    if (profile_reserved + taken + 1 > profile_cap) continue;
    bool fits = true;
    for (const GonkaMlNode* entry : node->entries) {
      const std::string& model = entry->model_id;
      const int64_t after = reserved.per_model[model] + taken_model[model] + 1;
      const int64_t capacity = view.model_capacity[model];
      // The share cap, and at least one node of every model left free for inference.
      if (after > ShareCap(capacity, params().max_reserved_share_per_model_bps()) ||
          capacity - after < 1) {
        fits = false;
        break;
      }
    }
    if (!fits) continue;
    for (const GonkaMlNode* entry : node->entries) {
      ++taken_model[entry->model_id];
      gv0::TrainshardReservedNode& out = picked.emplace_back();
      out.set_participant(entry->participant);
      out.set_node_id(entry->node_id);
      out.set_model_id(entry->model_id);
      out.set_poc_weight(entry->poc_weight);
      out.set_status(gv0::TRAINSHARD_NODE_STATUS_ACTIVE);
      out.set_endpoint(Endpoint(entry->participant, entry->node_id));
    }
    ++taken;
  }
  if (taken < static_cast<int64_t>(max_nodes)) {
    return GonkaV0Error(GonkaV0Code::kInsufficientCapacity,
                        Cat(taken, " of ", max_nodes, " nodes (gpu profile \"", gpu_profile_id,
                            "\", ", candidates.size(), " candidates)"));
  }
  return picked;
}

absl::StatusOr<gv0::MsgAssembleTrainshardResponse> GonkaV0Keeper::Assemble(
    const gv0::MsgAssembleTrainshard& msg) {
  if (!params().training_enabled()) {
    return GonkaV0Error(GonkaV0Code::kTrainingDisabled, "training_params.training_enabled=false");
  }
  TS_ASSIGN_OR_RETURN(std::optional<gv0::TrainshardProposal> proposal,
                      Load<gv0::TrainshardProposal>(*kv_, gv0_keys::Proposal(msg.proposal_id())));
  if (!proposal.has_value()) {
    return GonkaV0Error(GonkaV0Code::kProposalNotFound, Cat("proposal_id ", msg.proposal_id()));
  }
  if (proposal->status() != gv0::TRAINSHARD_PROPOSAL_STATUS_OPEN) {
    return GonkaV0Error(GonkaV0Code::kProposalNotOpen,
                        Cat("proposal_id ", msg.proposal_id(), " is ",
                            gv0::TrainshardProposalStatus_Name(proposal->status())));
  }
  if (proposal->creator() != msg.creator()) {
    return GonkaV0Error(GonkaV0Code::kNotCreator,
                        Cat("creator ", msg.creator(), " is not ", proposal->creator()));
  }
  // Governance may have tightened the limits after the proposal passed.
  TS_RETURN_IF_ERROR(CheckStaticLimits(proposal->gpu_profile_id(), proposal->max_nodes(),
                                       proposal->max_duration_blocks()));
  TS_ASSIGN_OR_RETURN(uint64_t cooldown_until, LoadU64(*kv_, gv0_keys::Cooldown(msg.creator()), 0));
  if (height_ < static_cast<int64_t>(cooldown_until)) {
    return GonkaV0Error(GonkaV0Code::kCreatorCooldown,
                        Cat("creator ", msg.creator(), " until height ", cooldown_until));
  }
  TS_ASSIGN_OR_RETURN(ReservedCounts counts, CountReserved());
  if (counts.active_shards >= static_cast<int64_t>(params().max_active_shards())) {
    return GonkaV0Error(GonkaV0Code::kActiveLimit,
                        Cat("global active shards ", counts.active_shards, " >= max_active_shards ",
                            params().max_active_shards()));
  }
  const int64_t mine = counts.per_creator[msg.creator()];
  if (mine >= static_cast<int64_t>(params().max_active_shards_per_creator())) {
    return GonkaV0Error(GonkaV0Code::kActiveLimit,
                        Cat("creator active shards ", mine, " >= max_active_shards_per_creator ",
                            params().max_active_shards_per_creator()));
  }
  TS_ASSIGN_OR_RETURN(uint64_t last, ReadCounter(gv0_keys::kShardCounter));
  const uint64_t id = last + 1;
  TS_ASSIGN_OR_RETURN(auto nodes,
                      SelectNodes(id, proposal->gpu_profile_id(), proposal->max_nodes()));

  gv0::Trainshard shard;
  shard.set_trainshard_id(id);
  shard.set_creator(msg.creator());
  shard.set_gpu_profile_id(proposal->gpu_profile_id());
  shard.set_status(gv0::TRAINSHARD_STATUS_ACTIVE);
  shard.set_created_at_height(height_);
  shard.set_expires_at_height(height_ + proposal->max_duration_blocks());
  for (auto& node : nodes) *shard.add_nodes() = std::move(node);
  shard.set_proposal_id(proposal->id());
  shard.set_base_image(proposal->base_image());
  shard.set_run_key(proposal->run_key());
  for (const auto& node : shard.nodes()) {
    kv_->Set(gv0_keys::Reservation(node.participant(), node.node_id()), Be64(id));
  }
  PutShard(shard);
  kv_->Set(gv0_keys::Active(id), "");
  kv_->Set(gv0_keys::Expiry(shard.expires_at_height(), id), "");
  kv_->Set(gv0_keys::kShardCounter, Be64(id));
  proposal->set_status(gv0::TRAINSHARD_PROPOSAL_STATUS_CONSUMED);
  kv_->Set(gv0_keys::Proposal(proposal->id()), DeterministicBytes(*proposal));

  const std::string id_text = Cat(id);
  Emit("trainshard_assembled", {{"trainshard_id", id_text},
                                {"creator", msg.creator()},
                                {"gpu_profile_id", shard.gpu_profile_id()},
                                {"expires_at_height", Cat(shard.expires_at_height())},
                                {"base_image", shard.base_image()}});
  std::set<std::string> announced;  // one event per physical node, in selection order
  for (const auto& node : shard.nodes()) {
    if (!announced.insert(gv0_keys::Node(node.participant(), node.node_id())).second) continue;
    Emit("trainshard_node_reserved", {{"trainshard_id", id_text},
                                      {"participant", node.participant()},
                                      {"node_id", node.node_id()}});
  }
  gv0::MsgAssembleTrainshardResponse response;
  response.set_trainshard_id(id);
  return response;
}

// --- closing, settle and autokick

void GonkaV0Keeper::ReleaseNodes(gv0::Trainshard* shard, gv0::TrainshardNodeStatus status,
                                 std::string_view reason, std::string_view participant,
                                 std::string_view node_id) {
  const int64_t until = height_ + params().release_buffer_blocks();
  for (auto& node : *shard->mutable_nodes()) {
    if (!IsActive(node)) continue;
    if (!participant.empty() && (node.participant() != participant || node.node_id() != node_id)) {
      continue;
    }
    node.set_status(status);
    node.set_released_at_height(height_);
    node.set_release_reason(std::string(reason));
    node.set_reserved_until_height(until);
    // Setting the same index key for a node's second model entry is harmless.
    kv_->Set(gv0_keys::Release(until, node.participant(), node.node_id()), "");
  }
}

absl::Status GonkaV0Keeper::CloseShard(gv0::Trainshard* shard, gv0::TrainshardStatus status,
                                       gv0::TrainshardCloseReason reason) {
  ReleaseNodes(shard, gv0::TRAINSHARD_NODE_STATUS_RELEASED_ON_CLOSE,
               gv0::TrainshardCloseReason_Name(reason), /*participant=*/"", /*node_id=*/"");
  kv_->Delete(gv0_keys::Expiry(shard->expires_at_height(), shard->trainshard_id()));
  kv_->Delete(gv0_keys::Active(shard->trainshard_id()));
  shard->set_status(status);
  shard->set_close_reason(reason);
  shard->set_closed_at_height(height_);
  PutShard(*shard);
  kv_->Set(gv0_keys::Closed(height_, shard->trainshard_id()), "");
  // The cooldown only moves forward (a later close never shortens an earlier one).
  const std::string key = gv0_keys::Cooldown(shard->creator());
  const int64_t until = height_ + params().creator_cooldown_blocks();
  TS_ASSIGN_OR_RETURN(uint64_t existing, LoadU64(*kv_, key, 0));
  if (static_cast<int64_t>(existing) < until) kv_->Set(key, Be64(static_cast<uint64_t>(until)));
  return absl::OkStatus();
}

absl::Status GonkaV0Keeper::Settle(const gv0::MsgSettleTrainshard& msg) {
  TS_ASSIGN_OR_RETURN(std::optional<gv0::Trainshard> shard, LoadShard(msg.trainshard_id()));
  if (!shard.has_value()) {
    return GonkaV0Error(GonkaV0Code::kTrainshardNotFound,
                        Cat("trainshard_id ", msg.trainshard_id()));
  }
  if (shard->creator() != msg.creator()) {
    return GonkaV0Error(GonkaV0Code::kNotCreator,
                        Cat("creator ", msg.creator(), " is not ", shard->creator()));
  }
  if (shard->status() != gv0::TRAINSHARD_STATUS_ACTIVE) return absl::OkStatus();
  TS_RETURN_IF_ERROR(
      CloseShard(&*shard, gv0::TRAINSHARD_STATUS_SETTLED, gv0::TRAINSHARD_CLOSE_REASON_SETTLED));
  Emit("trainshard_settled", {{"trainshard_id", Cat(shard->trainshard_id())},
                              {"creator", shard->creator()},
                              {"closed_at_height", Cat(height_)}});
  return absl::OkStatus();
}

absl::Status GonkaV0Keeper::Autokick(const gv0::MsgAutokickTrainshardNode& msg) {
  // Gonka's ValidateBasic (SDK codes, so no "inference" number).
  TS_RETURN_IF_ERROR(common::ParseAddress("creator", msg.creator()).status());
  TS_RETURN_IF_ERROR(common::ParseAddress("participant", msg.participant()).status());
  if (msg.node_id().empty()) return Invalid("node_id", "is empty");
  if (msg.request_id().empty() || msg.request_id().size() > kGonkaMaxRequestIdBytes) {
    return Invalid("request_id", "length must be in (0, ", kGonkaMaxRequestIdBytes, "], got ",
                   msg.request_id().size());
  }
  if (msg.reason().size() > kGonkaMaxKickReasonBytes) {
    return Invalid("reason", "length must not exceed ", kGonkaMaxKickReasonBytes, ", got ",
                   msg.reason().size());
  }

  TS_ASSIGN_OR_RETURN(std::optional<gv0::Trainshard> shard, LoadShard(msg.trainshard_id()));
  if (!shard.has_value()) {
    return GonkaV0Error(GonkaV0Code::kTrainshardNotFound,
                        Cat("trainshard_id ", msg.trainshard_id()));
  }
  const bool allowed = msg.creator() == shard->creator() || msg.creator() == msg.participant() ||
                       (!shard->run_key().empty() && msg.creator() == shard->run_key());
  if (!allowed) {
    return GonkaV0Error(GonkaV0Code::kAutokickNotAllowed,
                        Cat("signer ", msg.creator(), " is neither the creator, the run key nor ",
                            msg.participant()));
  }
  const std::string request_key = gv0_keys::Autokick(msg.trainshard_id(), msg.request_id());
  const std::string node_key = gv0_keys::Node(msg.participant(), msg.node_id());
  if (const std::string* handled = kv_->Find(request_key); handled != nullptr) {
    if (*handled == node_key) return absl::OkStatus();  // a retry of the same kick
    return absl::AlreadyExistsError(Cat("inference: autokick request reused: request_id \"",
                                        msg.request_id(), "\" of trainshard ", msg.trainshard_id(),
                                        " already kicked another node"));
  }
  if (shard->status() != gv0::TRAINSHARD_STATUS_ACTIVE) {
    return GonkaV0Error(GonkaV0Code::kTrainshardNotActive,
                        Cat("trainshard_id ", msg.trainshard_id(), " is ",
                            gv0::TrainshardStatus_Name(shard->status())));
  }
  if (!HasActiveNode(*shard, msg.participant(), msg.node_id())) {
    return GonkaV0Error(GonkaV0Code::kNodeNotActive,
                        Cat("node ", msg.node_id(), " of ", msg.participant()));
  }
  ReleaseNodes(&*shard, gv0::TRAINSHARD_NODE_STATUS_AUTOKICKED, msg.reason(), msg.participant(),
               msg.node_id());
  kv_->Set(request_key, node_key);
  if (HasAnyActiveNode(*shard)) {
    PutShard(*shard);
  } else {
    TS_RETURN_IF_ERROR(CloseShard(&*shard, gv0::TRAINSHARD_STATUS_EXPIRED,
                                  gv0::TRAINSHARD_CLOSE_REASON_NO_ACTIVE_NODES));
  }
  const std::string id_text = Cat(msg.trainshard_id());
  Emit("trainshard_node_autokicked", {{"trainshard_id", id_text},
                                      {"participant", msg.participant()},
                                      {"node_id", msg.node_id()},
                                      {"reason", msg.reason()},
                                      {"height", Cat(height_)}});
  if (shard->status() != gv0::TRAINSHARD_STATUS_ACTIVE) {
    Emit("trainshard_expired",
         {{"trainshard_id", id_text},
          {"creator", shard->creator()},
          {"close_reason", gv0::TrainshardCloseReason_Name(shard->close_reason())},
          {"closed_at_height", Cat(shard->closed_at_height())}});
  }
  return absl::OkStatus();
}

// --- opt-in

bool GonkaV0Keeper::OwnsNode(std::string_view participant, std::string_view node_id) const {
  return std::any_of(env_.ml_nodes.begin(), env_.ml_nodes.end(), [&](const GonkaMlNode& n) {
    return n.participant == participant && n.node_id == node_id;
  });
}

absl::StatusOr<bool> GonkaV0Keeper::NodeActivelyReserved(std::string_view participant,
                                                         std::string_view node_id) const {
  TS_ASSIGN_OR_RETURN(std::optional<uint64_t> shard_id, ReservationOf(participant, node_id));
  if (!shard_id.has_value()) return false;
  TS_ASSIGN_OR_RETURN(std::optional<gv0::Trainshard> shard, LoadShard(*shard_id));
  return shard.has_value() && HasActiveNode(*shard, participant, node_id);
}

absl::Status GonkaV0Keeper::SetOptIn(const gv0::MsgSetTrainingNodeOptIn& msg) {
  TS_RETURN_IF_ERROR(common::ParseAddress("creator", msg.creator()).status());
  if (msg.node_id().empty()) return GonkaV0Error(GonkaV0Code::kOptInRequest, "node_id is empty");
  if (msg.opt_in()) {
    if (!OwnsNode(msg.creator(), msg.node_id())) {
      return GonkaV0Error(GonkaV0Code::kNodeNotOwned,
                          Cat("node ", msg.node_id(), " not owned by ", msg.creator()));
    }
    const int64_t expires_at = height_ + params().opt_in_ttl_blocks();
    kv_->Set(gv0_keys::OptIn(msg.creator(), msg.node_id()),
             Be64(static_cast<uint64_t>(expires_at)));
    return absl::OkStatus();
  }
  TS_ASSIGN_OR_RETURN(bool reserved, NodeActivelyReserved(msg.creator(), msg.node_id()));
  if (reserved) {
    return GonkaV0Error(GonkaV0Code::kNodeReserved,
                        Cat("node ", msg.node_id(), " of ", msg.creator()));
  }
  kv_->Delete(gv0_keys::OptIn(msg.creator(), msg.node_id()));
  return absl::OkStatus();
}

absl::StatusOr<gv0::MsgRefreshTrainingNodeOptInResponse> GonkaV0Keeper::RefreshOptIn(
    const gv0::MsgRefreshTrainingNodeOptIn& msg) {
  TS_RETURN_IF_ERROR(common::ParseAddress("creator", msg.creator()).status());
  const size_t count = static_cast<size_t>(msg.node_ids_size());
  if (count == 0 || count > kGonkaMaxRefreshNodes) {
    return GonkaV0Error(GonkaV0Code::kOptInRequest,
                        Cat("node_ids count ", count, " not in (0, ", kGonkaMaxRefreshNodes, "]"));
  }
  std::set<std::string_view> seen;
  for (const std::string& node_id : msg.node_ids()) {
    if (node_id.empty()) return GonkaV0Error(GonkaV0Code::kOptInRequest, "node_id is empty");
    if (!seen.insert(node_id).second) {
      return GonkaV0Error(GonkaV0Code::kOptInRequest, Cat("duplicate node_id ", node_id));
    }
  }
  const bool has_nodes =
      std::any_of(env_.ml_nodes.begin(), env_.ml_nodes.end(),
                  [&](const GonkaMlNode& n) { return n.participant == msg.creator(); });
  if (!has_nodes) {
    return GonkaV0Error(GonkaV0Code::kNodeNotOwned, Cat("no ML nodes for ", msg.creator()));
  }
  if (!msg.endpoint().empty()) TS_RETURN_IF_ERROR(ValidateTrainingEndpoint(msg.endpoint()));
  // Every node is checked before anything is written, so a refusal leaves no partial refresh.
  for (const std::string& node_id : msg.node_ids()) {
    if (!OwnsNode(msg.creator(), node_id)) {
      return GonkaV0Error(GonkaV0Code::kNodeNotOwned,
                          Cat("node ", node_id, " not owned by ", msg.creator()));
    }
  }
  const int64_t expires_at = height_ + params().opt_in_ttl_blocks();
  for (const std::string& node_id : msg.node_ids()) {
    kv_->Set(gv0_keys::OptIn(msg.creator(), node_id), Be64(static_cast<uint64_t>(expires_at)));
    if (msg.endpoint().empty()) {
      kv_->Delete(gv0_keys::Endpoint(msg.creator(), node_id));
    } else {
      kv_->Set(gv0_keys::Endpoint(msg.creator(), node_id), msg.endpoint());
    }
  }
  gv0::MsgRefreshTrainingNodeOptInResponse response;
  response.set_expires_at_height(expires_at);
  return response;
}

// --- EndBlock

absl::Status GonkaV0Keeper::EndBlock() {
  TS_RETURN_IF_ERROR(ExpireShards());
  TS_RETURN_IF_ERROR(ReleaseReturned());
  return PruneClosed();
}

absl::Status GonkaV0Keeper::ExpireShards() {
  const size_t limit = params().max_expirations_per_block();
  const std::string_view prefix = gv0_keys::kExpiryPrefix;
  for (const auto& [key, value] : kv_->Scan(prefix, "", limit)) {
    std::string_view rest = std::string_view(key).substr(prefix.size());
    if (rest.size() != 16) return absl::DataLossError(Cat("bad expiry key ", key.size()));
    TS_ASSIGN_OR_RETURN(uint64_t at, ReadBe64(key, rest.substr(0, 8)));
    if (static_cast<int64_t>(at) > height_) break;  // keys are in height order
    TS_ASSIGN_OR_RETURN(uint64_t id, ReadBe64(key, rest.substr(8)));
    TS_ASSIGN_OR_RETURN(std::optional<gv0::Trainshard> shard, LoadShard(id));
    kv_->Delete(key);  // a stale key is dropped so it cannot take the quota again
    if (!shard.has_value() || shard->status() != gv0::TRAINSHARD_STATUS_ACTIVE) continue;
    TS_RETURN_IF_ERROR(
        CloseShard(&*shard, gv0::TRAINSHARD_STATUS_EXPIRED, gv0::TRAINSHARD_CLOSE_REASON_TIMEOUT));
    Emit("trainshard_expired", {{"trainshard_id", Cat(id)},
                                {"creator", shard->creator()},
                                {"closed_at_height", Cat(height_)}});
  }
  return absl::OkStatus();
}

absl::Status GonkaV0Keeper::ReleaseReturned() {
  const size_t limit = params().max_expirations_per_block();
  const std::string_view prefix = gv0_keys::kReleasePrefix;
  for (const auto& [key, value] : kv_->Scan(prefix, "", limit)) {
    std::string_view rest = std::string_view(key).substr(prefix.size());
    if (rest.size() < 8) return absl::DataLossError(Cat("short release key of ", key.size()));
    TS_ASSIGN_OR_RETURN(uint64_t until, ReadBe64(key, rest.substr(0, 8)));
    if (static_cast<int64_t>(until) > height_) break;
    kv_->Delete(Cat(gv0_keys::kReservationPrefix, rest.substr(8)));
    kv_->Delete(key);
  }
  return absl::OkStatus();
}

absl::Status GonkaV0Keeper::PruneClosed() {
  const size_t limit = params().max_expirations_per_block();
  const std::string_view prefix = gv0_keys::kClosedPrefix;
  for (const auto& [key, value] : kv_->Scan(prefix, "", limit)) {
    std::string_view rest = std::string_view(key).substr(prefix.size());
    if (rest.size() != 16) return absl::DataLossError(Cat("bad closed key ", key.size()));
    TS_ASSIGN_OR_RETURN(uint64_t closed_at, ReadBe64(key, rest.substr(0, 8)));
    if (static_cast<int64_t>(closed_at) + params().settled_shard_retention_blocks() > height_) {
      break;
    }
    TS_ASSIGN_OR_RETURN(uint64_t id, ReadBe64(key, rest.substr(8)));
    kv_->Delete(gv0_keys::Shard(id));
    for (const auto& [request, node] : kv_->Scan(Cat(gv0_keys::kAutokickPrefix, Be64(id)))) {
      kv_->Delete(request);
    }
    kv_->Delete(key);
  }
  return absl::OkStatus();
}

// --- queries and state helpers

absl::StatusOr<gv0::QueryGetTrainshardResponse> GonkaV0Keeper::GetTrainshard(uint64_t id) const {
  TS_ASSIGN_OR_RETURN(std::optional<gv0::Trainshard> shard, LoadShard(id));
  gv0::QueryGetTrainshardResponse response;
  response.set_found(shard.has_value());
  if (shard.has_value()) *response.mutable_trainshard() = std::move(*shard);
  return response;
}

absl::StatusOr<gv0::QueryActiveTrainshardsResponse> GonkaV0Keeper::ActiveTrainshards() const {
  gv0::QueryActiveTrainshardsResponse response;
  for (const auto& [key, value] : kv_->Scan(gv0_keys::kActivePrefix)) {
    TS_ASSIGN_OR_RETURN(
        uint64_t id, ReadBe64(key, std::string_view(key).substr(gv0_keys::kActivePrefix.size())));
    TS_ASSIGN_OR_RETURN(std::optional<gv0::Trainshard> shard, LoadShard(id));
    if (!shard.has_value()) {
      return absl::DataLossError(Cat("active trainshard ", id, " has no record"));
    }
    *response.add_trainshards() = std::move(*shard);
  }
  return response;
}

absl::StatusOr<gv0::QueryGetTrainshardProposalResponse> GonkaV0Keeper::GetProposal(
    uint64_t id) const {
  TS_ASSIGN_OR_RETURN(std::optional<gv0::TrainshardProposal> proposal,
                      Load<gv0::TrainshardProposal>(*kv_, gv0_keys::Proposal(id)));
  gv0::QueryGetTrainshardProposalResponse response;
  response.set_found(proposal.has_value());
  if (proposal.has_value()) *response.mutable_proposal() = std::move(*proposal);
  return response;
}

std::string GonkaV0Keeper::Endpoint(std::string_view participant, std::string_view node_id) const {
  return kv_->Get(gv0_keys::Endpoint(participant, node_id)).value_or("");
}

absl::StatusOr<std::optional<int64_t>> GonkaV0Keeper::OptInExpiry(std::string_view participant,
                                                                  std::string_view node_id) const {
  const std::string key = gv0_keys::OptIn(participant, node_id);
  const std::string* bytes = kv_->Find(key);
  if (bytes == nullptr) return std::optional<int64_t>();
  TS_ASSIGN_OR_RETURN(uint64_t expiry, ReadBe64(key, *bytes));
  return std::optional<int64_t>(static_cast<int64_t>(expiry));
}

absl::StatusOr<std::optional<uint64_t>> GonkaV0Keeper::ReservationOf(
    std::string_view participant, std::string_view node_id) const {
  const std::string key = gv0_keys::Reservation(participant, node_id);
  const std::string* bytes = kv_->Find(key);
  if (bytes == nullptr) return std::optional<uint64_t>();
  TS_ASSIGN_OR_RETURN(uint64_t id, ReadBe64(key, *bytes));
  return std::optional<uint64_t>(id);
}

absl::StatusOr<std::optional<gv0::Trainshard>> GonkaV0Keeper::LoadShard(uint64_t id) const {
  return Load<gv0::Trainshard>(*kv_, gv0_keys::Shard(id));
}

void GonkaV0Keeper::PutShard(const gv0::Trainshard& shard) {
  kv_->Set(gv0_keys::Shard(shard.trainshard_id()), DeterministicBytes(shard));
}

absl::StatusOr<uint64_t> GonkaV0Keeper::ReadCounter(std::string_view key) const {
  return LoadU64(*kv_, key, 0);
}

void GonkaV0Keeper::Emit(
    std::string_view type,
    std::initializer_list<std::pair<std::string_view, std::string_view>> attributes) {
  AppendEvent(events_, type, attributes);
}

}  // namespace ts::bridge
