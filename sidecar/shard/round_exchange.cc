#include "sidecar/shard/round_exchange.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sidecar/shard/checkpoint_publishing.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/replay_checks.h"
#include "sidecar/shard/round_certificate.h"
#include "worker/client/work_dir.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
// The least time members of a plan get to connect their mesh (see Reduce).
constexpr int64_t kConnectMinMs = 5000;

}  // namespace

absl::StatusOr<RoundExchange::Reduced> RoundExchange::Connect(const pb::RoundPlan& plan) {
  Reduced r;
  r.plan = plan;
  const uint64_t round = plan.round();
  r.started = run_.host.clock->MonotonicMs();
  r.deadline = r.started + run_.spec.spec.exchange_timeout_ms();
  TS_ASSIGN_OR_RETURN(r.view, run_.View());
  r.group.shard_id = run_.shard_id;
  r.group.session = (round << 16) | plan.attempt();
  r.self = plan.members_size();
  for (int i = 0; i < plan.members_size(); ++i) {
    GroupMember member{plan.members(i).address(), plan.members(i).collective_endpoint()};
    // The certificate the chain holds for the member: its links are pinned to it under TLS.
    for (const ShardMember& m : r.view.members) {
      if (m.address == member.address) member.tls_cert_sha256 = m.tls_cert_sha256;
    }
    r.group.members.push_back(std::move(member));
    if (plan.members(i).address() == run_.host.address) r.self = i;
  }
  // Every member of a plan announced within the last seconds and polls for the plan, so all of
  // them dial within a poll or two; a member that died after the plan was made would otherwise
  // hold the others until the exchange deadline.
  const int64_t connect_deadline =
      std::min(r.deadline, r.started + std::max<int64_t>(kConnectMinMs, run_.PlanningBoundMs()));
  TS_ASSIGN_OR_RETURN(r.mesh, run_.transport->Connect(r.group, r.self, connect_deadline));
  r.collective = std::make_unique<Collective>(r.mesh.get(), run_.host.key, run_.host.chain_id,
                                              run_.host.clock);
  return r;
}

absl::StatusOr<RoundExchange::Reduced> RoundExchange::Reduce(const pb::RoundPlan& plan,
                                                             const StepScore& own_score) {
  TS_ASSIGN_OR_RETURN(Reduced r, Connect(plan));
  const uint64_t round = plan.round();
  AbortOnStop guard(&run_, r.mesh.get());
  if (run_.spec.commitments && Scores(run_.spec)) TS_RETURN_IF_ERROR(GatherScores(r, own_score));

  // Read straight into the buffer the collective reduces in place: one copy of the Δ here.
  std::vector<float>& delta = r.aggregate;
  delta.resize(run_.parameters);
  TS_RETURN_IF_ERROR(worker::ReadWorkFileInto(
      run_.work_dir, "delta_file", DeltaName(round),
      std::span<char>(reinterpret_cast<char*>(delta.data()), 4 * delta.size())));
  OpOptions op;
  op.op_id = kDeltaOpId;
  op.codec = run_.spec.codec;
  op.reduce = ReduceOp::kMean;
  op.deadline_ms = r.deadline;
  OpStats stats;
  TS_ASSIGN_OR_RETURN(ShardView view, run_.View());
  // A mean weights each Δ by the tokens behind it (docs/training.md "Work by weight").
  std::vector<double> tokens;
  for (const pb::RoundMember& m : plan.members()) {
    tokens.push_back(static_cast<double>(MemberTokensOf(run_.spec, view, m.address())));
  }
  if (run_.spec.commitments) {
    AggregateSpec aggregate =
        RoundAggregate(run_.spec, view.members.size(), static_cast<size_t>(plan.members_size()));
    aggregate.weights = std::move(tokens);
    r.left_out = LeftOut(run_.spec.spec.verification(), r.scores);
    aggregate.left_out = r.left_out;
    TS_ASSIGN_OR_RETURN(stats, r.collective->RobustAllReduce(op, aggregate, delta, &r.commitments));
  } else {
    // The ring averages: this host's Δ enters it scaled by n × its tokens / all tokens, so the
    // mean is the token-weighted one (exactly the plain mean when the batches are equal).
    const double all = std::accumulate(tokens.begin(), tokens.end(), 0.0);
    const double mine = static_cast<double>(MemberTokensOf(run_.spec, view, run_.host.address));
    const auto scale = static_cast<float>(static_cast<double>(tokens.size()) * mine / all);
    if (scale != 1.0f) {
      for (float& v : delta) v *= scale;
    }
    TS_ASSIGN_OR_RETURN(stats, r.collective->AllReduce(op, delta));
  }
  r.bytes += stats.wire_bytes_sent;
  r.reduced = run_.host.clock->MonotonicMs();
  return r;
}

