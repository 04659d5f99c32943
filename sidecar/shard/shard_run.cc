#include "sidecar/shard/shard_run.h"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "sidecar/shard/catch_up.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/round_exchange.h"
#include "sidecar/shard/round_planning.h"
#include "sidecar/shard/run_context.h"
#include "sidecar/shard/run_preparation.h"
#include "sidecar/shard/settlement_exchange.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr int kWorkerRestartsMax = 5;

}  // namespace

// The run thread: the round loop (with or without overlap) over the pieces, and what it keeps
// between rounds — this host's Δs and what their inner steps reported, the worker's restarts.
struct ShardRun::Impl {
  Impl(const ShardRunHost& h, const ShardRunOptions& o, uint64_t id, ParsedRunSpec s)
      : ctx(h, o, id, std::move(s), h.make_peers ? h.make_peers() : MakeGrpcRoundPeers()) {}

  RunContext ctx;
  RunPreparation preparation{&ctx};
  RunCatchUp catch_up{&ctx};
  RoundPlanning planning{&ctx, &catch_up};
  SettlementExchange settlement{&ctx};
  RoundExchange exchange{&ctx, &settlement};
  std::thread thread;

  // The run thread's.
  int worker_restarts = 0;
  uint64_t delta_round = 0;
  std::string delta_data_root;  // the root delta_round's data seed was drawn from
  // With overlap: the rounds whose Δ file (DeltaName) holds this host's Δ, computed since the
  // last catch-up (at most the round in flight and the next), with what the steps reported.
  struct DeltaInfo {
    float train_loss = 0;
    double inner_seconds = 0;
    std::string data_root;
  };
  std::map<uint64_t, DeltaInfo> deltas;
  float last_train_loss = 0;
  StepScore last_score;  // of delta_round's steps, where the run scores (scoring.h)

  // Whether this host holds its Δ of `round`, computed on the root the round now builds on: a
  // Δ computed before this host's records of an earlier round were superseded is stale.
  bool HasDelta(uint64_t round) const {
    std::string data_root;
    {
      absl::MutexLock lock(&ctx.mu);
      absl::StatusOr<std::string> now = ctx.DataRoot(round);
      if (!now.ok()) return false;
      data_root = *std::move(now);
    }
    if (!ctx.spec.spec.overlap()) return delta_round == round && delta_data_root == data_root;
    auto it = deltas.find(round);
    return it != deltas.end() && it->second.data_root == data_root;
  }

  // H inner steps of `round` from the certified checkpoint, or from it minus this host's Δ in
  // `rebase_on` (the round in flight, with overlap).
  absl::Status InnerSteps(uint64_t round, const std::string& rebase_on = {}) {
    const pb::RunSpec& spec = ctx.spec.spec;
    std::string base;
    std::string data_root;
    {
      absl::MutexLock lock(&ctx.mu);
      base = ctx.certified_root;
      TS_ASSIGN_OR_RETURN(data_root, ctx.DataRoot(round));
      ctx.status.set_state("training");
      ctx.status.set_current_round(round);
    }
    TS_ASSIGN_OR_RETURN(ShardView view, ctx.View());
    pb::InnerStepsRequest request =
        InnerStepsRequestOf(ctx.spec, view, ctx.data.shard_files(), round,
                            DataSeedOf(spec.seed(), round, data_root), ctx.host.address, base);
    request.set_delta_file(DeltaName(round));
    request.set_rebase_delta_file(rebase_on);
    AddScoreRequest(ctx.spec, ctx.data.eval_file(), &request);
    if (spec.overlap()) {
      deltas.erase(round);  // rewritten now, over round - 2's
      deltas.erase(round - 2);
    }
    TS_ASSIGN_OR_RETURN(pb::InnerStepsResponse done,
                        ctx.worker->InnerSteps(request, InnerStepsTimeoutMs(spec)));
    delta_round = round;
    delta_data_root = data_root;
    last_train_loss = done.losses().empty() ? 0 : done.losses(done.losses_size() - 1);
    last_score = StepScoreOf(done);
    ctx.round_inner_seconds = done.seconds();
    if (spec.overlap()) deltas[round] = {last_train_loss, ctx.round_inner_seconds, data_root};
    absl::MutexLock lock(&ctx.mu);
    ctx.status.set_inner_seconds(ctx.status.inner_seconds() + done.seconds());
    return absl::OkStatus();
  }

