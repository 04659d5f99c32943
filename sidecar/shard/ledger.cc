#include "sidecar/shard/ledger.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "chain-bridge/module/validation.h"
#include "common/amount.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/protocol.h"
#include "common/status.h"
#include "proto/deterministic.h"
#include "sidecar/shard/scoring.h"
#include "sidecar/shard/verdicts.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

constexpr uint64_t kBps = 10'000;

void AppendU64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

absl::Status CheckSigner(std::string_view kind, std::string_view chain_id, uint64_t shard_id,
                         std::string_view bytes, std::string_view signature, absl::string_view want,
                         absl::string_view field) {
  auto signer = common::RecoverStatementSigner(kind, chain_id, shard_id, bytes, signature);
  if (!signer.ok()) {
    return absl::UnauthenticatedError(absl::StrCat(field, ": ", signer.status().message()));
  }
  if (*signer != want) {
    return absl::UnauthenticatedError(
        absl::StrCat(field, ": signed by ", *signer, ", not by ", want));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> PlannerOrder(uint64_t seed, uint64_t round,
                                      std::span<const ShardMember> members) {
  std::vector<std::pair<std::string, std::string>> keyed;
  keyed.reserve(members.size());
  for (const ShardMember& m : members) {
    std::string pre = "gonka-trainshard/v1/planner";
    AppendU64(&pre, seed);
    AppendU64(&pre, round);
    pre += m.address;
    keyed.emplace_back(common::Sha256(pre), m.address);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::string> order;
  order.reserve(keyed.size());
  for (auto& [key, address] : keyed) order.push_back(std::move(address));
  return order;
}

std::string DataSeedOf(uint64_t seed, uint64_t round, std::string_view base_root) {
  std::string pre = "gonka-trainshard/v1/data_seed";
  AppendU64(&pre, seed);
  AppendU64(&pre, round);
  pre.append(base_root);
  return common::Sha256(pre);
}

std::string AssignmentIdOf(std::string_view run_spec_hash, std::string_view data_seed,
                           uint64_t round, std::string_view host) {
  std::string pre = "gonka-trainshard/v1/assignment";
  for (std::string_view part : {run_spec_hash, data_seed}) {
    AppendU64(&pre, part.size());
    pre.append(part);
  }
  AppendU64(&pre, round);
  AppendU64(&pre, host.size());
  pre.append(host);
  return common::Sha256(pre);
}

namespace {

uint64_t DrawOf(std::string_view seed, std::string_view what, uint64_t i) {
  std::string pre(seed);
  pre.append(what);
  AppendU64(&pre, i);
  const std::string h = common::Sha256(pre);
  uint64_t v = 0;
  for (int b = 0; b < 8; ++b) v = (v << 8) | static_cast<uint8_t>(h[b]);
  return v;
}

}  // namespace

std::vector<ReplayDraw> DrawReplays(const pb::RoundResult& result, uint32_t rate_bps) {
  return DrawReplays(
      result, std::vector<uint32_t>(static_cast<size_t>(result.contributions_size()), rate_bps));
}

std::vector<ReplayDraw> DrawReplays(const pb::RoundResult& result,
                                    std::span<const uint32_t> rates_bps) {
  std::vector<ReplayDraw> draws;
  const size_t n = static_cast<size_t>(result.contributions_size());
  if (n < 2 || rates_bps.size() != n) return draws;
  std::string pre = "gonka-trainshard/v1/replay";
  pre.append(result.new_root());
  AppendU64(&pre, result.round());
  const std::string seed = common::Sha256(pre);
  for (size_t i = 0; i < n; ++i) {
    if (DrawOf(seed, "check", i) % 10000 >= rates_bps[i]) continue;
    draws.push_back(
        {.member = i, .validator = (i + 1 + DrawOf(seed, "validator", i) % (n - 1)) % n});
  }
  return draws;
}

absl::Status CheckContributions(const pb::RoundResult& result) {
  if (result.contributions().empty()) return absl::OkStatus();
  const std::string round_field = absl::StrCat("certificate of round ", result.round());
  if (result.contributions_size() != result.members_size()) {
    return absl::InvalidArgumentError(absl::StrCat(round_field, ": ", result.contributions_size(),
                                                   " contributions for ", result.members_size(),
                                                   " members"));
  }
  for (int i = 0; i < result.contributions_size(); ++i) {
    const pb::Contribution& c = result.contributions(i);
    const std::string field = absl::StrCat(round_field, ": contributions[", i, "]");
    if (c.host() != result.members(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".host: ", c.host(), " is not members[", i, "] ", result.members(i)));
    }
    if (c.delta_commitment().size() != 32 || c.assignment().size() != 32) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": delta_commitment and assignment must be 32 bytes, not ",
                       c.delta_commitment().size(), " and ", c.assignment().size()));
    }
  }
  return absl::OkStatus();
}