absl::Status RoundExchange::GatherScores(Reduced& r, const StepScore& own_score) {
  OpOptions op;
  op.op_id = kScoreOpId;
  op.codec = run_.spec.codec;
  op.reduce = ReduceOp::kMean;
  op.deadline_ms = r.deadline;
  const std::string mine = EncodeScoreClaim(own_score);
  std::string gathered(kScoreClaimBytes * r.group.members.size(), '\0');
  TS_ASSIGN_OR_RETURN(OpStats stats, r.collective->AllGather(op, mine, gathered));
  r.bytes += stats.wire_bytes_sent;
  for (size_t i = 0; i < r.group.members.size(); ++i) {
    const std::string& member = r.group.members[i].address;
    absl::StatusOr<StepScore> claim = DecodeScoreClaim(
        std::string_view(gathered).substr(i * kScoreClaimBytes, kScoreClaimBytes), member);
    // Every member gathered the same claims and fails the attempt alike, naming the sender.
    if (!claim.ok()) {
      return PeerFailure(claim.status().code(), member, std::string(claim.status().message()));
    }
    r.scores.push_back(*claim);
  }
  return absl::OkStatus();
}

absl::Status RoundExchange::Finish(Reduced& r, float own_train_loss, double inner_seconds) {
  const pb::RoundPlan& plan = r.plan;
  const uint64_t round = plan.round();
  // With overlap the members come here after their next round's steps, which take a while
  // and not the same while on every host: the rest of the exchange gets its own timeout.
  const int64_t deadline =
      std::max(r.deadline, run_.host.clock->MonotonicMs() + run_.spec.spec.exchange_timeout_ms());
  AbortOnStop guard(&run_, r.mesh.get());
  TS_ASSIGN_OR_RETURN(std::string new_root, OuterStep(r));

  pb::RoundResult result;
  result.set_shard_id(run_.shard_id);
  result.set_round(round);
  result.set_base_root(plan.base_root());
  result.set_new_root(new_root);
  for (const auto& m : plan.members()) result.add_members(m.address());
  result.set_run_spec_hash(run_.spec.hash);
  TS_RETURN_IF_ERROR(AddContributions(r, &result));
  *result.mutable_verdicts() = plan.verdicts();
  const bool evaluate =
      round % run_.spec.spec.eval_every() == 0 || round == run_.spec.spec.rounds();
  TS_ASSIGN_OR_RETURN(pb::RoundCertificate vote, Vote(result, own_train_loss, evaluate));
  size_t evaluations = 0;
  TS_ASSIGN_OR_RETURN(pb::RoundCertificate cert,
                      Certify(r, result, vote, deadline, evaluate, &evaluations));
  TS_RETURN_IF_ERROR(run_.StoreCertificates({cert}));
  run_.loaded = true;
  const int64_t certified = run_.host.clock->MonotonicMs();
  run_.last_round_seconds = (certified - r.started) / 1000.0 + inner_seconds;
  run_.RecordRound(cert, run_.last_round_seconds, inner_seconds, (r.reduced - r.started) / 1000.0,
                   (certified - r.reduced) / 1000.0);
  std::vector<std::string> short_members;
  for (const auto& m : result.members()) short_members.push_back(Short(m));
  // Where the run scores, each member's held-out score (milli-nats), "left out" where the
  // spec's rule left its contribution out.
  std::vector<std::string> scores;
  for (size_t i = 0; i < r.scores.size(); ++i) {
    scores.push_back(absl::StrCat(r.scores[i].held_out_micro / 1000,
                                  !r.left_out.empty() && r.left_out[i] ? " (left out)" : ""));
  }
  run_.Transition(absl::StrCat(
      "round ", round, " certified (attempt ", plan.attempt(), ", ", cert.signatures_size(),
      " signatures, weight ", cert.signed_weight(), "/", cert.total_weight(), "): root ",
      Hex8(result.new_root()), ", train loss ", cert.train_loss(),
      evaluate ? absl::StrCat(", eval loss ", cert.eval_loss_micro() / 1e6, " (median of ",
                              evaluations, ")")
               : std::string(),
      "; members ", absl::StrJoin(short_members, ", "),
      scores.empty() ? std::string()
                     : absl::StrCat("; held-out scores (mnat) ", absl::StrJoin(scores, ", "))));

  PublishCheckpoint(run_, round, r.collective.get(), r.group, r.self, deadline);
  {
    const double publish_seconds = (run_.host.clock->MonotonicMs() - certified) / 1000.0;
    absl::MutexLock lock(&run_.mu);
    for (pb::RoundSummary& s : *run_.status.mutable_rounds()) {
      if (s.round() == round) s.set_publish_seconds(publish_seconds);
    }
  }
  if (round == run_.spec.spec.rounds()) {
    settlement_.Exchange(r.collective.get(), r.group, deadline, round);
  }
  // The replays owed by this host, while it holds the rounds' bases.
  if (run_.spec.spec.verification().replay_rate_bps() > 0) ReplayChecks(&run_).Run(cert);
  // Files of rounds no longer needed: with replays, the bases of the rounds a verdict may still
  // ask to replay.
  const uint64_t kept =
      run_.spec.spec.verification().replay_rate_bps() > 0 ? kVerdictRounds + 2 : 2;
  if (round >= kept) run_.RemoveTree(CheckpointDir(round - kept));
  return absl::OkStatus();
}