  absl::Status ReloadBase() {
    const RunContext::Certified certified = ctx.CertifiedState();
    pb::LoadCheckpointRequest load;
    load.set_checkpoint_file(CheckpointName(certified.round));
    load.set_expected_root(certified.root);
    auto done = ctx.worker->LoadCheckpoint(load);
    ctx.loaded = done.ok();
    return done.status();
  }

  // The next round to certify, with the run's wall time brought up to date; first, unless
  // `watch_deadline` is false, the run may end early for the shard's deadline. Whether this
  // host can plan follows whether its worker holds the certified checkpoint.
  uint64_t NextRound(bool watch_deadline = true) {
    if (watch_deadline) ctx.WatchDeadline();
    absl::MutexLock lock(&ctx.mu);
    ctx.status.set_wall_seconds((ctx.host.clock->MonotonicMs() - ctx.start_ms) / 1000.0);
    // A run ended early for the deadline plans its settlement at once (SettleAndIdle).
    ctx.can_plan =
        ctx.certified_round < ctx.end_round ? ctx.loaded : ctx.end_round < ctx.spec.spec.rounds();
    return ctx.certified_round + 1;
  }

  // Past the last round: the settlement, then idle until stopped. The last round's exchange
  // gathered the signatures when it was the spec's last (`exchanged`); otherwise (the run ended
  // early for the deadline), or when no settlement lands (no member gathered the signatures:
  // one died under their exchange), the members exchange them in attempts planned like a
  // round's (RoundPlan.settlement, the round after the certified one: a member behind catches
  // up on the way and settles the others' rounds).
  void SettleAndIdle(bool first_member, bool exchanged) {
    uint32_t min_attempt = 0;
    uint64_t attempt_round = 0;
    while (!ctx.stopping && !(exchanged && settlement.Settle(first_member))) {
      exchanged = true;
      const uint64_t round = ctx.CertifiedRound() + 1;
      if (attempt_round != round) {
        attempt_round = round;
        min_attempt = 0;
      }
      if (SupersedeLast(round - 1)) continue;
      {
        absl::MutexLock lock(&ctx.mu);
        ctx.can_plan = true;
      }
      std::optional<pb::RoundPlan> plan = PlanWithThisHost(round, min_attempt);
      if (!plan) continue;
      first_member = plan->members(0).address() == ctx.host.address;
      if (!SettlementAttempt(*plan)) min_attempt = plan->attempt() + 1;
    }
    if (!ctx.stopping) SupersedeLast(ctx.CertifiedRound());
    while (!ctx.stopping) ctx.Sleep(200);
  }

  // Whether the run is past its last round (the spec's, or the deadline's); then it settles.
  bool PastTheEnd(uint64_t round, bool first_member) {
    if (round <= ctx.EndRound()) return false;
    SettleAndIdle(first_member, /*exchanged=*/round > ctx.spec.spec.rounds());
    return true;
  }

  // Whether a member holds a later attempt's certificate of the last round than this host's
  // (this host certified an attempt the others abandoned); if so it is adopted.
  bool SupersedeLast(uint64_t last) {
    auto view = ctx.View();
    if (!view.ok()) return false;
    for (const ShardMember& m : view->members) {
      if (m.address != ctx.host.address && catch_up.Supersede(m.address, last)) return true;
    }
    return false;
  }

  // The members of `plan` meet and exchange their settlement signatures; whether this host
  // gathered them.
  bool SettlementAttempt(const pb::RoundPlan& plan) {
    absl::StatusOr<RoundExchange::Reduced> met = exchange.Connect(plan);
    if (!met.ok()) {
      ctx.Transition(
          absl::StrCat("settlement attempt ", plan.attempt(), ": ", met.status().message()));
      return false;
    }
    AbortOnStop guard(&ctx, met->mesh.get());
    return settlement.Exchange(met->collective.get(), met->group, met->deadline, plan.round() - 1);
  }

  // One attempt of `plan` with this host's Δ; false when the run must end.
  bool Attempt(const pb::RoundPlan& plan, float train_loss, double inner_seconds,
               uint32_t* min_attempt) {
    absl::StatusOr<RoundExchange::Reduced> reduced = exchange.Reduce(plan, last_score);
    absl::Status done = reduced.status();
    if (reduced.ok()) done = exchange.Finish(*reduced, train_loss, inner_seconds);
    if (done.ok()) return true;
    *min_attempt = plan.attempt() + 1;
    return AttemptFailed(plan, done);
  }

