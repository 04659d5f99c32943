// ts_worker_shard_bench: a DiLoCo shard of K real ts_worker processes on one machine (one GPU
// shared by all of them, or the CPU), driven through the worker protocol as a shard process
// drives its worker: InitModel on the first, LoadCheckpoint on the others, then per round
// InnerSteps on every worker at once, the mean of their Δ files (computed here in fp32, a chunk
// at a time), OuterStep on every worker, and their roots compared. The data are learnable
// pattern shards written here (no corpus needed on a GPU machine).
//
// Prints per round the mean train loss, the inner time and the round's wall time; at the end the
// eval loss before and after, whether every round ended on one root, and the share of the wall
// time spent in inner steps (the target on a GPU: >= 0.9), then one JSON line.
//
//   ts_worker_shard_bench [--worker BIN] [--workers 4] [--preset 125m] [--vocab 32000]
//       [--context 1024] [--batch 8] [--micro-batch 0] [--steps 50] [--rounds 3]
//       [--device cuda] [--bf16] [--threads 4] [--work DIR] [--verify]
//
// With --verify, every round worker 1 also replays worker 0's round and evaluates its
// checkpoint again, as a validator does (docs/verification.md), and the bench prints what that
// costs against a member's inner steps, and at the default replay rate.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "common/process.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/client/work_dir.h"
#include "worker/client/worker_client.h"
#include "worker/data_shard.h"
#include "worker/model_config.h"

namespace ts::worker {
namespace {

namespace pb = ::gonka::trainshard::v1;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string worker;
  uint32_t workers = 4;
  std::string preset = "125m";
  uint32_t vocab = 32000, context = 1024, batch = 8, micro_batch = 0, steps = 50, rounds = 3;
  std::string device = "cuda";
  bool bf16 = false;
  int threads = 4;
  std::string work;
  bool verify = false;
};

// Held-out windows a member scores its steps on (sidecar/shard/run_spec.h kDefaultScoreWindows).
constexpr uint32_t kScoreWindows = 8;
// The default replay rate (sidecar/shard/run_spec.h kDefaultReplayRateBps: 800 bps).
constexpr double kDefaultReplayRate = 0.08;

constexpr char kEvalFile[] = "data/eval.tsds";
constexpr int kShards = 2;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Tokens that mostly follow t -> (5t + 3) mod vocab, with a jump every 11 tokens or so.
DataShard PatternShard(uint64_t seed, size_t count, uint32_t vocab) {
  DataShard shard;
  shard.vocab = vocab;
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  uint32_t t = static_cast<uint32_t>(seed % vocab);
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    t = (state >> 33) % 11 == 0 ? static_cast<uint32_t>((state >> 40) % vocab)
                                : (5 * t + 3) % vocab;
    shard.tokens.push_back(t);
  }
  return shard;
}

std::string ShardFile(int i) { return absl::StrCat("data/s", i, ".tsds"); }

pb::InnerStepsRequest InnerRequest(const Args& a, const std::string& root, uint64_t round,
                                   uint32_t k) {
  pb::InnerStepsRequest r;
  for (int i = 0; i < kShards; ++i) r.add_shard_files(ShardFile(i));
  r.set_data_seed(absl::StrCat("bench-seed-", round));
  r.set_round(round);
  r.set_host(absl::StrCat("worker", k));
  r.set_steps(a.steps);
  r.set_batch_size(a.batch);
  pb::AdamWSpec* s = r.mutable_adamw();
  s->set_lr(1e-3f);
  s->set_beta1(0.9f);
  s->set_beta2(0.95f);
  s->set_eps(1e-8f);
  s->set_weight_decay(0.1f);
  s->set_grad_clip_norm(1.0f);
  r.mutable_training()->set_micro_batch(a.micro_batch);
  r.mutable_training()->set_precision(a.bf16 ? "bf16" : "fp32");
  r.set_first_step((round - 1) * a.steps);
  r.set_total_steps(uint64_t{a.rounds} * a.steps);
  r.set_delta_file("delta.bin");
  r.set_base_root(root);
  if (a.verify) {
    // A verified shard's members score their steps (docs/verification.md "Scoring"): 8
    // held-out windows that move with the round.
    r.set_score_file(kEvalFile);
    r.set_score_windows(kScoreWindows);
    r.set_score_first_window(round * kScoreWindows);
  }
  return r;
}

