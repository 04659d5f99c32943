#include "sidecar/shard/run_context.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/hex.h"
#include "common/log.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr char kComponent[] = "shard_run";
constexpr size_t kRoundsKept = 256;
// WatchDeadline: how often it reads the chain, and the time it keeps for the settlement after
// the last round (an attempt's plan and exchange, the submission, a block or two to land).
constexpr int64_t kChainReadIntervalMs = 1000;
constexpr int64_t kSettlementReserveMs = 30'000;

std::string RoundKey(uint64_t shard_id, uint64_t round) {
  return state::EncodeU64Key(shard_id) + state::EncodeU64Key(round);
}

}  // namespace

std::string CheckpointDir(uint64_t round) { return absl::StrCat("ckpt/r", round); }
std::string CheckpointName(uint64_t round) {
  return absl::StrCat(CheckpointDir(round), "/", kCheckpointFile);
}
std::string DeltaName(uint64_t round) { return absl::StrCat("delta-", round % 2, ".bin"); }

std::string Hex8(std::string_view bytes) { return common::HexEncode(bytes).substr(0, 16); }
int64_t LossMicroOf(double mean_loss) {
  return static_cast<int64_t>(std::llround(mean_loss * 1e6));
}

std::string Short(const std::string& address) {
  return address.size() > 14 ? address.substr(0, 14) + "…" : address;
}

absl::StatusOr<std::vector<pb::RoundCertificate>> LoadStoredCertificates(const state::Db& db,
                                                                         uint64_t shard_id,
                                                                         uint64_t from,
                                                                         uint32_t max) {
  std::vector<pb::RoundCertificate> out;
  absl::Status parse = absl::OkStatus();
  TS_RETURN_IF_ERROR(
      db.ScanFrom(kTableRounds, state::EncodeU64Key(shard_id), RoundKey(shard_id, from),
                  [&](std::string_view, std::string_view value) {
                    pb::RoundCertificate c;
                    if (!c.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
                      parse = absl::DataLossError("a stored round certificate does not parse");
                      return false;
                    }
                    out.push_back(std::move(c));
                    return out.size() < max;
                  }));
  TS_RETURN_IF_ERROR(parse);
  return out;
}

RunContext::RunContext(const ShardRunHost& h, const ShardRunOptions& o, uint64_t id,
                       ParsedRunSpec s, std::unique_ptr<RoundPeers> p)
    : host(h), options(o), shard_id(id), spec(std::move(s)), peers(std::move(p)) {
  absl::MutexLock lock(&mu);
  end_round = spec.spec.rounds();
}

bool RunContext::ShardClosed() {
  const int64_t now = host.clock->MonotonicMs();
  ChainPace& pace = chain_pace;
  if (pace.closed ||
      (pace.status_read_ms >= 0 && now - pace.status_read_ms < kChainReadIntervalMs)) {
    return pace.closed;
  }
  pace.status_read_ms = now;
  absl::StatusOr<pb::Shard> shard = host.chain_shard(shard_id);
  pace.closed = shard.ok() && shard->status() != pb::SHARD_STATUS_RUNNING;
  return pace.closed;
}

void RunContext::WatchDeadline() {
  const int64_t now = host.clock->MonotonicMs();
  ChainPace& pace = chain_pace;
  if (!host.chain_height || (pace.tried_ms >= 0 && now - pace.tried_ms < kChainReadIntervalMs)) {
    return;
  }
  {
    absl::MutexLock lock(&mu);
    if (end_round <= certified_round) return;
  }
  pace.tried_ms = now;  // a chain that does not answer is asked again a second later
  absl::StatusOr<int64_t> height = host.chain_height();
  if (!height.ok()) return;
  if (pace.deadline_height == 0) {
    absl::StatusOr<pb::Shard> shard = host.chain_shard(shard_id);
    if (!shard.ok()) return;
    pace.deadline_height = shard->deadline_height();
  }
  if (pace.deadline_height <= 0) return;  // none set
  if (pace.read_ms < 0) {
    pace.first_height = *height;
    pace.first_ms = now;
  }
  pace.height = *height;
  pace.read_ms = now;
  const int64_t blocks_left = pace.deadline_height - pace.height;
  const int64_t blocks_seen = pace.height - pace.first_height;
  // Before two blocks were seen the pace is unknown: only the last blocks count as near.
  const int64_t ms_per_block = blocks_seen >= 2 ? (now - pace.first_ms) / blocks_seen : 0;
  const int64_t need_ms =
      static_cast<int64_t>(std::max(last_round_seconds, round_inner_seconds) * 1000.0) +
      spec.spec.join_window_ms() + kSettlementReserveMs;
  const bool near = ms_per_block > 0 ? blocks_left * ms_per_block < need_ms : blocks_left <= 2;
  if (!near) return;
  uint64_t ends_at = 0;
  {
    absl::MutexLock lock(&mu);
    if (certified_round == 0) return;  // nothing to settle: the shard expires if it must
    end_round = certified_round;
    ends_at = end_round;
    // The announces to train the next round heard here, and any plan made of them, are
    // dropped: the settlement is a later attempt, of the members that settle.
    if (rendezvous.round() == certified_round + 1) {
      rendezvous.Enter(rendezvous.round(), rendezvous.attempt() + 1);
    }
  }
  Transition(absl::StrCat("the shard's deadline (height ", pace.deadline_height, ") is ",
                          blocks_left, " blocks away, about ", blocks_left * ms_per_block / 1000,
                          " s: too near for another round and the settlement (", need_ms / 1000,
                          " s); the run settles its ", ends_at, " certified rounds"));
}