  void Loop() {
    ctx.start_ms = ctx.host.clock->MonotonicMs();
    ctx.SetState("preparing");
    if (absl::Status prepared = preparation.Prepare(); !prepared.ok()) {
      ctx.Fail(prepared);
      return;
    }
    catch_up.CatchUpFromAnyone();
    if (ctx.spec.spec.overlap()) {
      LoopOverlapped();
      return;
    }
    uint32_t min_attempt = 0;
    uint64_t attempt_round = 0;
    bool first_member = false;
    while (!ctx.stopping) {
      const uint64_t round = NextRound();
      if (PastTheEnd(round, first_member)) return;
      if (absl::Status excluded = ctx.CheckNotExcluded(); !excluded.ok()) {
        ctx.Fail(excluded);
        return;
      }
      if (!ctx.loaded) {
        if (!Reload()) return;
        continue;
      }
      if (attempt_round != round) {
        attempt_round = round;
        min_attempt = 0;
      }
      if (!HasDelta(round)) {
        absl::Status s;
        {
          // The first planners in order hear that this host is on its way while it trains.
          std::jthread told = planning.PreAnnounce(round, min_attempt);
          s = InnerSteps(round);
        }
        if (!s.ok()) {
          if (!InnerStepsFailed(round, s)) return;
          continue;
        }
      }
      std::optional<pb::RoundPlan> plan = PlanWithThisHost(round, min_attempt);
      if (!plan) continue;
      ctx.SetState("training");
      first_member = plan->members(0).address() == ctx.host.address;
      if (!Attempt(*plan, last_train_loss, ctx.round_inner_seconds, &min_attempt)) return;
    }
  }

  // The certified checkpoint back into the worker: caught up from anyone; a worker that died
  // meanwhile is started again; a short wait when neither helped. False when the run must end.
  bool Reload() {
    catch_up.CatchUpFromAnyone();
    if (ctx.loaded) return true;
    if (!ctx.worker->Running()) {
      return RestartWorker(absl::UnavailableError("the worker died while the run caught up"));
    }
    ctx.Sleep(500);
    return true;
  }

  // After inner steps that failed: a worker that died is started again, a data shard it
  // refused (missing, corrupt) is built again. False when the run must end.
  bool InnerStepsFailed(uint64_t round, const absl::Status& s) {
    if (!ctx.worker->Running()) return RestartWorker(s);
    ctx.Transition(absl::StrCat("round ", round, ": inner steps failed: ", s.message(),
                                "; preparing the data again"));
    if (absl::Status again = preparation.PrepareData(); !again.ok()) {
      ctx.Transition(absl::StrCat("preparing the data: ", again.message()));
    }
    ctx.Sleep(1000);
    return true;
  }

  // Drops this host's Δs when the certified round moved while it was in scope (by catching up:
  // they were computed from a start the others are past).
  class CertifiedMoves {
   public:
    explicit CertifiedMoves(Impl* run) : run_(run), before_(run->ctx.CertifiedRound()) {}
    ~CertifiedMoves() {
      if (run_->ctx.CertifiedRound() != before_) run_->deltas.clear();
    }

   private:
    Impl* run_;
    uint64_t before_;
  };

  // The plan of `round` when this host is in it. Otherwise (no plan yet, this host behind or
  // left out) nullopt after catching up or waiting a little; the caller goes round again.
  std::optional<pb::RoundPlan> PlanWithThisHost(uint64_t round, uint32_t min_attempt) {
    bool settling = false;
    {
      absl::MutexLock lock(&ctx.mu);
      settling = ctx.Settling(round);
    }
    // A member that settles is as ready as one that holds its Δ: it joins a later attempt.
    auto outcome = planning.Obtain(round, min_attempt, settling || HasDelta(round));
    if (!outcome.ok()) {
      if (!ctx.stopping) {
        ctx.Transition(absl::StrCat("round ", round, ": ", outcome.status().message()));
      }
      ctx.Sleep(500);
      return std::nullopt;
    }
    if (!outcome->behind_peer.empty()) {
      CertifiedMoves moves(this);
      if (absl::Status s = catch_up.CatchUp(outcome->behind_peer); !s.ok()) {
        ctx.Transition(
            absl::StrCat("catching up from ", Short(outcome->behind_peer), ": ", s.message()));
        ctx.Sleep(500);
      }
      return std::nullopt;
    }
    if (!outcome->plan) return std::nullopt;  // certified meanwhile
    const pb::RoundPlan& plan = *outcome->plan;
    bool in_plan = false;
    for (const auto& m : plan.members()) in_plan |= m.address() == ctx.host.address;
    if (in_plan) return plan;
    ctx.Transition(absl::StrCat("round ", round, " attempt ", plan.attempt(),
                                " planned without this host; waiting for its certificate"));
    // Polls the planner for the round's certificate, so that the next round finds this host
    // ready in time; back to planning after a second in case the attempt fails.
    CertifiedMoves moves(this);
    for (int i = 0; i < 5 && !ctx.stopping; ++i) {
      ctx.Sleep(200);
      catch_up.CatchUp(plan.planner()).IgnoreError();
      if (ctx.CertifiedRound() >= round) break;
    }
    return std::nullopt;
  }

