#include "sidecar/shard/replay_checks.h"

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/run_spec.h"
#include "sidecar/shard/verdicts.h"
#include "worker/client/work_dir.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr char kReplayDeltaFile[] = "replay.bin";

}  // namespace

void ReplayChecks::Run(const pb::RoundCertificate& certificate) {
  const pb::RoundResult& result = certificate.result();
  std::vector<VerdictTally::Draw> draws;
  std::vector<std::pair<uint64_t, std::string>> unanswered;
  {
    absl::MutexLock lock(&run_.mu);
    absl::StatusOr<const VerdictTally*> tally = run_.Tally();
    if (!tally.ok()) {
      run_.Transition(absl::StrCat("replays of round ", result.round(),
                                   " not drawn: ", tally.status().message()));
      return;
    }
    draws = (*tally)->Draws(result.round());
    unanswered = (*tally)->Unanswered(run_.host.address);
    run_.status.set_marks((*tally)->Marks(run_.host.address));
  }
  // Drawn replays the worker could not run before (it was down), while the window lasts; a
  // base no longer held does not come back.
  auto retry_later = [this](uint64_t round, size_t index, const absl::Status& s) {
    if (!s.ok() && !absl::IsFailedPrecondition(s)) retries_.emplace_back(round, index);
  };
  std::vector<std::pair<uint64_t, size_t>> retries = std::move(retries_);
  retries_.clear();
  for (const auto& [round, index] : retries) {
    if (round + kVerdictRounds <= result.round()) continue;
    std::optional<pb::RoundCertificate> stored = StoredCertificate(round);
    if (stored) retry_later(round, index, Check(*stored, index, "drawn, tried again"));
  }
  for (const VerdictTally::Draw& draw : draws) {
    if (draw.validator != run_.host.address) continue;
    retry_later(result.round(), draw.index, Check(certificate, draw.index, "drawn"));
  }
  // Failures found by others that the certificates ask this host to confirm or reject.
  for (const auto& [round, member] : unanswered) {
    // Past the window, no plan carries a verdict about the round any more.
    if (round + kVerdictRounds <= result.round()) continue;
    std::optional<pb::RoundCertificate> stored = StoredCertificate(round);
    if (!stored) continue;
    const pb::RoundResult& accused = stored->result();
    for (int i = 0; i < accused.contributions_size(); ++i) {
      if (accused.contributions(i).host() == member) {
        // Not run: still unanswered after the next certificate, so asked again then.
        Check(*stored, static_cast<size_t>(i), "asked by a verdict of failure").IgnoreError();
      }
    }
  }
}