// mean.bin in the first work dir: the elementwise fp32 mean of every worker's delta.bin, a
// chunk at a time; hard links of it in the others.
absl::Status MeanDelta(const std::vector<std::string>& dirs) {
  std::vector<std::ifstream> in;
  for (const std::string& d : dirs) in.emplace_back(d + "/delta.bin", std::ios::binary);
  const std::string out_path = dirs[0] + "/mean.bin";
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  constexpr size_t kChunk = size_t{1} << 22;
  std::vector<float> sum(kChunk), part(kChunk);
  const float scale = 1.0f / static_cast<float>(dirs.size());
  for (;;) {
    in[0].read(reinterpret_cast<char*>(sum.data()), kChunk * sizeof(float));
    const size_t n = static_cast<size_t>(in[0].gcount()) / sizeof(float);
    if (n == 0) break;
    for (size_t k = 1; k < in.size(); ++k) {
      in[k].read(reinterpret_cast<char*>(part.data()), n * sizeof(float));
      if (static_cast<size_t>(in[k].gcount()) != n * sizeof(float)) {
        return absl::DataLossError(absl::StrCat(dirs[k], "/delta.bin is shorter than the first"));
      }
      for (size_t i = 0; i < n; ++i) sum[i] += part[i];
    }
    for (size_t i = 0; i < n; ++i) sum[i] *= scale;
    out.write(reinterpret_cast<const char*>(sum.data()), static_cast<std::streamsize>(n * 4));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(out_path, ": write failed"));
  for (size_t k = 1; k < dirs.size(); ++k) {
    const std::string link = dirs[k] + "/mean.bin";
    std::filesystem::remove(link);
    std::error_code ec;
    std::filesystem::create_hard_link(out_path, link, ec);
    if (ec) std::filesystem::copy_file(out_path, link, ec);
    if (ec) return absl::InternalError(absl::StrCat(link, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// What checking one member-round cost (docs/verification.md "Replay"): worker 1 replays worker
// 0's inner steps of `round` from the round's base checkpoint with worker 0's threads, on a
// trainer of its own, and evaluates the round's checkpoint again as worker 0 evaluated it. The
// replayed Δ must be worker 0's to the byte and the loss its loss.
struct VerifyCost {
  double replay_s = 0, reevaluate_s = 0;
  bool reproduced = false;
};

// The replay's score is the member's, to the bit.
bool SameScore(const pb::InnerStepsResponse& a, const pb::InnerStepsResponse& b) {
  return a.score_base_loss() == b.score_base_loss() && a.score_loss() == b.score_loss() &&
         a.assigned_loss() == b.assigned_loss();
}

absl::StatusOr<VerifyCost> VerifyRound(const Args& a,
                                       std::vector<std::unique_ptr<WorkerProcess>>& w,
                                       const std::vector<std::string>& dirs,
                                       const std::string& base_root, uint32_t round,
                                       pb::EvaluateRequest eval,
                                       const pb::InnerStepsResponse& member) {
  VerifyCost cost;
  pb::InnerStepsRequest replay = InnerRequest(a, base_root, round, 0);
  replay.set_delta_file("replay.bin");
  replay.set_replay_checkpoint_file(absl::StrCat("ckpt-", round - 1, ".tsck"));
  replay.set_replay_threads(static_cast<uint32_t>(a.threads));
  auto t0 = Clock::now();
  TS_ASSIGN_OR_RETURN(pb::InnerStepsResponse replayed_steps, w[1]->client().InnerSteps(replay));
  cost.replay_s = Since(t0);
  TS_ASSIGN_OR_RETURN(pb::EvaluateResponse own, w[0]->client().Evaluate(eval));
  eval.set_checkpoint_file(absl::StrCat("ckpt-", round, ".tsck"));
  eval.set_threads(static_cast<uint32_t>(a.threads));
  t0 = Clock::now();
  TS_ASSIGN_OR_RETURN(pb::EvaluateResponse again, w[1]->client().Evaluate(eval));
  cost.reevaluate_s = Since(t0);
  // Two Δs of the bench's model: far below the cap.
  constexpr uint64_t kDeltaBytesMax = uint64_t{1} << 36;
  TS_ASSIGN_OR_RETURN(std::string replayed,
                      ReadWorkFile(dirs[1], "replay", "replay.bin", kDeltaBytesMax));
  TS_ASSIGN_OR_RETURN(std::string committed,
                      ReadWorkFile(dirs[0], "delta", "delta.bin", kDeltaBytesMax));
  cost.reproduced = replayed == committed && again.mean_loss() == own.mean_loss() &&
                    SameScore(replayed_steps, member);
  return cost;
}

absl::Status Run(const Args& a) {
  if (a.verify && a.workers < 2) {
    return absl::InvalidArgumentError("--verify needs --workers 2 or more");
  }
  TS_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(a.preset, a.vocab, a.context));
  const std::string root_dir =
      a.work.empty() ? absl::StrCat("/tmp/ts-shard-bench-", ::getpid()) : a.work;
  std::vector<std::string> dirs;
  // Enough for a round without repeats, at most 4 Mi tokens a shard (windows may then repeat).
  const uint64_t shard_tokens =
      std::min<uint64_t>(uint64_t{a.batch} * (a.context + 1) * a.steps + 4096, uint64_t{1} << 22);
  for (uint32_t k = 0; k < a.workers; ++k) {
    const std::string d = absl::StrCat(root_dir, "/w", k);
    std::filesystem::create_directories(d + "/data");
    for (int i = 0; i < kShards; ++i) {
      TS_RETURN_IF_ERROR(WriteWorkFile(
          d, "data", ShardFile(i), EncodeDataShard(PatternShard(i + 1, shard_tokens, a.vocab))));
    }
    TS_RETURN_IF_ERROR(
        WriteWorkFile(d, "data", kEvalFile, EncodeDataShard(PatternShard(99, 65536, a.vocab))));
    dirs.push_back(d);
  }
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (uint32_t k = 0; k < a.workers; ++k) {
    WorkerProcessOptions o{.binary = a.worker,
                           .socket_path = absl::StrCat(root_dir, "/w", k, ".sock"),
                           .work_dir = dirs[k],
                           .threads = a.threads,
                           .extra_args = {"--device", a.device},
                           .log_file = absl::StrCat(root_dir, "/w", k, ".log"),
                           .start_timeout_ms = 120'000};
    o.client.train_timeout_ms = 3'600'000;
    TS_ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> w, WorkerProcess::Start(o));
    workers.push_back(std::move(w));
  }
  TS_ASSIGN_OR_RETURN(pb::WorkerStatusResponse about, workers[0]->client().Status());

  pb::InitModelRequest init;
  init.mutable_spec()->set_kind("llama");
  init.mutable_spec()->set_preset(a.preset);
  init.mutable_spec()->mutable_config()->set_vocab(a.vocab);
  init.mutable_spec()->mutable_config()->set_context(a.context);
  init.mutable_spec()->set_seed(7);
  init.set_checkpoint_file("ckpt-0.tsck");
  TS_ASSIGN_OR_RETURN(pb::InitModelResponse made, workers[0]->client().InitModel(init));
  std::string root = made.root();
  for (uint32_t k = 1; k < a.workers; ++k) {
    std::filesystem::copy_file(dirs[0] + "/ckpt-0.tsck", dirs[k] + "/ckpt-0.tsck");
    pb::LoadCheckpointRequest load;
    load.set_checkpoint_file("ckpt-0.tsck");
    load.set_expected_root(root);
    TS_RETURN_IF_ERROR(workers[k]->client().LoadCheckpoint(load).status());
  }
  pb::EvaluateRequest eval;
  eval.set_eval_file(kEvalFile);
  eval.set_batch_size(8);
  eval.set_windows_max(64);
  TS_ASSIGN_OR_RETURN(pb::EvaluateResponse eval0, workers[0]->client().Evaluate(eval));
  std::printf("%u workers on %s (%s), %s, %llu params; batch %u x %u, H = %u, %u rounds%s\n",
              a.workers, about.device().c_str(), about.device_name().c_str(),
              ModelConfigString(config).c_str(),
              static_cast<unsigned long long>(ParameterCount(config)), a.batch, a.context, a.steps,
              a.rounds, a.bf16 ? ", bf16" : "");

  bool one_root = true, verified = true;
  double inner_total = 0, outer_total = 0, check_total = 0, member_inner_total = 0;
  double score_total = 0;
  nlohmann::json rounds = nlohmann::json::array();
  const auto t_all = Clock::now();
  for (uint32_t round = 1; round <= a.rounds; ++round) {
    const auto t_round = Clock::now();
    std::vector<absl::StatusOr<pb::InnerStepsResponse>> results(a.workers);
    std::vector<std::thread> threads;
    for (uint32_t k = 0; k < a.workers; ++k) {
      threads.emplace_back([&, k] {
        pb::InnerStepsRequest request = InnerRequest(a, root, round, k);
        request.set_reset_optimizer(a.verify);  // a verified shard's rounds start fresh
        results[k] = workers[k]->client().InnerSteps(request);
      });
    }
    for (std::thread& t : threads) t.join();
    // The inner steps' span: the longest of the workers' own time in steps (they ran at once);
    // loading the checkpoint and writing Δ count as the round's overhead.
    double inner_s = 0;
    double loss = 0;
    for (auto& r : results) {
      TS_RETURN_IF_ERROR(r.status());
      loss += r->losses(r->losses_size() - 1) / a.workers;
      inner_s = std::max(inner_s, r->seconds());
    }
    const auto t_outer = Clock::now();
    TS_RETURN_IF_ERROR(MeanDelta(dirs));
    std::vector<std::string> roots(a.workers);
    std::vector<absl::Status> outer_status(a.workers);
    threads.clear();
    for (uint32_t k = 0; k < a.workers; ++k) {
      threads.emplace_back([&, k] {
        pb::OuterStepRequest o;
        o.set_delta_file("mean.bin");
        o.mutable_outer()->set_lr(0.7f);
        o.mutable_outer()->set_momentum(0.9f);
        o.mutable_outer()->set_nesterov(true);
        o.set_checkpoint_file(absl::StrCat("ckpt-", round, ".tsck"));
        o.set_base_root(root);
        auto done = workers[k]->client().OuterStep(o);
        outer_status[k] = done.status();
        if (done.ok()) roots[k] = done->root();
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : outer_status) TS_RETURN_IF_ERROR(s);
    const bool agree = std::all_of(roots.begin(), roots.end(),
                                   [&](const std::string& r) { return r == roots[0]; });
    one_root = one_root && agree;
    const double outer_s = Since(t_outer), round_s = Since(t_round);
    if (a.verify) {
      TS_ASSIGN_OR_RETURN(VerifyCost cost,
                          VerifyRound(a, workers, dirs, root, round, eval, *results[0]));
      const double member_inner = results[0]->seconds();
      verified = verified && cost.reproduced;
      check_total += cost.replay_s + cost.reevaluate_s;
      member_inner_total += member_inner;
      score_total += results[0]->score_seconds();
      std::printf(
          "round %u: replay %.2f s + re-evaluation %.2f s against the member's inner steps "
          "%.2f s (its score %.2f s: held-out %.4f -> %.4f), %s\n",
          round, cost.replay_s, cost.reevaluate_s, member_inner, results[0]->score_seconds(),
          results[0]->score_base_loss(), results[0]->score_loss(),
          cost.reproduced ? "reproduced" : "NOT REPRODUCED");
    }
    inner_total += inner_s;
    outer_total += outer_s;
    // The previous round's files are not needed again.
    for (const std::string& d : dirs) {
      std::filesystem::remove(absl::StrCat(d, "/ckpt-", round - 1, ".tsck"));
    }
    root = roots[0];
    std::printf(
        "round %u: train loss %.4f, inner steps %.1f s, mean delta and outer step %.1f s, "
        "round %.1f s, %s\n",
        round, loss, inner_s, outer_s, round_s, agree ? "one root" : "ROOTS DIFFER");
    std::fflush(stdout);
    rounds.push_back({{"round", round},
                      {"train_loss", loss},
                      {"inner_s", inner_s},
                      {"outer_s", outer_s},
                      {"round_s", round_s},
                      {"one_root", agree}});
  }
  const double wall = Since(t_all);
  TS_ASSIGN_OR_RETURN(pb::EvaluateResponse eval1, workers[0]->client().Evaluate(eval));
  const double share = inner_total / wall;
  std::printf(
      "eval loss %.4f -> %.4f; one root every round: %s; inner steps %.1f s of %.1f s "
      "wall = %.3f (target >= 0.9 on a GPU)\n",
      eval0.mean_loss(), eval1.mean_loss(), one_root ? "yes" : "NO", inner_total, wall, share);
  nlohmann::json j = {{"workers", a.workers},
                      {"device", about.device()},
                      {"device_name", about.device_name()},
                      {"model", ModelConfigString(config)},
                      {"params", ParameterCount(config)},
                      {"batch", a.batch},
                      {"context", a.context},
                      {"h", a.steps},
                      {"bf16", a.bf16},
                      {"eval_loss_start", eval0.mean_loss()},
                      {"eval_loss_end", eval1.mean_loss()},
                      {"loss_down", eval1.mean_loss() < eval0.mean_loss()},
                      {"one_root", one_root},
                      {"inner_s", inner_total},
                      {"outer_s", outer_total},
                      {"wall_s", wall},
                      {"inner_share", share},
                      {"rounds", rounds}};
  if (a.verify) {
    // Every member-round replayed and re-evaluated at the default rate: rate × check / inner.
    const double overhead = kDefaultReplayRate * check_total / member_inner_total;
    std::printf(
        "verification: checks %.1f s against the member's inner steps %.1f s: %.2f x a round; "
        "at the default rate (%.0f %%) %.1f %% more compute (target <= 10 %%); every replay %s\n",
        check_total, member_inner_total, check_total / member_inner_total, 100 * kDefaultReplayRate,
        100 * overhead, verified ? "reproduced" : "DID NOT REPRODUCE");
    std::printf(
        "scoring: %.2f s against the member's inner steps %.1f s: %.1f %% more compute "
        "(every member, every round)\n",
        score_total, member_inner_total, 100 * score_total / member_inner_total);
    j["score_s"] = score_total;
    j["scoring_overhead"] = score_total / member_inner_total;
    j["check_s"] = check_total;
    j["member_inner_s"] = member_inner_total;
    j["verification_overhead"] = overhead;
    j["verified"] = verified;
  }
  std::printf("%s\n", j.dump().c_str());
  for (auto& w : workers) (void)w->Stop();
  if (a.work.empty()) std::filesystem::remove_all(root_dir);
  return one_root && verified && eval1.mean_loss() < eval0.mean_loss()
             ? absl::OkStatus()
             : absl::InternalError("the roots differed or the loss did not go down");
}

}  // namespace
}  // namespace ts::worker

int main(int argc, char** argv) {
  CLI::App app{"ts_worker_shard_bench: a DiLoCo shard of ts_worker processes on one machine"};
  ts::worker::Args a;
  a.worker = ts::common::SiblingExecutable("", "ts_worker", "ts_worker");
  app.add_option("--worker", a.worker, "the ts_worker executable");
  app.add_option("--workers", a.workers)->check(CLI::Range(1, 16));
  app.add_option("--preset", a.preset, "llama preset");
  app.add_option("--vocab", a.vocab);
  app.add_option("--context", a.context);
  app.add_option("--batch", a.batch)->check(CLI::Range(1, 4096));
  app.add_option("--micro-batch", a.micro_batch);
  app.add_option("--steps", a.steps, "inner steps per round (H)")->check(CLI::Range(1, 100000));
  app.add_option("--rounds", a.rounds)->check(CLI::Range(1, 10000));
  app.add_option("--device", a.device)->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_flag("--bf16", a.bf16, "bf16 autocast (CUDA)");
  app.add_option("--threads", a.threads, "each worker's torch threads")->check(CLI::Range(1, 256));
  app.add_option("--work", a.work, "folder for the workers' files (default: a temporary one)");
  app.add_flag("--verify", a.verify,
               "rounds start with fresh moments; worker 1 replays and re-evaluates worker 0's "
               "rounds, and the verification's cost is printed (needs 2 workers)");
  CLI11_PARSE(app, argc, argv);
  absl::Status s = ts::worker::Run(a);
  if (!s.ok()) {
    std::fprintf(stderr, "ts_worker_shard_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