  // After an attempt of `plan` that failed: back to the certified checkpoint, the worker
  // started again if it died. False when the run must end.
  bool AttemptFailed(const pb::RoundPlan& plan, const absl::Status& exchanged) {
    std::string who = FailedPeerOf(exchanged);
    ctx.Transition(absl::StrCat("round ", plan.round(), " attempt ", plan.attempt(), " failed",
                                who.empty() ? "" : absl::StrCat(" (", Short(who), ")"), ": ",
                                exchanged.message(), "; retrying with the members that answer"));
    if (!ctx.loaded) {
      if (absl::Status reloaded = ReloadBase(); !reloaded.ok()) {
        ctx.Transition(absl::StrCat("reloading the certified checkpoint: ", reloaded.message()));
      }
    }
    return ctx.worker->Running() || RestartWorker(exchanged);
  }

  // ---- the run with overlap (docs/training.md "Overlap")

  // This host's Δ of a round in flight: its plan, its allreduce running on a thread of its own,
  // and what the inner steps reported.
  struct InFlight {
    pb::RoundPlan plan;
    DeltaInfo info;
    std::future<absl::StatusOr<RoundExchange::Reduced>> reduced;
  };

  // Round r's allreduce runs while the worker computes round r + 1's inner steps from the
  // certified checkpoint minus this host's Δ of round r; then round r's outer step, signatures
  // and certificate, round r + 1's plan and its allreduce in the background, and so on. A
  // failed attempt is retried with the members that answer, as without overlap; the last
  // round is exchanged without anything to overlap.
  void LoopOverlapped() {
    std::optional<InFlight> flight;
    uint32_t min_attempt = 0;
    uint64_t attempt_round = 0;
    bool first_member = false;
    while (!ctx.stopping) {
      // Not while a round is in flight: its members wait for this host's part.
      const uint64_t next = NextRound(/*watch_deadline=*/!flight);
      if (PastTheEnd(next, first_member)) return;
      if (!flight && !ctx.loaded) {
        deltas.clear();
        if (!Reload()) return;
        continue;
      }
      if (attempt_round != next) {
        attempt_round = next;
        min_attempt = 0;
      }
      const uint64_t inner_round = flight ? next + 1 : next;
      const uint64_t end = ctx.EndRound();
      if (inner_round <= end && !deltas.contains(inner_round)) {
        absl::Status s;
        {
          std::jthread told = planning.PreAnnounce(inner_round, min_attempt);
          s = InnerSteps(inner_round, flight ? DeltaName(next) : std::string());
        }
        if (!s.ok()) {
          flight.reset();  // waits for its allreduce (bounded by the exchange deadline)
          deltas.clear();
          if (!InnerStepsFailed(inner_round, s)) return;
          continue;
        }
      }
      if (flight) {
        if (!Land(&flight, &min_attempt)) return;
        continue;
      }
      auto info = deltas.find(next);
      if (info == deltas.end()) continue;
      std::optional<pb::RoundPlan> plan = PlanWithThisHost(next, min_attempt);
      if (!plan) continue;
      ctx.SetState("training");
      first_member = plan->members(0).address() == ctx.host.address;
      if (next < end) {
        flight = InFlight{.plan = *plan, .info = info->second, .reduced = {}};
        flight->reduced =
            std::async(std::launch::async, [this, p = *plan] { return exchange.Reduce(p); });
        continue;
      }
      const DeltaInfo last = info->second;
      if (!Attempt(*plan, last.train_loss, last.inner_seconds, &min_attempt)) return;
    }
  }

  // The round in flight: its allreduce's result, then the rest of its exchange. False when the
  // run must end.
  bool Land(std::optional<InFlight>* flight, uint32_t* min_attempt) {
    InFlight f = std::move(**flight);
    flight->reset();
    absl::StatusOr<RoundExchange::Reduced> reduced = f.reduced.get();
    absl::Status done = reduced.status();
    if (reduced.ok()) done = exchange.Finish(*reduced, f.info.train_loss, f.info.inner_seconds);
    if (done.ok()) return true;
    *min_attempt = f.plan.attempt() + 1;
    return AttemptFailed(f.plan, done);
  }