absl::Status ReplayChecks::Check(const pb::RoundCertificate& certificate, size_t member,
                                 absl::string_view why) {
  const pb::RoundResult& result = certificate.result();
  const pb::Contribution& c = result.contributions(static_cast<int>(member));
  const std::string what =
      absl::StrCat("replay of ", Short(c.host()), "'s round ", result.round(), " (", why, ")");
  const int64_t started = run_.host.clock->MonotonicMs();
  // The worker's time, the re-evaluation's included, goes into the run's replay_seconds.
  absl::Cleanup counted = [this, started] {
    const double seconds = (run_.host.clock->MonotonicMs() - started) / 1000.0;
    absl::MutexLock lock(&run_.mu);
    run_.status.set_replay_seconds(run_.status.replay_seconds() + seconds);
  };
  absl::StatusOr<Replayed> replayed = Replay(result, member);
  if (!replayed.ok()) {
    run_.Transition(absl::StrCat(what, " not run: ", replayed.status().message()));
    return replayed.status();
  }
  pb::Verdict v;
  // The member's evaluation of the round, when the certificate carries one, evaluated again.
  for (const pb::SignedEvaluation& e : certificate.evaluations()) {
    if (e.result().host() != c.host()) continue;
    absl::StatusOr<int64_t> again = Reevaluate(result.round(), c.worker_threads());
    if (!again.ok()) {
      run_.Transition(absl::StrCat(what, " not run: re-evaluating: ", again.status().message()));
      return again.status();
    }
    v.set_evaluated(true);
    v.set_evaluation_loss_micro(e.result().loss_micro());
    v.set_reevaluation_loss_micro(*again);
  }
  const bool same_delta = replayed->commitment == c.delta_commitment();
  const bool same_evaluation = v.evaluation_loss_micro() == v.reevaluation_loss_micro();
  const bool scored = Scores(run_.spec);
  if (scored) {
    v.set_scored(true);
    v.set_score_micro(c.score_micro());
    v.set_assigned_score_micro(c.assigned_score_micro());
    v.set_rescore_micro(replayed->score.held_out_micro);
    v.set_reassigned_score_micro(replayed->score.assigned_micro);
  }
  const bool same_score = !scored || replayed->score == StepScoreOf(c);
  v.set_shard_id(run_.shard_id);
  v.set_round(result.round());
  v.set_member(c.host());
  v.set_validator(run_.host.address);
  v.set_committed(c.delta_commitment());
  v.set_replayed(replayed->commitment);
  v.set_assignment(c.assignment());
  v.set_worker_threads(c.worker_threads());
  v.set_reproduced(same_delta && same_evaluation && same_score);
  absl::StatusOr<pb::SignedVerdict> signed_verdict =
      SignVerdict(*run_.host.key, run_.host.chain_id, std::move(v));
  {
    absl::MutexLock lock(&run_.mu);
    run_.status.set_replays(run_.status.replays() + 1);
    if (same_delta && same_evaluation && same_score)
      run_.status.set_replays_passed(run_.status.replays_passed() + 1);
    if (signed_verdict.ok()) run_.pending_verdicts.push_back(*std::move(signed_verdict));
  }
  std::string outcome = ": reproduced its commitment";
  if (!same_delta) {
    outcome = ": FAILED, the replayed Δ does not match the commitment it signed";
  } else if (!same_evaluation) {
    outcome = ": FAILED, its evaluation of the round does not match the re-evaluation";
  } else if (!same_score) {
    outcome = absl::StrCat(": FAILED, its score claim ", c.score_micro(), "/",
                           c.assigned_score_micro(), " does not match the replay's ",
                           replayed->score.held_out_micro, "/", replayed->score.assigned_micro);
  }
  run_.Transition(absl::StrCat(what, outcome));
  return absl::OkStatus();
}

std::optional<pb::RoundCertificate> ReplayChecks::StoredCertificate(uint64_t round) const {
  auto certs = run_.LoadCertificates(round, 1);
  if (!certs.ok() || certs->empty() || certs->front().result().round() != round) {
    return std::nullopt;
  }
  return std::move(certs->front());
}

absl::StatusOr<int64_t> ReplayChecks::Reevaluate(uint64_t round, uint32_t threads) {
  pb::EvaluateRequest request = run_.EvaluateRequestOf();
  request.set_checkpoint_file(CheckpointName(round));
  request.set_threads(threads);
  TS_ASSIGN_OR_RETURN(pb::EvaluateResponse ev, run_.worker->Evaluate(request));
  return LossMicroOf(ev.mean_loss());
}

absl::StatusOr<ReplayChecks::Replayed> ReplayChecks::Replay(const pb::RoundResult& result,
                                                            size_t member) {
  const pb::Contribution& c = result.contributions(static_cast<int>(member));
  const std::string base = CheckpointName(result.round() - 1);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(run_.work_dir + "/" + base, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the round's base checkpoint ", base, " is not held here"));
  }
  // Replays run only without overlap, where a round's data seed is drawn from its base.
  TS_ASSIGN_OR_RETURN(ShardView view, run_.View());
  pb::InnerStepsRequest request =
      InnerStepsRequestOf(run_.spec, view, run_.data.shard_files(), result.round(),
                          DataSeedOf(run_.spec.spec.seed(), result.round(), result.base_root()),
                          c.host(), result.base_root());
  request.set_delta_file(kReplayDeltaFile);
  request.set_replay_checkpoint_file(base);
  request.set_replay_threads(c.worker_threads());
  AddScoreRequest(run_.spec, run_.data.eval_file(), &request);
  TS_ASSIGN_OR_RETURN(pb::InnerStepsResponse done,
                      run_.worker->InnerSteps(request, InnerStepsTimeoutMs(run_.spec.spec)));
  std::vector<float> delta(run_.parameters);
  TS_RETURN_IF_ERROR(worker::ReadWorkFileInto(
      run_.work_dir, "replay", kReplayDeltaFile,
      std::span<char>(reinterpret_cast<char*>(delta.data()), 4 * delta.size())));
  Replayed out;
  TS_ASSIGN_OR_RETURN(out.commitment, DeltaCommitmentOf(run_.spec, member, delta));
  if (Scores(run_.spec)) out.score = StepScoreOf(done);
  return out;
}

}  // namespace ts::sidecar