bool HasQuorum(uint64_t signed_weight, uint64_t total_weight) {
#ifdef TS_PLANTED_BUG_QUORUM_AT_TWO_THIRDS
  // A bug planted on purpose, defined only by tests/sim's ts_sidecar_shard_planted (which the
  // simulation must catch): exactly 2/3 passes.
  return total_weight > 0 && 3 * static_cast<unsigned __int128>(signed_weight) >=
                                 2 * static_cast<unsigned __int128>(total_weight);
#else
  return protocol::IsQuorum(signed_weight, total_weight);
#endif
}

uint64_t TotalWeight(const ShardView& shard) {
  uint64_t total = 0;
  for (const ShardMember& m : shard.members) total += m.weight;
  return total;
}

absl::Status SignPlan(const common::PrivateKey& key, std::string_view chain_id,
                      pb::RoundPlan* plan) {
  plan->clear_signature();
  TS_ASSIGN_OR_RETURN(std::string sig,
                      common::SignStatement(key, kPlanSignKind, chain_id, plan->shard_id(),
                                            DeterministicBytes(*plan)));
  plan->set_signature(std::move(sig));
  return absl::OkStatus();
}

absl::Status VerifyPlan(std::string_view chain_id, const pb::RoundPlan& plan,
                        const ShardView& shard) {
  if (plan.shard_id() != shard.shard_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.shard_id: ", plan.shard_id(), " is not shard ", shard.shard_id));
  }
  if (shard.Find(plan.planner()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("plan.planner: ", plan.planner(),
                                                    " is not a member of shard ", shard.shard_id));
  }
  if (plan.members_size() < 2 || static_cast<size_t>(plan.members_size()) > shard.members.size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan.members: ", plan.members_size(),
                                                   " members, want 2..", shard.members.size()));
  }
  std::set<std::string> seen;
  for (int i = 0; i < plan.members_size(); ++i) {
    const pb::RoundMember& m = plan.members(i);
    std::string field = absl::StrCat("plan.members[", i, "]");
    if (shard.Find(m.address()) == nullptr) {
      return absl::PermissionDeniedError(absl::StrCat(
          field, ".address: ", m.address(), " is not a member of shard ", shard.shard_id));
    }
    if (!seen.insert(m.address()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".address: ", m.address(), " appears twice"));
    }
    if (m.collective_endpoint().empty() || m.collective_endpoint().size() > 300) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".collective_endpoint: ", m.collective_endpoint().size(), " bytes, want 1..300"));
    }
    if (m.worker_threads() > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".worker_threads: ", m.worker_threads(), " is more than 1024"));
    }
  }
  if (plan.base_root().size() != 32 || plan.data_seed().size() != 32) {
    return absl::InvalidArgumentError("plan.base_root and plan.data_seed must be 32 bytes");
  }
  TS_RETURN_IF_ERROR(CheckVerdicts(chain_id, plan.verdicts(), plan.round(), shard, "plan.verdicts",
                                   kVerdictsPerPlanMax));
  pb::RoundPlan unsigned_plan = plan;
  unsigned_plan.clear_signature();
  return CheckSigner(kPlanSignKind, chain_id, plan.shard_id(), DeterministicBytes(unsigned_plan),
                     plan.signature(), plan.planner(), "plan.signature");
}

absl::StatusOr<std::string> SignRoundResult(const common::PrivateKey& key,
                                            std::string_view chain_id,
                                            const pb::RoundResult& result) {
  return common::SignStatement(key, kRoundSignKind, chain_id, result.shard_id(),
                               DeterministicBytes(result));
}

