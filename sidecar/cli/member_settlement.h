// The settlement of a shard whose chain records none (the gonka-v0 profile, docs/gonka-v0.md):
// read from the members themselves. Each member serves the settlement it signed on its shard
// endpoint (SettlementQuery, beside the artifact transfer); the one taken is the settlement
// signed by members holding more than 2/3 of the shard's frozen weight — the rule the module's
// chain applies before it records one. A member's answer counts only when its signature
// recovers to that member over that chain and shard, so a member (or anything at its endpoint)
// cannot speak for another.
//
// Thread-safety: a free function; asks up to 16 members at once, each on a thread of its own
// for the call, so a silent member costs one timeout, not one per member after it.
#ifndef TS_SIDECAR_CLI_MEMBER_SETTLEMENT_H_
#define TS_SIDECAR_CLI_MEMBER_SETTLEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/chain.pb.h"

namespace ts::sidecar {

struct SettlementMember {
  std::string address;
  std::string endpoint;         // host:port of its shard services
  std::string tls_cert_sha256;  // the pin of its certificate; empty: plaintext
  uint64_t weight = 0;          // its frozen weight
};

// FAILED_PRECONDITION when no settlement has more than 2/3 of the weight, naming what each
// member answered; INVALID_ARGUMENT for no members or a total weight of 0. Each call has
// `timeout_ms`; a member's answer is at most 4 MiB.
absl::StatusOr<gonka::trainshard::v1::Settlement> SettlementFromMembers(
    const std::vector<SettlementMember>& members, const std::string& chain_id, uint64_t shard_id,
    int64_t timeout_ms);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_MEMBER_SETTLEMENT_H_
