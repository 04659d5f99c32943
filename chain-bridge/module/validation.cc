#include "chain-bridge/module/validation.h"

#include <algorithm>

#include "chain-bridge/module/str_cat.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/protocol.h"
#include "common/status.h"

namespace ts::bridge {
namespace {

namespace pb = ::gonka::trainshard::v1;

absl::Status Invalid(std::string_view field, const auto&... parts) {
  return absl::InvalidArgumentError(Cat(field, ": ", parts...));
}

}  // namespace

absl::Status ValidateAddress(std::string_view field, std::string_view address) {
  TS_ASSIGN_OR_RETURN(std::string id, common::ParseAddress(field, address));
  if (common::AddressFromBytes(id) != address) {
    return Invalid(field, "'", address.substr(0, 128), "' is not in canonical lower-case form");
  }
  return absl::OkStatus();
}

absl::Status ValidateParams(const pb::Params& p) {
  constexpr uint64_t kBlocksMax = uint64_t{1} << 40;
  if (p.epoch_length_blocks() == 0 || p.epoch_length_blocks() > kBlocksMax) {
    return Invalid("params.epoch_length_blocks", p.epoch_length_blocks(), " is outside 1..",
                   kBlocksMax);
  }
  if (p.voting_period_blocks() == 0 || p.voting_period_blocks() > kBlocksMax) {
    return Invalid("params.voting_period_blocks", p.voting_period_blocks(), " is outside 1..",
                   kBlocksMax);
  }
  TS_RETURN_IF_ERROR(common::ParseAmount("params.min_deposit", p.min_deposit()).status());
  if (p.quorum_ppm() > 1'000'000) {
    return Invalid("params.quorum_ppm", p.quorum_ppm(), " exceeds 1000000");
  }
  if (p.threshold_ppm() == 0 || p.threshold_ppm() > 1'000'000) {
    return Invalid("params.threshold_ppm", p.threshold_ppm(), " is outside 1..1000000");
  }
  if (p.veto_threshold_ppm() == 0 || p.veto_threshold_ppm() > 1'000'000) {
    return Invalid("params.veto_threshold_ppm", p.veto_threshold_ppm(), " is outside 1..1000000");
  }
  TS_RETURN_IF_ERROR(ValidateAddress("params.poc_authority", p.poc_authority()));
  if (p.max_nodes_limit() == 0 || p.max_nodes_limit() > kMaxNodesLimitCap) {
    return Invalid("params.max_nodes_limit", p.max_nodes_limit(), " is outside 1..",
                   kMaxNodesLimitCap);
  }
  if (p.max_weights_per_submission() == 0 ||
      p.max_weights_per_submission() > kMaxWeightsPerSubmissionCap) {
    return Invalid("params.max_weights_per_submission", p.max_weights_per_submission(),
                   " is outside 1..", kMaxWeightsPerSubmissionCap);
  }
  if (p.max_duration_blocks_limit() == 0 || p.max_duration_blocks_limit() > kBlocksMax) {
    return Invalid("params.max_duration_blocks_limit", p.max_duration_blocks_limit(),
                   " is outside 1..", kBlocksMax);
  }
  return absl::OkStatus();
}

absl::Status ValidateSpec(const pb::ShardSpec& spec, const pb::Params& params) {
  if (spec.run_spec_hash().size() != common::kSha256Size) {
    return Invalid("spec.run_spec_hash", spec.run_spec_hash().size(), " bytes, want ",
                   common::kSha256Size);
  }
  const std::string& profile = spec.hardware_profile();
  bool profile_ok = !profile.empty() && profile.size() <= kMaxHardwareProfileBytes;
  for (char c : profile) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) profile_ok = false;
  }
  if (!profile_ok) {
    return Invalid("spec.hardware_profile", "'", profile.substr(0, 80),
                   "' does not match [a-z0-9-]{1,64}");
  }
  if (spec.min_nodes() < 1) return Invalid("spec.min_nodes", spec.min_nodes(), " is below 1");
  if (spec.max_nodes() < spec.min_nodes()) {
    return Invalid("spec.max_nodes", spec.max_nodes(), " is below min_nodes ", spec.min_nodes());
  }
  if (spec.max_nodes() > params.max_nodes_limit()) {
    return Invalid("spec.max_nodes", spec.max_nodes(), " exceeds max_nodes_limit ",
                   params.max_nodes_limit());
  }
  if (spec.max_duration_blocks() < 1 ||
      spec.max_duration_blocks() > params.max_duration_blocks_limit()) {
    return Invalid("spec.max_duration_blocks", spec.max_duration_blocks(), " is outside 1..",
                   params.max_duration_blocks_limit());
  }
  if (spec.reservation_window_blocks() < 1 ||
      spec.reservation_window_blocks() > spec.max_duration_blocks()) {
    return Invalid("spec.reservation_window_blocks", spec.reservation_window_blocks(),
                   " is outside 1..max_duration_blocks ", spec.max_duration_blocks());
  }
  if (!spec.has_escrow()) return Invalid("spec.escrow", "missing");
  if (spec.escrow().denom() != common::kDenom) {
    return Invalid("spec.escrow.denom", "'", spec.escrow().denom().substr(0, 64), "' is not ",
                   common::kDenom);
  }
  TS_ASSIGN_OR_RETURN(uint64_t escrow,
                      common::ParseAmount("spec.escrow.amount", spec.escrow().amount()));
  if (escrow == 0) return Invalid("spec.escrow.amount", "0 must be positive");
  if (spec.artifact_quota().bytes_max() == 0) {
    return Invalid("spec.artifact_quota.bytes_max", "0 must be positive");
  }
  if (spec.artifact_quota().files_max() == 0) {
    return Invalid("spec.artifact_quota.files_max", "0 must be positive");
  }
  if (spec.run_spec().size() > kRunSpecBytesMax) {
    return Invalid("spec.run_spec", spec.run_spec().size(), " bytes is more than ",
                   kRunSpecBytesMax);
  }
  if (!spec.run_spec().empty() && common::Sha256(spec.run_spec()) != spec.run_spec_hash()) {
    return Invalid("spec.run_spec", "its SHA-256 is not spec.run_spec_hash");
  }
  if (spec.readers_size() > static_cast<int>(kReadersMax)) {
    return Invalid("spec.readers", spec.readers_size(), " addresses is more than ", kReadersMax);
  }
  for (int i = 0; i < spec.readers_size(); ++i) {
    const std::string field = Cat("spec.readers[", i, "]");
    TS_RETURN_IF_ERROR(common::ParseAddress(field, spec.readers(i)).status());
    for (int j = 0; j < i; ++j) {
      if (spec.readers(j) == spec.readers(i)) {
        return Invalid(field, spec.readers(i), " is named twice");
      }
    }
  }
  const auto& policy = spec.reward_policy();
  if (policy.kind() != pb::RewardPolicy::KIND_VERIFIED_WORK &&
      policy.kind() != pb::RewardPolicy::KIND_EQUAL_SHARE) {
    return Invalid("spec.reward_policy.kind", static_cast<int>(policy.kind()),
                   " is not a specified kind");
  }
  if (policy.max_host_share_bps() < 1 || policy.max_host_share_bps() > 10'000) {
    return Invalid("spec.reward_policy.max_host_share_bps", policy.max_host_share_bps(),
                   " is outside 1..10000");
  }
  if (uint64_t{policy.max_host_share_bps()} * spec.max_nodes() < 10'000) {
    return Invalid("spec.reward_policy.max_host_share_bps", policy.max_host_share_bps(),
                   " times max_nodes ", spec.max_nodes(),
                   " is below 10000: the escrow could never be paid out in full");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseCoins(
    std::string_view field,
    const google::protobuf::RepeatedPtrField<cosmos::base::v1beta1::Coin>& coins, bool positive) {
  if (coins.size() > 1) return Invalid(field, coins.size(), " coins, want at most 1 (ngonka)");
  uint64_t total = 0;
  if (coins.size() == 1) {
    const auto& coin = coins.Get(0);
    std::string coin_field = Cat(field, "[0]");
    if (coin.denom() != common::kDenom) {
      return Invalid(Cat(coin_field, ".denom"), "'", coin.denom().substr(0, 64), "' is not ",
                     common::kDenom);
    }
    TS_ASSIGN_OR_RETURN(total, common::ParseAmount(Cat(coin_field, ".amount"), coin.amount()));
  }
  if (positive && total == 0) return Invalid(field, "amount 0 must be positive");
  return total;
}

absl::Status ValidateEndpoint(std::string_view field, std::string_view endpoint) {
  if (endpoint.empty()) return Invalid(field, "empty");
  if (endpoint.size() > kMaxEndpointBytes) {
    return Invalid(field, endpoint.size(), " bytes exceeds ", kMaxEndpointBytes);
  }
  for (char c : endpoint) {
    if (c < 0x21 || c > 0x7e) {
      return Invalid(field, "'", endpoint, "' holds a character outside printable ASCII");
    }
  }
  size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return Invalid(field, "'", endpoint, "' is not host:port");
  }
  std::string_view port = endpoint.substr(colon + 1);
  uint32_t value = 0;
  bool port_ok = !port.empty() && port.size() <= 5 && port[0] != '0';
  for (char c : port) {
    if (c < '0' || c > '9') port_ok = false;
    if (port_ok) value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (!port_ok || value < 1 || value > 65535) {
    return Invalid(field, "'", endpoint, "' has no port in 1..65535");
  }
  return absl::OkStatus();
}

std::vector<uint64_t> PayoutsFromStats(
    uint64_t escrow, const pb::RewardPolicy& policy,
    const google::protobuf::RepeatedPtrField<pb::HostPayout>& payouts) {
  std::vector<protocol::HostWork> works;
  unsigned __int128 all_units = 0;
  uint64_t workers = 0;
  // Tokens when the run had contributions: some host has tokens, or its contributions were
  // left out for their scores (then none may be paid by its rounds instead).
  const bool by_tokens = std::any_of(payouts.begin(), payouts.end(), [](const auto& p) {
    return p.tokens() > 0 || p.unhelpful() > 0;
  });
  for (const pb::HostPayout& p : payouts) {
    works.push_back({.units = protocol::WorkUnits(p.tokens(), p.rounds_contributed(), by_tokens),
                     .forfeit = p.marks() > 0 || p.rejected() > 0});
    all_units += works.back().units;
    workers += works.back().units > 0 ? 1 : 0;
  }
  std::vector<uint64_t> amounts;
  for (const protocol::HostWork& work : works) {
    amounts.push_back(protocol::PayoutOf(escrow,
                                         policy.kind() == pb::RewardPolicy::KIND_EQUAL_SHARE,
                                         policy.max_host_share_bps(), work, all_units, workers));
  }
  return amounts;
}

}  // namespace ts::bridge
