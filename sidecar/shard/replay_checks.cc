#include "sidecar/shard/replay_checks.h"

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sidecar/collective/aggregate.h"
#include "sidecar/collective/codec.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/run_spec.h"
#include "worker/client/work_dir.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr char kReplayDeltaFile[] = "replay.bin";

}  // namespace

void ReplayChecks::Run(const pb::RoundPlan& plan, const pb::RoundCertificate& certificate) {
  const pb::RoundResult& result = certificate.result();
  const uint32_t rate = run_.spec.spec.verification().replay_rate_bps();
  for (const ReplayDraw& draw : DrawReplays(result, rate)) {
    if (result.members(static_cast<int>(draw.validator)) != run_.host.address) continue;
    const std::string& member = result.contributions(static_cast<int>(draw.member)).host();
    const std::string what = absl::StrCat("replay of ", Short(member), "'s round ", result.round());
    absl::StatusOr<bool> reproduced = Replay(plan, result, draw.member);
    if (!reproduced.ok()) {
      run_.Transition(absl::StrCat(what, " not run: ", reproduced.status().message()));
      continue;
    }
    {
      absl::MutexLock lock(&run_.mu);
      run_.status.set_replays(run_.status.replays() + 1);
      if (*reproduced) run_.status.set_replays_passed(run_.status.replays_passed() + 1);
    }
    run_.Transition(*reproduced ? absl::StrCat(what, ": reproduced its commitment")
                                : absl::StrCat(what, ": FAILED, the replayed Δ does not match ",
                                               "the commitment it signed"));
  }
}

absl::StatusOr<bool> ReplayChecks::Replay(const pb::RoundPlan& plan, const pb::RoundResult& result,
                                          size_t member) {
  const pb::Contribution& c = result.contributions(static_cast<int>(member));
  const std::string base = CheckpointName(result.round() - 1);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(run_.work_dir + "/" + base, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the round's base checkpoint ", base, " is not held here"));
  }
  pb::InnerStepsRequest request =
      InnerStepsRequestOf(run_.spec, run_.data.shard_files(), result.round(), plan.data_seed(),
                          c.host(), plan.base_root());
  request.set_delta_file(kReplayDeltaFile);
  request.set_replay_checkpoint_file(base);
  request.set_replay_threads(c.worker_threads());
  TS_RETURN_IF_ERROR(
      run_.worker->InnerSteps(request, InnerStepsTimeoutMs(run_.spec.spec)).status());
  std::vector<float> delta(run_.parameters);
  TS_RETURN_IF_ERROR(worker::ReadWorkFileInto(
      run_.work_dir, "replay", kReplayDeltaFile,
      std::span<char>(reinterpret_cast<char*>(delta.data()), 4 * delta.size())));
  TS_ASSIGN_OR_RETURN(std::string commitment, DeltaCommitmentOf(run_.spec, member, delta));
  return commitment == c.delta_commitment();
}

}  // namespace ts::sidecar