  // A worker that died is started again from the records (certified checkpoint, data), at most
  // kWorkerRestartsMax times; then the run fails, and `shard run` or a daemon restart resumes it.
  bool RestartWorker(const absl::Status& why) {
    if (ctx.stopping) return false;
    ctx.ShareEvalTarget(false);
    std::string how = ctx.worker->Stop().ToString();
    if (++worker_restarts > kWorkerRestartsMax) {
      ctx.Fail(absl::UnavailableError(absl::StrCat(
          "the worker died ", worker_restarts, " times; last: ", why.message(), " (", how, ")")));
      return false;
    }
    ctx.Transition(absl::StrCat("the worker died (", how, "); starting it again"));
    {
      absl::MutexLock lock(&ctx.mu);
      ctx.status.set_worker_restarts(worker_restarts);
    }
    ctx.worker.reset();
    delta_round = 0;
    deltas.clear();
    ctx.loaded = false;
    if (absl::Status again = preparation.Prepare(); !again.ok()) {
      ctx.Fail(again);
      return false;
    }
    return true;
  }
};

std::unique_ptr<ShardRun> ShardRun::Start(const ShardRunHost& host, const ShardRunOptions& options,
                                          uint64_t shard_id, ParsedRunSpec spec) {
  auto impl = std::make_unique<Impl>(host, options, shard_id, spec);
  {
    absl::MutexLock lock(&impl->ctx.mu);
    impl->ctx.status.set_shard_id(shard_id);
    impl->ctx.status.set_state("starting");
    impl->ctx.status.set_rounds_total(spec.spec.rounds());
  }
  std::unique_ptr<ShardRun> run(new ShardRun(std::move(impl)));
  run->spec_ = std::move(spec);
  Impl* raw = run->impl_.get();
  raw->thread = std::thread([raw] { raw->Loop(); });
  return run;
}

ShardRun::ShardRun(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardRun::~ShardRun() { Stop(); }

void ShardRun::Stop() {
  RequestStop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->ctx.ShareEvalTarget(false);
  impl_->ctx.worker.reset();
}

void ShardRun::RequestStop() {
  if (impl_->ctx.stopping.exchange(true)) return;
  // A model call in progress ends with the worker, an exchange with its meshes (a mesh still
  // connecting with the transport's StopConnecting); the thread then sees `stopping`.
  if (pid_t pid = impl_->ctx.worker_pid.load(); pid > 0) ::kill(pid, SIGTERM);
  {
    absl::MutexLock lock(&impl_->ctx.mu);
    for (Mesh* mesh : impl_->ctx.meshes) mesh->Abort(impl_->ctx.Stopping());
    if (impl_->ctx.stop_transport != nullptr)
      impl_->ctx.stop_transport->StopConnecting(impl_->ctx.Stopping());
  }
}

pb::ShardRunStatus ShardRun::Status() const {
  absl::MutexLock lock(&impl_->ctx.mu);
  pb::ShardRunStatus s = impl_->ctx.status;
  if (impl_->ctx.start_ms > 0 && s.state() != "done") {
    s.set_wall_seconds((impl_->ctx.host.clock->MonotonicMs() - impl_->ctx.start_ms) / 1000.0);
  }
  return s;
}

pb::AnnounceResponse ShardRun::OnAnnounce(const std::string& signer,
                                          const pb::AnnounceRequest& request) {
  RunContext& m = impl_->ctx;
  pb::AnnounceResponse response;
  absl::MutexLock lock(&m.mu);
  response.set_certified_round(m.certified_round);
  if (request.round() <= m.certified_round) return response;
  if (request.round() > m.certified_round + 1) {
    response.set_note(absl::StrCat("this host is at round ", m.certified_round + 1));
    // With overlap, a member in the exchange of round c + 1 prepares round c + 2: expected,
    // not a sign that this host is behind.
    const bool overlapping =
        m.spec.spec.overlap() && request.preparing() && request.round() == m.certified_round + 2;
    if (!overlapping) m.ahead_peer = signer;
    return response;
  }
  if (auto tally = m.Tally(); tally.ok() && (*tally)->Excluded(signer)) {
    response.set_note("the caller is excluded from the run (docs/verification.md \"Verdicts\")");
    return response;
  }
  // A caller that settles where this host trains, or the other way round, is not counted.
  response.set_settling(m.Settling(request.round()));
  if (request.settling() != response.settling()) {
    response.set_note(response.settling() ? "this host settles the rounds before this one"
                                          : "this host trains this round");
    return response;
  }
  m.rendezvous.Enter(request.round(), request.min_attempt());
  m.rendezvous.Announce(signer,
                        {.endpoint = request.collective_endpoint(),
                         .min_attempt = request.min_attempt(),
                         .at_ms = m.host.clock->MonotonicMs(),
                         .preparing = request.preparing(),
                         .worker_threads = request.worker_threads(),
                         .verdicts = {request.verdicts().begin(), request.verdicts().end()}});
  response.set_attempt(m.rendezvous.attempt());
  if (const pb::RoundPlan* made = m.rendezvous.PlanFor(request.min_attempt()); made != nullptr) {
    *response.mutable_plan() = *made;
  } else if (!m.can_plan) {
    response.set_cannot_plan(true);
    response.set_note("this host cannot plan now (preparing, catching up or settling)");
  } else {
    response.set_note("no plan yet");
  }
  return response;
}

absl::StatusOr<pb::GetCertificatesResponse> ShardRun::OnGetCertificates(
    const pb::GetCertificatesRequest& request) const {
  if (request.max() < 1 || request.max() > kCertificatesPerCallMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("max: ", request.max(), " is outside 1..", kCertificatesPerCallMax));
  }
  pb::GetCertificatesResponse response;
  TS_ASSIGN_OR_RETURN(
      std::vector<pb::RoundCertificate> certs,
      impl_->ctx.LoadCertificates(std::max<uint64_t>(1, request.from_round()), request.max()));
  for (auto& c : certs) *response.add_certificates() = std::move(c);
  absl::MutexLock lock(&impl_->ctx.mu);
  response.set_certified_round(impl_->ctx.certified_round);
  response.set_checkpoint_artifact_id(impl_->ctx.checkpoint_artifact);
  return response;
}

