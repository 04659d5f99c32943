// The round ledger's rules, as pure functions (docs/training.md "Rounds" and "Certificates"):
// who plans a round, the round's data seed, signing and checking plans, round results and
// evaluations, checking certificates (distinct members with more than 2/3 of the shard's frozen
// weight signing the same result), the median of evaluations, and the settlement draft a
// shard's certificates imply under its reward policy. Every host computes these from the same
// inputs and gets the same bytes, so no host has to be trusted to compute them for the others.
//
// Thread-safety: pure functions.
#ifndef TS_SIDECAR_SHARD_LEDGER_H_
#define TS_SIDECAR_SHARD_LEDGER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "common/protocol.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/peer/shard_directory.h"

namespace ts::sidecar {

inline constexpr std::string_view kPlanSignKind = protocol::kSignRoundPlan;
inline constexpr std::string_view kRoundSignKind = protocol::kSignRound;
inline constexpr std::string_view kEvaluationSignKind = protocol::kSignEvaluation;

// Members sorted by SHA-256("gonka-trainshard/v1/planner" || u64 seed || u64 round || address)
// (integers big-endian), ties by address: the first plans the round, the next takes over when
// it does not answer.
std::vector<std::string> PlannerOrder(uint64_t seed, uint64_t round,
                                      std::span<const ShardMember> members);

// SHA-256("gonka-trainshard/v1/data_seed" || u64 seed || u64 round || base_root): fixed once the
// base checkpoint is certified, and chosen by no host.
std::string DataSeedOf(uint64_t seed, uint64_t round, std::string_view base_root);

// SHA-256("gonka-trainshard/v1/assignment" || u64 len || run_spec_hash || u64 len ||
// data_seed || u64 round || u64 len || host): names the data a member of a round is to train
// on, which AssignBatches (worker/data_shard.h) draws from exactly these inputs and the run's
// data (pinned by the spec).
std::string AssignmentIdOf(std::string_view run_spec_hash, std::string_view data_seed,
                           uint64_t round, std::string_view host);
// A round result's contributions, when it has them: one per member in plan order, naming that
// member, with 32-byte commitment and assignment. INVALID_ARGUMENT naming the field otherwise.
absl::Status CheckContributions(const ::gonka::trainshard::v1::RoundResult& result);
// Who replays whom after a round is certified (docs/verification.md "Replay"): drawn from
// SHA-256("gonka-trainshard/v1/replay" || new_root || u64 round), which no member knew while it
// trained. Member i of the result's contributions is checked when the first 8 bytes (big-endian)
// of SHA-256(seed || "check" || u64 i) modulo 10000 fall below `rate_bps`; its validator is
// member (i + 1 + v mod (n − 1)) mod n, v from SHA-256(seed || "validator" || u64 i) — never i.
struct ReplayDraw {
  size_t member = 0;     // index in the result's contributions
  size_t validator = 0;  // index in the result's members
};
std::vector<ReplayDraw> DrawReplays(const ::gonka::trainshard::v1::RoundResult& result,
                                    uint32_t rate_bps);
// The same with a rate per contribution (a marked member's is higher); none when the rates do
// not match the contributions.
std::vector<ReplayDraw> DrawReplays(const ::gonka::trainshard::v1::RoundResult& result,
                                    std::span<const uint32_t> rates_bps);
// Strictly more than 2/3: 3·signed > 2·total.
bool HasQuorum(uint64_t signed_weight, uint64_t total_weight);

// Signs `plan` (its signature field cleared first) as `key`.
absl::Status SignPlan(const common::PrivateKey& key, std::string_view chain_id,
                      ::gonka::trainshard::v1::RoundPlan* plan);
// The plan's signature recovers to its planner; the planner and every member are members of
// `shard` (no duplicates, at least 2, endpoints not empty). Errors name the field.
absl::Status VerifyPlan(std::string_view chain_id, const ::gonka::trainshard::v1::RoundPlan& plan,
                        const ShardView& shard);

absl::StatusOr<std::string> SignRoundResult(const common::PrivateKey& key,
                                            std::string_view chain_id,
                                            const ::gonka::trainshard::v1::RoundResult& result);
absl::StatusOr<std::string> SignEvaluation(const common::PrivateKey& key, std::string_view chain_id,
                                           const ::gonka::trainshard::v1::EvaluationResult& e);

// Checks a certificate received from anyone: each signature recovers to its host, who is a
// member of the round and of the shard, at most once each; the weight of the signers (from
// `shard`, not from the certificate) is more than 2/3 of the shard's total weight; every
// evaluation is signed by its host, a signer of the round, about new_root; the median is the
// median of those evaluations. The certificate's signed_weight and total_weight must equal the
// recomputed ones.
absl::Status VerifyCertificate(std::string_view chain_id,
                               const ::gonka::trainshard::v1::RoundCertificate& certificate,
                               const ShardView& shard);

// The lower median (element (n−1)/2 of the sorted values); 0 for none.
int64_t MedianOf(std::vector<int64_t> values);

// Total frozen weight of the shard's members.
uint64_t TotalWeight(const ShardView& shard);

// The settlement the certificates of rounds 1..c of `shard` imply, c = certificates.size() of
// the rounds_planned the run spec asks for (c < rounds_planned: the run reached its deadline
// first and settles what it certified): final_checkpoint_root and evaluation from the last
// certificate; per host that signed a round its stats — rounds_contributed (certificates it
// signed), tokens (behind its contributions in the rounds the checks reach, verdicts.h
// PaidRounds), verified and rejected rounds and marks (the
// verdicts' tally, verdicts.h) — and its payout, protocol::PayoutOf its work under the reward
// policy (a marked host forfeits) out of protocol::PayableOf the escrow; sorted by host; the rest
// refunded. INVALID_ARGUMENT when the certificates are not rounds 1..c in order with
// 1 <= c <= rounds_planned, or the policy is bad.
absl::StatusOr<::gonka::trainshard::v1::Settlement> DraftSettlement(
    std::string_view chain_id, const ShardView& shard, uint64_t escrow,
    const ::gonka::trainshard::v1::RewardPolicy& policy,
    const ::gonka::trainshard::v1::VerificationSpec& verification,
    std::span<const ::gonka::trainshard::v1::RoundCertificate> certificates,
    uint64_t rounds_planned);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_LEDGER_H_
