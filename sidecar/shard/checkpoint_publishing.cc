#include "sidecar/shard/checkpoint_publishing.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ts::sidecar {
namespace {

constexpr size_t kArtifactIdBytes = 32;

void DropOldCheckpoints(RunContext& run, const std::string& keep) {
  auto list = run.host.artifacts->List(run.shard_id);
  if (!list.ok()) return;
  std::vector<std::string> drop;
  for (const auto& a : *list) {
    if (a.kind() == "checkpoint" && a.artifact_id() != keep) drop.push_back(a.artifact_id());
  }
  if (!drop.empty()) (void)run.host.artifacts->Drop(run.shard_id, drop);
}

// The run's tokenizer into the checkpoint's folder, so it travels in the artifact.
void AddTokenizer(RunContext& run, uint64_t round) {
  if (run.data.tokenizer_file().empty()) return;
  std::error_code ec;
  std::filesystem::copy_file(run.Path(run.data.tokenizer_file()),
                             run.Path(absl::StrCat(CheckpointDir(round), "/", kTokenizerFile)),
                             std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) {
    run.Transition(
        absl::StrCat("round ", round, ": tokenizer not added to the checkpoint: ", ec.message()));
  }
}

// Names `id` as the holder of the certified checkpoint when `round` is still the certified one.
void Adopt(RunContext& run, uint64_t round, const std::string& id) {
  absl::MutexLock lock(&run.mu);
  if (run.certified_round == round) run.checkpoint_artifact = id;
  run.status.set_final_checkpoint_artifact_id(id);
}

}  // namespace

void RepublishCheckpoint(RunContext& run, uint64_t round) {
  if (auto list = run.host.artifacts->List(run.shard_id); list.ok()) {
    for (const auto& a : *list) {
      if (a.kind() == "checkpoint" && a.round() == round) return Adopt(run, round, a.artifact_id());
    }
  }
  AddTokenizer(run, round);
  auto published = run.host.artifacts->Publish(run.shard_id, run.Path(CheckpointDir(round)),
                                               "checkpoint", round);
  if (!published.ok()) {
    run.Transition(absl::StrCat(
        "round ", round, ": checkpoint not published again: ", published.status().message()));
    return;
  }
  Adopt(run, round, *published);
}

void PublishCheckpoint(RunContext& run, uint64_t round, Collective* collective,
                       const GroupSpec& group, size_t self, int64_t deadline) {
  AddTokenizer(run, round);
  auto published = run.host.artifacts->Publish(run.shard_id, run.Path(CheckpointDir(round)),
                                               "checkpoint", round);
  if (!published.ok()) {
    run.Transition(absl::StrCat("round ", round,
                                ": checkpoint not published: ", published.status().message()));
    return;
  }
  std::string mine = *published;
  std::string gathered(kArtifactIdBytes * group.members.size(), '\0');
  OpOptions op;
  op.op_id = 3;
  op.deadline_ms = deadline;
  std::string adopted = mine;
  if (collective->AllGather(op, mine, gathered).ok() && self != 0) {
    std::string first = gathered.substr(0, kArtifactIdBytes);
    if (run.host.artifacts
            ->Fetch(run.shard_id, first, {group.members[0].address},
                    [&run] { return run.stopping.load(); })
            .ok()) {
      adopted = first;
      (void)run.host.artifacts->Drop(run.shard_id, {mine});
    }
  }
  Adopt(run, round, adopted);
  DropOldCheckpoints(run, adopted);
}

}  // namespace ts::sidecar