void RunContext::ShareEvalTarget(bool ready) {
  absl::MutexLock lock(&mu);
  if (!ready) {
    eval_target.reset();
    return;
  }
  eval_target = EvalTarget{.worker = worker,
                           .eval_file = data.eval_file(),
                           .work_dir = work_dir,
                           .eval_batch_size = spec.spec.eval_batch_size()};
}

void RunContext::Transition(const std::string& what) {
  common::Log(common::LogLevel::kInfo, kComponent, what, {{"shard", absl::StrCat(shard_id)}});
  absl::MutexLock lock(&mu);
  status.add_transitions(
      absl::StrCat(absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()), " ", what));
  if (static_cast<size_t>(status.transitions_size()) > kTransitionsKept) {
    status.mutable_transitions()->DeleteSubrange(0, 1);
  }
}

void RunContext::SetState(const std::string& state) {
  absl::MutexLock lock(&mu);
  status.set_state(state);
}

void RunContext::Fail(const absl::Status& error) {
  common::Log(common::LogLevel::kError, kComponent, "run failed",
              {{"shard", absl::StrCat(shard_id)}, {"error", std::string(error.message())}});
  absl::MutexLock lock(&mu);
  status.set_state("failed");
  status.set_error(std::string(error.message()));
}

bool RunContext::Sleep(int64_t ms) {
  int64_t until = host.clock->MonotonicMs() + ms;
  while (!stopping && host.clock->MonotonicMs() < until) {
    host.clock->SleepMs(std::min<int64_t>(50, until - host.clock->MonotonicMs()));
  }
  return !stopping;
}

uint64_t RunContext::CertifiedRound() const {
  absl::MutexLock lock(&mu);
  return certified_round;
}

RunContext::Certified RunContext::CertifiedState() const {
  absl::MutexLock lock(&mu);
  return {.round = certified_round, .root = certified_root};
}

absl::StatusOr<std::string> RunContext::DataRoot(uint64_t round) const {
  const uint64_t lag = spec.spec.overlap() ? 2 : 1;
  const uint64_t from = round > lag ? round - lag : 0;
  if (certified_round == from) return certified_root;
  if (certified_round == from + 1) return certified_base_root;
  return absl::FailedPreconditionError(absl::StrCat("round ", round,
                                                    ": its data seed needs the root of round ",
                                                    from, ", certified is ", certified_round));
}

absl::Status RunContext::Stopping() const {
  return PeerFailure(absl::StatusCode::kCancelled, host.address, "its run is stopping");
}

void RunContext::RemoveTree(const std::string& name) const {
  std::error_code ec;
  std::filesystem::remove_all(Path(name), ec);
}

absl::Status RunContext::MakeDir(const std::string& name) const {
  std::error_code ec;
  std::filesystem::create_directories(Path(name), ec);
  if (ec) return absl::InternalError(absl::StrCat(Path(name), ": ", ec.message()));
  return absl::OkStatus();
}

void RunContext::RecordRound(const pb::RoundCertificate& c, double round_seconds,
                             double inner_seconds, double exchange_seconds,
                             double certify_seconds) {
  absl::MutexLock lock(&mu);
  pb::RoundSummary* s = status.add_rounds();
  s->set_round(c.result().round());
  s->set_attempt(c.attempt());
  for (const auto& m : c.result().members()) s->add_members(m);
  s->set_new_root(c.result().new_root());
  s->set_train_loss(c.train_loss());
  s->set_eval_loss_micro(c.eval_loss_micro());
  s->set_bytes_exchanged(c.bytes_exchanged());
  s->set_signed_weight(c.signed_weight());
  s->set_inner_seconds(inner_seconds);
  s->set_round_seconds(round_seconds);
  s->set_exchange_seconds(exchange_seconds);
  s->set_certify_seconds(certify_seconds);
  if (static_cast<size_t>(status.rounds_size()) > kRoundsKept) {
    status.mutable_rounds()->DeleteSubrange(0, 1);
  }
  status.set_bytes_exchanged(status.bytes_exchanged() + c.bytes_exchanged());
}