absl::StatusOr<pb::SignedEvaluation> ShardRun::EvaluateArtifact(const std::string& artifact_id,
                                                                uint64_t windows_max) {
  RunContext& m = impl_->ctx;
  // The artifact first (the host's store serves any thread), then what the run shares.
  TS_ASSIGN_OR_RETURN(std::vector<pb::ArtifactSummary> held, m.host.artifacts->List(m.shard_id));
  auto summary = std::find_if(held.begin(), held.end(), [&](const pb::ArtifactSummary& a) {
    return a.artifact_id() == artifact_id;
  });
  if (summary == held.end()) {
    return absl::NotFoundError(absl::StrCat("artifact ", common::HexEncode(artifact_id),
                                            " is not complete in this host's store of shard ",
                                            m.shard_id));
  }
  std::optional<RunContext::EvalTarget> target;
  {
    absl::MutexLock lock(&m.mu);
    target = m.eval_target;
  }
  if (m.stopping) return absl::UnavailableError("the run is stopping");
  if (!target.has_value()) {
    return absl::UnavailableError("the run has not prepared its worker and data yet");
  }
  const std::string name = absl::StrCat("eval/", common::HexEncode(artifact_id));
  const std::string dir = absl::StrCat(target->work_dir, "/", name);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  TS_RETURN_IF_ERROR(m.host.artifacts->Export(m.shard_id, artifact_id, dir));
  pb::EvaluateRequest er;
  er.set_checkpoint_file(absl::StrCat(name, "/", kCheckpointFile));
  er.set_eval_file(target->eval_file);
  er.set_batch_size(target->eval_batch_size);
  er.set_windows_max(windows_max);
  auto ev = target->worker->Evaluate(er);
  std::filesystem::remove_all(dir, ec);
  TS_RETURN_IF_ERROR(ev.status());
  pb::SignedEvaluation out;
  pb::EvaluationResult* e = out.mutable_result();
  e->set_shard_id(m.shard_id);
  e->set_round(summary->round());
  e->set_checkpoint_root(ev->root());
  e->set_eval_set_id(ev->eval_id());
  e->set_loss_micro(LossMicroOf(ev->mean_loss()));
  e->set_tokens(ev->tokens());
  e->set_host(m.host.address);
  TS_ASSIGN_OR_RETURN(std::string sig, SignEvaluation(*m.host.key, m.host.chain_id, *e));
  out.set_signature(sig);
  return out;
}

}  // namespace ts::sidecar