absl::Status RoundExchange::AddContributions(const Reduced& r, pb::RoundResult* result) const {
  if (r.commitments.empty()) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(ShardView view, run_.View());
  for (size_t i = 0; i < r.commitments.size(); ++i) {
    pb::Contribution* c = result->add_contributions();
    c->set_host(r.plan.members(static_cast<int>(i)).address());
    c->set_delta_commitment(r.commitments[i]);
    c->set_assignment(
        AssignmentIdOf(run_.spec.hash, r.plan.data_seed(), r.plan.round(), c->host()));
    c->set_tokens(MemberTokensOf(run_.spec, view, c->host()));
    c->set_worker_threads(r.plan.members(static_cast<int>(i)).worker_threads());
    if (i < r.scores.size()) {
      c->set_score_micro(r.scores[i].held_out_micro);
      c->set_assigned_score_micro(r.scores[i].assigned_micro);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RoundExchange::OuterStep(Reduced& r) {
  const std::vector<float>& delta = r.aggregate;
  TS_RETURN_IF_ERROR(worker::WriteWorkFile(
      run_.work_dir, "aggregate", "aggregate.bin",
      std::string_view(reinterpret_cast<const char*>(delta.data()), 4 * delta.size())));
  TS_RETURN_IF_ERROR(run_.MakeDir(CheckpointDir(r.plan.round())));
  pb::OuterStepRequest outer;
  outer.set_delta_file("aggregate.bin");
  *outer.mutable_outer() = run_.spec.spec.outer();
  outer.set_checkpoint_file(CheckpointName(r.plan.round()));
  outer.set_base_root(r.plan.base_root());
  TS_ASSIGN_OR_RETURN(pb::OuterStepResponse stepped, run_.worker->OuterStep(outer));
  run_.loaded = false;  // the worker now holds an uncertified checkpoint
  return stepped.root();
}

absl::StatusOr<pb::RoundCertificate> RoundExchange::Vote(const pb::RoundResult& result,
                                                         float own_train_loss, bool evaluate) {
  pb::RoundCertificate vote;
  *vote.mutable_result() = result;
  pb::MemberSignature* own = vote.add_signatures();
  own->set_host(run_.host.address);
  TS_ASSIGN_OR_RETURN(std::string sig, SignRoundResult(*run_.host.key, run_.host.chain_id, result));
  own->set_signature(sig);
  vote.set_train_loss(own_train_loss);
  if (!evaluate) return vote;
  TS_ASSIGN_OR_RETURN(pb::EvaluateResponse ev, run_.worker->Evaluate(run_.EvaluateRequestOf()));
  pb::SignedEvaluation* se = vote.add_evaluations();
  pb::EvaluationResult* e = se->mutable_result();
  e->set_shard_id(run_.shard_id);
  e->set_round(result.round());
  e->set_checkpoint_root(result.new_root());
  e->set_eval_set_id(ev.eval_id());
  e->set_loss_micro(LossMicroOf(ev.mean_loss()));
  e->set_tokens(ev.tokens());
  e->set_host(run_.host.address);
  TS_ASSIGN_OR_RETURN(std::string esig, SignEvaluation(*run_.host.key, run_.host.chain_id, *e));
  se->set_signature(esig);
  return vote;
}

absl::StatusOr<pb::RoundCertificate> RoundExchange::Certify(Reduced& r,
                                                            const pb::RoundResult& result,
                                                            const pb::RoundCertificate& vote,
                                                            int64_t deadline, bool evaluate,
                                                            size_t* evaluations) {
  // The vote travels without the result, which every member computed itself and its signature
  // is checked against (contributions and verdicts grow with the members): only its round and
  // root, to name a disagreement.
  pb::RoundCertificate slim = vote;
  slim.clear_result();
  slim.mutable_result()->set_round(result.round());
  slim.mutable_result()->set_new_root(result.new_root());
  TS_ASSIGN_OR_RETURN(std::string block, PackBlock(slim, kVoteBlockBytes));
  std::string gathered(kVoteBlockBytes * r.group.members.size(), '\0');
  OpOptions op;
  op.op_id = kEvaluationOpId;
  op.codec = run_.spec.codec;
  op.reduce = ReduceOp::kMean;
  op.deadline_ms = deadline;
  TS_ASSIGN_OR_RETURN(OpStats gstats, r.collective->AllGather(op, block, gathered));
  std::vector<std::string> members;
  for (const auto& m : r.group.members) members.push_back(m.address);
  CountedVotes counted =
      CountVotes(run_.host.chain_id, r.view, result, r.plan.attempt(), members, gathered, evaluate);
  for (const std::string& line : counted.refused) run_.Transition(line);
  pb::RoundCertificate& cert = counted.certificate;
  cert.set_bytes_exchanged(r.bytes + gstats.wire_bytes_sent);
  if (!HasQuorum(cert.signed_weight(), cert.total_weight())) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", result.round(), ": signatures of weight ", cert.signed_weight(),
                     " of ", cert.total_weight(), " agree, not more than 2/3"));
  }
  TS_RETURN_IF_ERROR(VerifyCertificate(run_.host.chain_id, cert, r.view));
  *evaluations = counted.evaluations;
  return std::move(cert);
}

}  // namespace ts::sidecar