absl::StatusOr<std::string> SignEvaluation(const common::PrivateKey& key, std::string_view chain_id,
                                           const pb::EvaluationResult& e) {
  return common::SignStatement(key, kEvaluationSignKind, chain_id, e.shard_id(),
                               DeterministicBytes(e));
}

int64_t MedianOf(std::vector<int64_t> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

absl::Status VerifyCertificate(std::string_view chain_id, const pb::RoundCertificate& certificate,
                               const ShardView& shard) {
  const pb::RoundResult& result = certificate.result();
  const std::string round_field = absl::StrCat("certificate of round ", result.round());
  if (result.shard_id() != shard.shard_id) {
    return absl::InvalidArgumentError(absl::StrCat(round_field, ": shard_id ", result.shard_id(),
                                                   " is not shard ", shard.shard_id));
  }
  if (result.new_root().size() != 32 || result.base_root().size() != 32) {
    return absl::InvalidArgumentError(absl::StrCat(round_field, ": roots must be 32 bytes"));
  }
  TS_RETURN_IF_ERROR(CheckContributions(result));
  TS_RETURN_IF_ERROR(CheckVerdicts(chain_id, result.verdicts(), result.round(), shard,
                                   absl::StrCat(round_field, ": verdicts"), kVerdictsPerPlanMax));
  std::set<std::string> round_members(result.members().begin(), result.members().end());
  const std::string bytes = DeterministicBytes(result);
  std::set<std::string> signers;
  uint64_t weight = 0;
  for (int i = 0; i < certificate.signatures_size(); ++i) {
    const pb::MemberSignature& s = certificate.signatures(i);
    std::string field = absl::StrCat(round_field, ": signatures[", i, "]");
    const ShardMember* member = shard.Find(s.host());
    if (member == nullptr || round_members.count(s.host()) == 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ".host: ", s.host(), " is not a member of the round"));
    }
    if (!signers.insert(s.host()).second) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".host: ", s.host(), " signs twice"));
    }
    TS_RETURN_IF_ERROR(CheckSigner(kRoundSignKind, chain_id, shard.shard_id, bytes, s.signature(),
                                   s.host(), field));
    weight += member->weight;
  }
  const uint64_t total = TotalWeight(shard);
  if (!HasQuorum(weight, total)) {
    return absl::FailedPreconditionError(
        absl::StrCat(round_field, ": signed weight ", weight, " is not more than 2/3 of ", total));
  }
  if (certificate.signed_weight() != weight || certificate.total_weight() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat(round_field, ": states weight ", certificate.signed_weight(), " of ",
                     certificate.total_weight(), ", the signatures give ", weight, " of ", total));
  }
  std::vector<int64_t> losses;
  std::set<std::string> evaluators;
  for (int i = 0; i < certificate.evaluations_size(); ++i) {
    const pb::SignedEvaluation& e = certificate.evaluations(i);
    std::string field = absl::StrCat(round_field, ": evaluations[", i, "]");
    if (signers.count(e.result().host()) == 0 || !evaluators.insert(e.result().host()).second) {
      return absl::PermissionDeniedError(absl::StrCat(field, ".host: ", e.result().host(),
                                                      " is not a signer of the round, or twice"));
    }
    if (e.result().checkpoint_root() != result.new_root() || e.result().round() != result.round() ||
        e.result().shard_id() != shard.shard_id) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": evaluates another checkpoint, round or shard"));
    }
    TS_RETURN_IF_ERROR(CheckSigner(kEvaluationSignKind, chain_id, shard.shard_id,
                                   DeterministicBytes(e.result()), e.signature(), e.result().host(),
                                   field));
    losses.push_back(e.result().loss_micro());
  }
  if (MedianOf(losses) != certificate.eval_loss_micro()) {
    return absl::InvalidArgumentError(absl::StrCat(round_field, ": eval_loss_micro ",
                                                   certificate.eval_loss_micro(),
                                                   " is not the median of its evaluations"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::Settlement> DraftSettlement(std::string_view chain_id, const ShardView& shard,
                                               uint64_t escrow, const pb::RewardPolicy& policy,
                                               const pb::VerificationSpec& verification,
                                               std::span<const pb::RoundCertificate> certificates,
                                               uint64_t rounds_planned) {
  if (certificates.empty() || certificates.size() > rounds_planned ||
      rounds_planned > protocol::kRoundsMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "certificates: ", certificates.size(), " held, the run has ", rounds_planned, " rounds"));
  }
  if (policy.max_host_share_bps() < 1 || policy.max_host_share_bps() > kBps) {
    return absl::InvalidArgumentError(
        absl::StrCat("reward_policy.max_host_share_bps: ", policy.max_host_share_bps()));
  }
  if (policy.kind() != pb::RewardPolicy::KIND_VERIFIED_WORK &&
      policy.kind() != pb::RewardPolicy::KIND_EQUAL_SHARE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reward_policy.kind: ", pb::RewardPolicy::Kind_Name(policy.kind()), " is not payable"));
  }
  // Per host, sorted by address so every member drafts the same bytes.
  std::map<std::string, pb::HostPayout> stats;
  VerdictTally tally(shard, verification);
  for (size_t i = 0; i < certificates.size(); ++i) {
    const pb::RoundResult& result = certificates[i].result();
    if (result.round() != i + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("certificates[", i, "]: round ", result.round(), ", want ", i + 1));
    }
    tally.Add(result);
    for (const pb::MemberSignature& s : certificates[i].signatures()) {
      pb::HostPayout& p = stats[s.host()];
      p.set_rounds_contributed(p.rounds_contributed() + 1);
    }
  }
  const uint64_t paid_rounds = PaidRounds(verification.replay_rate_bps(), certificates.size());
  for (const pb::RoundCertificate& c : certificates) {
    // A contribution the spec's scoring rule left out is not paid (scoring.h).
    std::vector<StepScore> scores;
    for (const pb::Contribution& k : c.result().contributions()) scores.push_back(StepScoreOf(k));
    const std::vector<bool> left_out = LeftOut(verification, scores);
    for (int i = 0; i < c.result().contributions_size(); ++i) {
      const pb::Contribution& k = c.result().contributions(i);
      auto it = stats.find(k.host());
      if (it == stats.end()) continue;  // a contribution paid only with the host's signature
      pb::HostPayout& p = it->second;
      const bool helped = left_out.empty() || !left_out[static_cast<size_t>(i)];
      if (!helped) p.set_unhelpful(p.unhelpful() + 1);
      if (c.result().round() <= paid_rounds && helped) {
        p.set_tokens(p.tokens() + k.tokens());
        p.set_score(p.score() + k.score_micro());
      }
      const VerdictTally::Judgement j = tally.JudgementOf(c.result().round(), k.host());
      if (j == VerdictTally::Judgement::kConfirmed) p.set_rejected(p.rejected() + 1);
      if (tally.Verified(c.result().round(), k.host())) p.set_verified(p.verified() + 1);
    }
  }
  for (auto& [host, p] : stats) {
    p.set_host(host);
    p.set_marks(tally.Marks(host));
  }
  pb::Settlement s;
  s.set_chain_id(std::string(chain_id));
  s.set_shard_id(shard.shard_id);
  const pb::RoundCertificate& last = certificates.back();
  s.set_final_checkpoint_root(last.result().new_root());
  s.set_rounds_completed(certificates.size());
  s.set_rounds_planned(rounds_planned);
  pb::EvaluationSummary* eval = s.mutable_evaluation();
  eval->set_metric("eval_loss");
  eval->set_value_micro(last.eval_loss_micro());
  eval->set_evaluators(static_cast<uint32_t>(last.evaluations_size()));
  if (last.evaluations_size() > 0) {
    eval->set_eval_set_root(last.evaluations(0).result().eval_set_id());
  }
  for (auto& [host, p] : stats) *s.add_payouts() = std::move(p);
  const std::vector<uint64_t> amounts = bridge::PayoutsFromStats(
      protocol::PayableOf(escrow, s.rounds_completed(), rounds_planned), policy, s.payouts());
  uint64_t paid = 0;
  for (int i = 0; i < s.payouts_size(); ++i) {
    const uint64_t amount = amounts[static_cast<size_t>(i)];
    s.mutable_payouts(i)->set_amount(common::FormatAmount(amount));
    paid += amount;
  }
  s.set_refund(common::FormatAmount(escrow - paid));
  return s;
}

}  // namespace ts::sidecar
