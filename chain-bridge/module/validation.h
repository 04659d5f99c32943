// Stateless validation rules of the trainshard chain module, shared by the chain itself and by
// the tools that build its messages (so a malformed spec is refused before it is proposed).
// Every error is INVALID_ARGUMENT and names the field and the bad value. Pure functions;
// thread-safe.
#ifndef TS_CHAIN_BRIDGE_MODULE_VALIDATION_H_
#define TS_CHAIN_BRIDGE_MODULE_VALIDATION_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cosmos/base/v1beta1/coin.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "google/protobuf/repeated_field.h"

namespace ts::bridge {

// Hard bounds on parameters, whatever the genesis says: they keep one message's work bounded.
inline constexpr uint32_t kMaxNodesLimitCap = 10'000;
inline constexpr uint32_t kMaxWeightsPerSubmissionCap = 100'000;
inline constexpr size_t kMaxEndpointBytes = 256;
inline constexpr size_t kMaxHardwareProfileBytes = 64;
inline constexpr size_t kMaxMemoBytes = 256;
inline constexpr size_t kMaxProposalTitleBytes = 256;
inline constexpr size_t kMaxProposalSummaryBytes = 10'000;
inline constexpr size_t kMaxMetadataBytes = 255;
inline constexpr int kMaxProposalMessages = 4;
// A shard spec's run spec document, and the readers it may name (docs/chain-module.md).
inline constexpr size_t kRunSpecBytesMax = 64 << 10;
inline constexpr size_t kReadersMax = 16;

// A bech32 "gonka" account address with a 20-byte payload, in its canonical lower-case form
// (an upper-case spelling of the same account is refused so that one account has one key).
absl::Status ValidateAddress(std::string_view field, std::string_view address);

// Chain parameters as InitChain accepts them.
absl::Status ValidateParams(const gonka::trainshard::v1::Params& params);

// A shard spec against the chain's parameters (limits on nodes and duration).
absl::Status ValidateSpec(const gonka::trainshard::v1::ShardSpec& spec,
                          const gonka::trainshard::v1::Params& params);

// The ngonka amount of a coin list: at most one coin, denom "ngonka", a valid amount. Empty
// lists are 0; `positive` refuses a total of 0.
absl::StatusOr<uint64_t> ParseCoins(
    std::string_view field,
    const google::protobuf::RepeatedPtrField<cosmos::base::v1beta1::Coin>& coins, bool positive);

// "host:port": printable ASCII without spaces, at most kMaxEndpointBytes, a non-empty host and
// a port in 1..65535.
absl::Status ValidateEndpoint(std::string_view field, std::string_view endpoint);

// The amount each payout's stats imply under `policy` (common/protocol.h PayoutOf; work units
// are the payouts' tokens, or their rounds when none has tokens nor an unhelpful contribution;
// a mark or a rejected round forfeits): what the chain holds a settlement's amounts to and what
// every draft pays (docs/verification.md "Pay").
std::vector<uint64_t> PayoutsFromStats(
    uint64_t escrow, const gonka::trainshard::v1::RewardPolicy& policy,
    const google::protobuf::RepeatedPtrField<gonka::trainshard::v1::HostPayout>& payouts);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_VALIDATION_H_