absl::Status RunContext::StoreCertificates(const std::vector<pb::RoundCertificate>& certs) {
  if (certs.empty()) return absl::OkStatus();
  state::WriteBatch batch;
  for (const auto& c : certs) {
    batch.PutProto(kTableRounds, RoundKey(shard_id, c.result().round()), c);
  }
  TS_RETURN_IF_ERROR(host.db->Write(batch));
  AdoptCertified(certs.back());
  absl::MutexLock lock(&mu);
  for (const auto& c : certs) {
    if (tally && tally->last_round() + 1 == c.result().round()) {
      tally->Add(c.result());
    } else {
      tally.reset();  // read again from the records when next needed
    }
  }
  // Verdicts now carried by a certificate, or too old to be, are no longer announced.
  std::vector<pb::SignedVerdict> kept;
  for (pb::SignedVerdict& s : pending_verdicts) {
    const pb::Verdict& v = s.verdict();
    if (v.round() + kVerdictRounds <= certified_round) continue;
    if (tally && tally->Has(v.round(), v.member(), v.validator())) continue;
    kept.push_back(std::move(s));
  }
  pending_verdicts = std::move(kept);
  return absl::OkStatus();
}

absl::Status RunContext::ReplaceCertificatesFrom(const pb::RoundCertificate& c) {
  const uint64_t round = c.result().round();
  state::WriteBatch batch;
  for (uint64_t r = round + 1; r <= CertifiedRound(); ++r) {
    batch.Delete(kTableRounds, RoundKey(shard_id, r));
  }
  batch.PutProto(kTableRounds, RoundKey(shard_id, round), c);
  TS_RETURN_IF_ERROR(host.db->Write(batch));
  AdoptCertified(c);
  absl::MutexLock lock(&mu);
  tally.reset();
  return absl::OkStatus();
}

absl::Status RunContext::CheckNotExcluded() {
  absl::MutexLock lock(&mu);
  TS_ASSIGN_OR_RETURN(const VerdictTally* t, Tally());
  if (!t->Excluded(host.address)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this host is excluded from the run: ", t->Marks(host.address),
      " marks (failures of its work confirmed, or verdicts of its own overruled, by more than "
      "2/3 of the others' weight; docs/verification.md \"Verdicts\")"));
}

absl::StatusOr<const VerdictTally*> RunContext::Tally() {
  if (tally) return &*tally;
  TS_ASSIGN_OR_RETURN(ShardView view, View());
  VerdictTally read(view, spec.spec.verification());
  constexpr uint32_t kBatch = 256;
  for (uint64_t from = 1; from <= certified_round; from += kBatch) {
    TS_ASSIGN_OR_RETURN(std::vector<pb::RoundCertificate> certs, LoadCertificates(from, kBatch));
    for (const pb::RoundCertificate& c : certs) {
      if (c.result().round() <= certified_round) read.Add(c.result());
    }
    if (certs.size() < kBatch) break;
  }
  tally.emplace(std::move(read));
  return &*tally;
}

void RunContext::AdoptCertified(const pb::RoundCertificate& last) {
  absl::MutexLock lock(&mu);
  certified_round = last.result().round();
  certified_root = last.result().new_root();
  certified_base_root = last.result().base_root();
  status.set_certified_round(certified_round);
  status.set_root(certified_root);
  checkpoint_artifact.clear();
}

AbortOnStop::AbortOnStop(RunContext* run, Mesh* mesh) : run_(run), mesh_(mesh) {
  absl::MutexLock lock(&run_->mu);
  run_->meshes.insert(mesh_);
  if (run_->stopping) mesh_->Abort(run_->Stopping());
}

AbortOnStop::~AbortOnStop() {
  absl::MutexLock lock(&run_->mu);
  run_->meshes.erase(mesh_);
}

pb::EvaluateRequest RunContext::EvaluateRequestOf() const {
  pb::EvaluateRequest request;
  request.set_eval_file(data.eval_file());
  request.set_batch_size(spec.spec.eval_batch_size());
  request.set_windows_max(spec.spec.eval_windows_max());
  return request;
}

}  // namespace ts::sidecar
