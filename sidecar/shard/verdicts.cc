#include "sidecar/shard/verdicts.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/crypto/signing.h"
#include "common/protocol.h"
#include "common/status.h"
#include "proto/deterministic.h"
#include "sidecar/shard/ledger.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

absl::Status CheckVerdict(std::string_view chain_id, const pb::SignedVerdict& signed_verdict,
                          uint64_t round, const ShardView& shard, const std::string& field) {
  const pb::Verdict& v = signed_verdict.verdict();
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  };
  if (v.shard_id() != shard.shard_id) {
    return invalid(absl::StrCat("shard_id ", v.shard_id(), " is not shard ", shard.shard_id));
  }
  if (v.round() == 0 || v.round() >= round || round - v.round() > kVerdictRounds) {
    return invalid(absl::StrCat("about round ", v.round(), ", want ",
                                round > kVerdictRounds ? round - kVerdictRounds : 1, "..",
                                round - 1));
  }
  if (shard.Find(v.member()) == nullptr || shard.Find(v.validator()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": member ", v.member().substr(0, 80),
                                                    " or validator ", v.validator().substr(0, 80),
                                                    " is not a member of the shard"));
  }
  if (v.member() == v.validator()) return invalid("the validator judges itself");
  if (v.committed().size() != 32 || v.replayed().size() != 32 || v.assignment().size() != 32) {
    return invalid("committed, replayed and assignment must be 32 bytes");
  }
  if (v.worker_threads() > 1024) {
    return invalid(absl::StrCat("worker_threads ", v.worker_threads(), " is more than 1024"));
  }
  if (!v.evaluated() && (v.evaluation_loss_micro() != 0 || v.reevaluation_loss_micro() != 0)) {
    return invalid("carries evaluation losses without evaluated");
  }
  if (!v.scored() && (v.score_micro() != 0 || v.assigned_score_micro() != 0 ||
                      v.rescore_micro() != 0 || v.reassigned_score_micro() != 0)) {
    return invalid("carries scores without scored");
  }
  const bool same_evaluation = v.evaluation_loss_micro() == v.reevaluation_loss_micro();
  const bool same_score = v.score_micro() == v.rescore_micro() &&
                          v.assigned_score_micro() == v.reassigned_score_micro();
  if (v.reproduced() != (v.replayed() == v.committed() && same_evaluation && same_score)) {
    return invalid(
        "reproduced does not say whether the replayed commitment is the committed one, the "
        "re-evaluation the evaluation and the replay's score the claimed one");
  }
  auto signer = common::RecoverStatementSigner(protocol::kSignVerdict, chain_id, v.shard_id(),
                                               DeterministicBytes(v), signed_verdict.signature());
  if (!signer.ok()) {
    return absl::UnauthenticatedError(absl::StrCat(field, ": ", signer.status().message()));
  }
  if (*signer != v.validator()) {
    return absl::UnauthenticatedError(
        absl::StrCat(field, ": signed by ", *signer, ", not by its validator ", v.validator()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<pb::SignedVerdict> SignVerdict(const common::PrivateKey& key,
                                              std::string_view chain_id, pb::Verdict verdict) {
  pb::SignedVerdict out;
  TS_ASSIGN_OR_RETURN(std::string signature,
                      common::SignStatement(key, protocol::kSignVerdict, chain_id,
                                            verdict.shard_id(), DeterministicBytes(verdict)));
  *out.mutable_verdict() = std::move(verdict);
  out.set_signature(std::move(signature));
  return out;
}

absl::Status CheckVerdicts(std::string_view chain_id,
                           const google::protobuf::RepeatedPtrField<pb::SignedVerdict>& verdicts,
                           uint64_t round, const ShardView& shard, absl::string_view field,
                           int max) {
  if (verdicts.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", verdicts.size(), " verdicts, at most ", max));
  }
  std::set<std::tuple<uint64_t, std::string, std::string>> seen;
  for (int i = 0; i < verdicts.size(); ++i) {
    const std::string f = absl::StrCat(field, "[", i, "]");
    TS_RETURN_IF_ERROR(CheckVerdict(chain_id, verdicts[i], round, shard, f));
    const pb::Verdict& v = verdicts[i].verdict();
    if (!seen.emplace(v.round(), v.member(), v.validator()).second) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": a second verdict of ", v.validator(),
                                                     " on ", v.member(), "'s round ", v.round()));
    }
  }
  return absl::OkStatus();
}

VerdictTally::VerdictTally(const ShardView& shard, const pb::VerificationSpec& spec)
    : rate_bps_(spec.replay_rate_bps()),
      marked_rate_bps_(std::max(spec.marked_replay_rate_bps(), spec.replay_rate_bps())),
      exclude_after_marks_(spec.exclude_after_marks()) {
  for (const ShardMember& m : shard.members) {
    weights_[m.address] = m.weight;
    total_weight_ += m.weight;
  }
}

