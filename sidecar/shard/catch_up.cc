#include "sidecar/shard/catch_up.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sidecar/shard/ledger.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

absl::Status RunCatchUp::CatchUp(const std::string& peer) {
  run_.SetState("catching_up");
  TS_ASSIGN_OR_RETURN(ShardView view, run_.View());
  const ShardMember* member = view.Find(peer);
  if (member == nullptr) return absl::NotFoundError(absl::StrCat(peer, " is not a member"));
  auto [have, root] = run_.CertifiedState();
  pb::GetCertificatesResponse response;
  bool superseded = false;
  while (true) {
    pb::GetCertificatesRequest request;
    request.set_shard_id(run_.shard_id);
    request.set_from_round(have + 1);
    request.set_max(kCertificatesPerCallMax);
    TS_RETURN_IF_ERROR(run_.Sign(&request, kGetCertificatesMethod, peer));
    TS_ASSIGN_OR_RETURN(response,
                        run_.peers->GetCertificates(member->endpoint, request, kRpcTimeoutMs));
    std::vector<pb::RoundCertificate> verified;
    bool again = false;
    for (const auto& c : response.certificates()) {
      if (c.result().round() == have + 1 && c.result().base_root() != root && !superseded &&
          have > 0 && Supersede(peer, have)) {
        // This host's round `have` was an abandoned attempt's: asked again from the
        // superseding certificate on.
        superseded = again = true;
        root = run_.CertifiedState().root;
        break;
      }
      if (c.result().round() != have + 1 || c.result().base_root() != root) {
        return absl::InvalidArgumentError(
            absl::StrCat(peer, ": certificate of round ", c.result().round(),
                         " does not continue round ", have, " (root ", Hex8(root), ")"));
      }
      TS_RETURN_IF_ERROR(VerifyCertificate(run_.host.chain_id, c, view));
      verified.push_back(c);
      have = c.result().round();
      root = c.result().new_root();
    }
    if (again) continue;
    TS_RETURN_IF_ERROR(run_.StoreCertificates(verified));
    for (const auto& c : verified) run_.RecordRound(c, 0, run_.round_inner_seconds);
    if (!verified.empty()) {
      run_.Transition(absl::StrCat("caught up from ", Short(peer), " to round ", have, " (",
                                   verified.size(), " certificates verified)"));
      run_.loaded = false;
    }
    if (verified.size() < kCertificatesPerCallMax) break;
  }
  if (run_.loaded) return absl::OkStatus();
  return FetchCheckpoint(response.checkpoint_artifact_id(), have, root, view);
}

absl::Status RunCatchUp::FetchCheckpoint(const std::string& artifact_id, uint64_t round,
                                         const std::string& root, const ShardView& view) {
  if (artifact_id.size() != 32) {
    return absl::UnavailableError(
        absl::StrCat("no member named an artifact holding the checkpoint of round ", round));
  }
  std::vector<std::string> peers;
  for (const ShardMember& m : view.members) {
    if (m.address != run_.host.address && !m.endpoint.empty()) peers.push_back(m.address);
  }
  const int64_t start = run_.host.clock->MonotonicMs();
  TS_ASSIGN_OR_RETURN(pb::ArtifactProgress progress,
                      run_.host.artifacts->Fetch(run_.shard_id, artifact_id, peers,
                                                 [this] { return run_.stopping.load(); }));
  run_.RemoveTree(CheckpointDir(round));
  TS_RETURN_IF_ERROR(
      run_.host.artifacts->Export(run_.shard_id, artifact_id, run_.Path(CheckpointDir(round))));
  pb::LoadCheckpointRequest load;
  load.set_checkpoint_file(CheckpointName(round));
  load.set_expected_root(root);
  TS_RETURN_IF_ERROR(run_.worker->LoadCheckpoint(load).status());
  run_.loaded = true;
  std::vector<std::string> sources;
  for (const auto& [peer, b] : progress.bytes_by_peer()) {
    sources.push_back(absl::StrCat(Short(peer), " ", b >> 10, " KiB"));
  }
  run_.Transition(absl::StrCat("checkpoint of round ", round, " fetched in ",
                               (run_.host.clock->MonotonicMs() - start) / 1000.0, " s (",
                               absl::StrJoin(sources, ", "), ") and loaded"));
  absl::MutexLock lock(&run_.mu);
  if (run_.certified_round == round) run_.checkpoint_artifact = artifact_id;
  return absl::OkStatus();
}

bool RunCatchUp::Supersede(const std::string& peer, uint64_t round) {
  auto view = run_.View();
  if (!view.ok()) return false;
  const ShardMember* member = view->Find(peer);
  if (member == nullptr) return false;
  pb::GetCertificatesRequest request;
  request.set_shard_id(run_.shard_id);
  request.set_from_round(round);
  request.set_max(1);
  if (!run_.Sign(&request, kGetCertificatesMethod, peer).ok()) return false;
  auto response = run_.peers->GetCertificates(member->endpoint, request, kRpcTimeoutMs);
  auto own = run_.LoadCertificates(round, 1);
  if (!response.ok() || response->certificates_size() == 0 || !own.ok() || own->empty()) {
    return false;
  }
  const pb::RoundCertificate& theirs = response->certificates(0);
  const pb::RoundCertificate& mine = own->front();
  if (theirs.result().round() != round || mine.result().round() != round ||
      theirs.result().new_root() == mine.result().new_root() ||
      theirs.attempt() <= mine.attempt() ||
      theirs.result().base_root() != mine.result().base_root() ||
      !VerifyCertificate(run_.host.chain_id, theirs, *view).ok()) {
    return false;
  }
  if (!run_.ReplaceCertificatesFrom(theirs).ok()) return false;
  run_.loaded = false;
  run_.Transition(absl::StrCat("round ", round, ": this host's certificate (attempt ",
                               mine.attempt(), ", root ", Hex8(mine.result().new_root()),
                               ") is superseded by attempt ", theirs.attempt(), "'s (root ",
                               Hex8(theirs.result().new_root()), ") from ", Short(peer)));
  return true;
}

void RunCatchUp::CatchUpFromAnyone() {
  auto view = run_.View();
  if (!view.ok()) return;
  for (const ShardMember& m : view->members) {
    if (m.address == run_.host.address || run_.stopping) continue;
    if (CatchUp(m.address).ok() && run_.loaded) return;
  }
}

}  // namespace ts::sidecar