void VerdictTally::Add(const pb::RoundResult& result) {
  if (result.round() <= last_round_) return;
  last_round_ = result.round();
  // Verdicts asked for by an earlier certificate: a failure found before this result counts
  // confirmations; one found in it does not yet.
  std::set<std::pair<uint64_t, std::string>> failed_before;
  for (const pb::SignedVerdict& s : result.verdicts()) {
    const pb::Verdict& v = s.verdict();
    auto it = accused_.find({v.round(), v.member()});
    if (it != accused_.end() && Judge(v.member(), it->second) != Judgement::kNone) {
      failed_before.emplace(v.round(), v.member());
    }
  }
  for (const pb::SignedVerdict& s : result.verdicts()) {
    const pb::Verdict& v = s.verdict();
    bool drawn = false;
    if (auto d = draws_.find(v.round()); d != draws_.end()) {
      for (const Draw& draw : d->second) {
        drawn |= draw.member == v.member() && draw.validator == v.validator();
      }
    }
    if (!drawn && failed_before.count({v.round(), v.member()}) == 0) continue;
    // The first verdict of a validator counts; a later certificate cannot change it.
    Accused& a = accused_[{v.round(), v.member()}];
    a.verdicts.emplace(v.validator(), v.reproduced());
    if (drawn && !v.reproduced() && a.accuser.empty()) a.accuser = v.validator();
  }
  // The replays this result draws, a marked member's at the higher rate.
  std::vector<uint32_t> rates;
  for (const pb::Contribution& c : result.contributions()) {
    rates.push_back(Marks(c.host()) > 0 ? marked_rate_bps_ : rate_bps_);
  }
  std::vector<Draw>& draws = draws_[result.round()];
  for (const ReplayDraw& d : DrawReplays(result, rates)) {
    draws.push_back({.index = d.member,
                     .member = result.contributions(static_cast<int>(d.member)).host(),
                     .validator = result.members(static_cast<int>(d.validator))});
  }
  while (!draws_.empty() && draws_.begin()->first + kVerdictRounds < last_round_) {
    draws_.erase(draws_.begin());
  }
}

std::vector<VerdictTally::Draw> VerdictTally::Draws(uint64_t round) const {
  auto it = draws_.find(round);
  return it == draws_.end() ? std::vector<Draw>{} : it->second;
}

VerdictTally::Judgement VerdictTally::Judge(const std::string& member, const Accused& a) const {
  uint64_t failed = 0;
  uint64_t passed = 0;
  for (const auto& [validator, reproduced] : a.verdicts) {
    auto w = weights_.find(validator);
    if (w == weights_.end()) continue;
    (reproduced ? passed : failed) += w->second;
  }
  if (failed == 0) return Judgement::kNone;
  // The accused does not judge itself: a failure is confirmed by more than 2/3 of the others'
  // weight; nor does the accuser judge its own accusation: it is rejected by more than 2/3 of
  // the weight of the rest (so one liar of four equal hosts is overruled). Either also needs
  // more than a third of the whole shard's weight, which no coalition the shard tolerates
  // (under a third) holds.
  auto weight_of = [&](const std::string& host) -> uint64_t {
    auto w = weights_.find(host);
    return w == weights_.end() ? 0 : w->second;
  };
  const unsigned __int128 others = total_weight_ - weight_of(member);
  const unsigned __int128 neutral = others - weight_of(a.accuser);
  auto decides = [&](unsigned __int128 weight, unsigned __int128 of) {
    return 3 * weight > 2 * of && 3 * weight > total_weight_;
  };
  if (decides(failed, others)) return Judgement::kConfirmed;
  if (decides(passed, neutral)) return Judgement::kRejected;
  return Judgement::kOpen;
}

VerdictTally::Judgement VerdictTally::JudgementOf(uint64_t round, const std::string& member) const {
  auto it = accused_.find({round, member});
  return it == accused_.end() ? Judgement::kNone : Judge(member, it->second);
}

bool VerdictTally::Has(uint64_t round, const std::string& member,
                       const std::string& validator) const {
  auto it = accused_.find({round, member});
  return it != accused_.end() && it->second.verdicts.count(validator) > 0;
}

std::vector<std::pair<uint64_t, std::string>> VerdictTally::Unanswered(
    const std::string& host) const {
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const auto& [key, a] : accused_) {
    if (key.second == host || a.verdicts.count(host) > 0) continue;
    if (Judge(key.second, a) == Judgement::kOpen) out.push_back(key);
  }
  return out;
}

uint32_t VerdictTally::Marks(const std::string& host) const {
  uint32_t marks = 0;
  for (const auto& [key, a] : accused_) {
    const Judgement j = Judge(key.second, a);
    if (j != Judgement::kConfirmed && j != Judgement::kRejected) continue;
    if (j == Judgement::kConfirmed && key.second == host) ++marks;
    auto said = a.verdicts.find(host);
    // A validator whose verdict the others overruled.
    if (said != a.verdicts.end() && said->second == (j == Judgement::kConfirmed)) ++marks;
  }
  return marks;
}

bool VerdictTally::Verified(uint64_t round, const std::string& member) const {
  auto it = accused_.find({round, member});
  if (it == accused_.end()) return false;
  bool passed = false;
  for (const auto& [validator, reproduced] : it->second.verdicts) passed |= reproduced;
  return passed && Judge(member, it->second) != Judgement::kConfirmed;
}

}  // namespace ts::sidecar
