// Starts the real ts_worker binary on a Unix socket and drives it through WorkerClient: a few
// DiLoCo rounds (init, inner steps, outer step, evaluate, sample) checked against the library
// computed in this process; two workers agreeing bit for bit; refusals that leave the worker
// serving; and a worker SIGKILLed mid-call, seen as UNAVAILABLE, then restarted.
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "worker/checkpoint.h"
#include "worker/client/work_dir.h"
#include "worker/client/worker_client.h"
#include "worker/data_shard.h"
#include "worker/outer_step.h"
#include "worker/trainer.h"

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

constexpr int kThreads = 1;
const ModelConfig kConfig{
    .layers = 1, .d_model = 32, .heads = 2, .context = 16, .vocab = 64, .mlp_ratio = 2};
const std::vector<std::string> kShardFiles = {"data/s0.tsds", "data/s1.tsds"};
constexpr char kEvalFile[] = "data/eval.tsds";
constexpr char kHost[] = "gonka1hostaddress";
constexpr uint32_t kSteps = 5;
constexpr uint32_t kBatchSize = 4;

// Tokens that mostly follow t -> (5t + 3) mod vocab, with a jump every 11 tokens or so: a
// pattern a small model learns in a few steps.
DataShard PatternShard(uint64_t seed, size_t count) {
  DataShard shard;
  shard.vocab = kConfig.vocab;
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  uint32_t t = static_cast<uint32_t>(seed % kConfig.vocab);
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    if ((state >> 33) % 11 == 0) {
      t = static_cast<uint32_t>((state >> 40) % kConfig.vocab);
    } else {
      t = (5 * t + 3) % kConfig.vocab;
    }
    shard.tokens.push_back(t);
  }
  return shard;
}

pb::InitModelRequest InitRequest(const std::string& file) {
  pb::InitModelRequest r;
  r.mutable_spec()->set_kind("gpt");
  pb::WorkerModelConfig* c = r.mutable_spec()->mutable_config();
  c->set_layers(kConfig.layers);
  c->set_d_model(kConfig.d_model);
  c->set_heads(kConfig.heads);
  c->set_context(kConfig.context);
  c->set_vocab(kConfig.vocab);
  c->set_mlp_ratio(kConfig.mlp_ratio);
  r.mutable_spec()->set_seed(7);
  r.set_checkpoint_file(file);
  return r;
}

AdamWOptions TestAdamW() { return {.lr = 3e-3f}; }

pb::InnerStepsRequest InnerRequest(const std::string& base_root, uint64_t round,
                                   const std::string& delta_file) {
  pb::InnerStepsRequest r;
  for (const auto& f : kShardFiles) r.add_shard_files(f);
  r.set_data_seed("committed-seed");
  r.set_round(round);
  r.set_host(kHost);
  r.set_steps(kSteps);
  r.set_batch_size(kBatchSize);
  const AdamWOptions a = TestAdamW();
  pb::AdamWSpec* s = r.mutable_adamw();
  s->set_lr(a.lr);
  s->set_beta1(a.beta1);
  s->set_beta2(a.beta2);
  s->set_eps(a.eps);
  s->set_weight_decay(a.weight_decay);
  s->set_grad_clip_norm(a.grad_clip_norm);
  r.set_delta_file(delta_file);
  r.set_base_root(base_root);
  return r;
}

pb::OuterStepRequest OuterRequest(const std::string& base_root, const std::string& delta_file,
                                  const std::string& checkpoint_file) {
  pb::OuterStepRequest r;
  r.set_delta_file(delta_file);
  r.mutable_outer()->set_lr(0.7f);
  r.mutable_outer()->set_momentum(0.9f);
  r.mutable_outer()->set_nesterov(true);
  r.set_checkpoint_file(checkpoint_file);
  r.set_base_root(base_root);
  return r;
}

pb::EvaluateRequest EvalRequest() {
  pb::EvaluateRequest r;
  r.set_eval_file(kEvalFile);
  r.set_batch_size(16);
  return r;
}

class WorkerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ts-worker-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  // A work dir with the training shards and the eval set.
  std::string MakeWorkDir(const std::string& name) {
    const std::string work = dir_ + "/" + name;
    EXPECT_EQ(mkdir(work.c_str(), 0700), 0);
    EXPECT_EQ(mkdir((work + "/data").c_str(), 0700), 0);
    EXPECT_TRUE(
        WriteWorkFile(work, "f", kShardFiles[0], EncodeDataShard(PatternShard(1, 3000))).ok());
    EXPECT_TRUE(
        WriteWorkFile(work, "f", kShardFiles[1], EncodeDataShard(PatternShard(2, 2000))).ok());
    EXPECT_TRUE(WriteWorkFile(work, "f", kEvalFile, EncodeDataShard(PatternShard(3, 800))).ok());
    return work;
  }

  std::unique_ptr<WorkerProcess> Start(const std::string& name, const std::string& work,
                                       std::vector<std::string> extra_args = {},
                                       int threads = kThreads) {
    WorkerProcessOptions options{.binary = TS_WORKER_BINARY,
                                 .socket_path = dir_ + "/" + name + ".sock",
                                 .work_dir = work,
                                 .threads = threads,
                                 .extra_args = std::move(extra_args),
                                 .log_file = dir_ + "/" + name + ".log"};
    auto process = WorkerProcess::Start(options);
    EXPECT_TRUE(process.ok()) << process.status();
    return process.ok() ? *std::move(process) : nullptr;
  }

  static std::string Read(const std::string& work, const std::string& name) {
    auto bytes = ReadWorkFile(work, "f", name, uint64_t{1} << 30);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : "";
  }

  // The batches the worker must have used, computed here with the library.
  static std::vector<TokenBatch> ExpectedBatches(const std::string& work, uint64_t round) {
    std::vector<DataShard> shards;
    AssignmentRequest assign{.data_seed = "committed-seed",
                             .round = round,
                             .host = kHost,
                             .shards = {},
                             .steps = kSteps,
                             .batch_size = kBatchSize,
                             .context = kConfig.context};
    for (const auto& f : kShardFiles) {
      std::string bytes = Read(work, f);
      shards.push_back(*DecodeDataShard(bytes));
      assign.shards.push_back({.id = DataShardId(bytes), .tokens = shards.back().tokens.size()});
    }
    return *GatherBatches(*AssignBatches(assign), shards);
  }

  std::string dir_;
};

TEST_F(WorkerProcessTest, RoundsMatchTheLibraryAndEvalLossGoesDown) {
  const std::string work = MakeWorkDir("work");
  auto worker = Start("w", work);
  ASSERT_NE(worker, nullptr);
  WorkerClient& client = worker->client();

  auto init = client.InitModel(InitRequest("ckpt-0.tsck"));
  ASSERT_TRUE(init.ok()) << init.status();
  std::string encoded = Read(work, "ckpt-0.tsck");
  EXPECT_EQ(init->root(), CheckpointRoot(encoded));
  EXPECT_EQ(init->parameters(), ParameterCount(kConfig));
  Checkpoint expected;
  expected.config = kConfig;
  expected.params = InitParams(kConfig, 7);
  EXPECT_EQ(init->root(), CheckpointRootOf(expected));

  auto eval0 = client.Evaluate(EvalRequest());
  ASSERT_TRUE(eval0.ok()) << eval0.status();
  EXPECT_EQ(eval0->tokens(), 799u);
  EXPECT_EQ(eval0->root(), init->root());

  std::string root = init->root();
  for (uint64_t round = 1; round <= 4; ++round) {
    const std::string delta_file = "delta-" + std::to_string(round) + ".bin";
    const std::string ckpt_file = "ckpt-" + std::to_string(round) + ".tsck";
    auto inner = client.InnerSteps(InnerRequest(root, round, delta_file));
    ASSERT_TRUE(inner.ok()) << inner.status();
    const std::string delta = Read(work, delta_file);
    EXPECT_EQ(inner->delta_sha256(), common::Sha256(delta));
    EXPECT_EQ(inner->delta_bytes(), 4 * ParameterCount(kConfig));
    EXPECT_EQ(inner->losses_size(), static_cast<int>(kSteps));
    EXPECT_GT(inner->seconds(), 0);
    ASSERT_EQ(inner->shard_ids_size(), 2);

    if (round == 1) {
      // Δ = θ_base − θ_local as the library computes it (round 1: fresh AdamW state, as here).
      auto ref = ts::worker::InnerSteps(kConfig, expected.params, ExpectedBatches(work, round),
                                        TestAdamW(), {.num_threads = kThreads});
      ASSERT_TRUE(ref.ok()) << ref.status();
      ASSERT_EQ(delta.size(), 4 * ref->pseudo_gradient.size());
      EXPECT_EQ(std::memcmp(delta.data(), ref->pseudo_gradient.data(), delta.size()), 0);
      for (size_t i = 0; i < ref->pseudo_gradient.size(); ++i) {
        ASSERT_EQ(ref->pseudo_gradient[i], expected.params[i] - ref->local_params[i]) << i;
      }
      for (int i = 0; i < inner->losses_size(); ++i) {
        EXPECT_EQ(inner->losses(i), ref->losses[static_cast<size_t>(i)]);
      }
    }

    auto outer = client.OuterStep(OuterRequest(root, delta_file, ckpt_file));
    ASSERT_TRUE(outer.ok()) << outer.status();
    encoded = Read(work, ckpt_file);
    EXPECT_EQ(outer->root(), CheckpointRoot(encoded));
    auto decoded = DecodeCheckpoint(encoded);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_TRUE(decoded->momentum.has_value());
    // The outer step as the library computes it, with the momentum kept between rounds.
    std::vector<float> d(ParameterCount(kConfig));
    std::memcpy(d.data(), delta.data(), delta.size());
    if (!expected.momentum) expected.momentum.emplace(d.size(), 0.0f);
    ASSERT_TRUE(OuterStep(expected.params, *expected.momentum, d, {}).ok());
    EXPECT_EQ(outer->root(), CheckpointRootOf(expected)) << "round " << round;
    expected = *std::move(decoded);
    root = outer->root();
  }

  auto eval = client.Evaluate(EvalRequest());
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->root(), root);
  RecordProperty("eval_loss_start", std::to_string(eval0->mean_loss()));
  RecordProperty("eval_loss_end", std::to_string(eval->mean_loss()));
  EXPECT_LT(eval->mean_loss(), eval0->mean_loss() - 0.5)
      << "start " << eval0->mean_loss() << " end " << eval->mean_loss();
  // Evaluating a named checkpoint leaves the current one current.
  pb::EvaluateRequest named = EvalRequest();
  named.set_checkpoint_file("ckpt-0.tsck");
  auto eval_named = client.Evaluate(named);
  ASSERT_TRUE(eval_named.ok()) << eval_named.status();
  EXPECT_DOUBLE_EQ(eval_named->mean_loss(), eval0->mean_loss());

  pb::SampleRequest sample;
  for (uint32_t t : {1u, 8u, 43u}) sample.add_prompt_tokens(t);
  sample.set_count(8);
  sample.set_seed(5);
  sample.set_temperature(1.0f);
  auto s1 = client.Sample(sample);
  auto s2 = client.Sample(sample);
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_EQ(s1->tokens_size(), 11);
  EXPECT_EQ(s1->SerializeAsString(), s2->SerializeAsString());

  auto status = client.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->loaded());
  EXPECT_EQ(status->root(), root);
  EXPECT_EQ(status->threads(), static_cast<uint32_t>(kThreads));
  EXPECT_FALSE(status->busy());

  EXPECT_TRUE(worker->Stop().ok()) << "a SIGTERM must end the worker cleanly";
  EXPECT_FALSE(worker->Running());
}

TEST_F(WorkerProcessTest, InnerStepsRebasedOnTheHostsOwnDeltaMatchTheLibrary) {
  const std::string work = MakeWorkDir("work");
  auto worker = Start("w", work);
  ASSERT_NE(worker, nullptr);
  WorkerClient& client = worker->client();
  auto init = client.InitModel(InitRequest("ckpt-0.tsck"));
  ASSERT_TRUE(init.ok()) << init.status();
  const std::vector<float> params = InitParams(kConfig, 7);

  // Round 1 from the checkpoint; round 2 rebased on round 1's Δ (the exchange of round 1 in
  // flight): the steps start from θ − Δ₁, the checkpoint itself stays current.
  auto first = client.InnerSteps(InnerRequest(init->root(), 1, "d1.bin"));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string d1 = Read(work, "d1.bin");
  pb::InnerStepsRequest rebased = InnerRequest(init->root(), 2, "d2.bin");
  rebased.set_rebase_delta_file("d1.bin");
  rebased.set_reset_optimizer(true);
  auto second = client.InnerSteps(rebased);
  ASSERT_TRUE(second.ok()) << second.status();

  std::vector<float> own(params.size());
  ASSERT_EQ(d1.size(), 4 * own.size());
  std::memcpy(own.data(), d1.data(), d1.size());
  std::vector<float> start(params.size());
  for (size_t i = 0; i < start.size(); ++i) start[i] = params[i] - own[i];
  auto ref = ts::worker::InnerSteps(kConfig, start, ExpectedBatches(work, 2), TestAdamW(),
                                    {.num_threads = kThreads});
  ASSERT_TRUE(ref.ok()) << ref.status();
  const std::string d2 = Read(work, "d2.bin");
  ASSERT_EQ(d2.size(), 4 * ref->pseudo_gradient.size());
  EXPECT_EQ(std::memcmp(d2.data(), ref->pseudo_gradient.data(), d2.size()), 0)
      << "the delta must be against the rebased start";
  auto status = client.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->root(), init->root()) << "rebasing must leave the checkpoint current";

  // A rebase file of the wrong size, or holding a value that is not finite, is refused.
  ASSERT_TRUE(WriteWorkFile(work, "f", "short.bin", std::string(12, '\0')).ok());
  rebased.set_rebase_delta_file("short.bin");
  auto refused = client.InnerSteps(rebased);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("rebase_delta_file: \"short.bin\" holds 12 bytes"));
  std::vector<float> bad = own;
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(
      WriteWorkFile(work, "f", "nan.bin",
                    std::string_view(reinterpret_cast<const char*>(bad.data()), 4 * bad.size()))
          .ok());
  rebased.set_rebase_delta_file("nan.bin");
  refused = client.InnerSteps(rebased);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("not finite"));
}

// A validator's worker reproduces a member's Δ of a round bit for bit (docs/verification.md):
// from the member's certified base, with fresh moments and the member's thread count, on a
// trainer of its own, and its own checkpoint, moments and threads are as they were afterwards.
TEST_F(WorkerProcessTest, AReplayReproducesAMembersDeltaAndLeavesTheWorkerAsItWas) {
  const std::vector<std::string> works = {MakeWorkDir("member"), MakeWorkDir("validator"),
                                          MakeWorkDir("twin")};
  auto member = Start("member", works[0]);
  auto validator = Start("validator", works[1], {}, /*threads=*/2);
  auto twin = Start("twin", works[2], {}, /*threads=*/2);
  ASSERT_TRUE(member && validator && twin);

  // The member: round 1, the outer step, then round 2 with fresh moments — the Δ to check.
  auto init = member->client().InitModel(InitRequest("ckpt-0.tsck"));
  ASSERT_TRUE(init.ok()) << init.status();
  pb::InnerStepsRequest first = InnerRequest(init->root(), 1, "d1.bin");
  first.set_reset_optimizer(true);
  ASSERT_TRUE(member->client().InnerSteps(first).ok());
  auto outer = member->client().OuterStep(OuterRequest(init->root(), "d1.bin", "ckpt-1.tsck"));
  ASSERT_TRUE(outer.ok()) << outer.status();
  pb::InnerStepsRequest second = InnerRequest(outer->root(), 2, "d2.bin");
  second.set_reset_optimizer(true);
  second.set_score_file(kEvalFile);  // the steps' score (docs/verification.md "Scoring")
  second.set_score_windows(8);
  second.set_score_first_window(1000003);  // modulo the set's windows
  auto own = member->client().InnerSteps(second);
  ASSERT_TRUE(own.ok()) << own.status();
  // The steps help: lower loss on the held-out windows and on the first step's batch.
  EXPECT_LT(own->score_loss(), own->score_base_loss());
  EXPECT_LT(own->assigned_loss(), own->losses(0));

  // The validator and its twin train a round of their own (moments now held), then the
  // validator replays the member's round 2 from the member's base.
  for (auto* w : {validator.get(), twin.get()}) {
    auto start = w->client().InitModel(InitRequest("ckpt-0.tsck"));
    ASSERT_TRUE(start.ok()) << start.status();
    pb::InnerStepsRequest theirs = InnerRequest(start->root(), 1, "mine.bin");
    theirs.set_host("another-member");
    ASSERT_TRUE(w->client().InnerSteps(theirs).ok());
  }
  ASSERT_TRUE(WriteWorkFile(works[1], "f", "base.tsck", Read(works[0], "ckpt-1.tsck")).ok());
  pb::InnerStepsRequest replay = second;
  replay.set_delta_file("replayed.bin");
  replay.set_reset_optimizer(false);  // a replay starts fresh whatever this says
  replay.set_replay_checkpoint_file("base.tsck");
  replay.set_replay_threads(kThreads);  // the member's: libtorch's rounding depends on it
  auto replayed = validator->client().InnerSteps(replay);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(replayed->delta_sha256(), own->delta_sha256());
  EXPECT_EQ(Read(works[1], "replayed.bin"), Read(works[0], "d2.bin"));
  // The score too, to the bit.
  EXPECT_EQ(replayed->score_base_loss(), own->score_base_loss());
  EXPECT_EQ(replayed->score_loss(), own->score_loss());
  EXPECT_EQ(replayed->assigned_loss(), own->assigned_loss());

  // The validator's own state is untouched: its next round equals its twin's, which never
  // replayed anything.
  for (auto* w : {validator.get(), twin.get()}) {
    auto status = w->client().Status();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->root(), init->root());
    pb::InnerStepsRequest next = InnerRequest(init->root(), 2, "next.bin");
    next.set_host("another-member");
    ASSERT_TRUE(w->client().InnerSteps(next).ok());
  }
  EXPECT_EQ(Read(works[1], "next.bin"), Read(works[2], "next.bin"));

  // A base file that is not at base_root, and a replay with a rebase, are refused.
  pb::InnerStepsRequest wrong = replay;
  wrong.set_base_root(init->root());
  auto refused = validator->client().InnerSteps(wrong);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("replay_checkpoint_file: \"base.tsck\" has root"));
  pb::InnerStepsRequest rebased = replay;
  rebased.set_rebase_delta_file("mine.bin");
  refused = validator->client().InnerSteps(rebased);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("cannot be combined with replay_checkpoint_file"));
  pb::InnerStepsRequest unscored = replay;
  unscored.set_score_windows(0);
  refused = validator->client().InnerSteps(unscored);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("score_windows: 0 is outside 1..1024"));
  unscored.set_score_windows(4);
  unscored.set_score_file("d2.bin");
  refused = validator->client().InnerSteps(unscored);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("score_file: \"d2.bin\""));
  pb::InnerStepsRequest greedy = replay;
  greedy.set_replay_threads(5000);
  refused = validator->client().InnerSteps(greedy);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("replay_threads: 5000 is more than 1024"));

  // The member's evaluation of its checkpoint, evaluated again by the 2-thread validator with
  // the member's threads: the same loss, to the bit (docs/verification.md "Evaluations").
  auto evaluated = member->client().Evaluate(EvalRequest());
  ASSERT_TRUE(evaluated.ok()) << evaluated.status();
  pb::EvaluateRequest again = EvalRequest();
  again.set_checkpoint_file("base.tsck");
  again.set_threads(kThreads);
  auto reevaluated = validator->client().Evaluate(again);
  ASSERT_TRUE(reevaluated.ok()) << reevaluated.status();
  EXPECT_EQ(reevaluated->mean_loss(), evaluated->mean_loss());
  EXPECT_EQ(reevaluated->root(), evaluated->root());
  again.set_threads(5000);
  EXPECT_THAT(std::string(validator->client().Evaluate(again).status().message()),
              HasSubstr("threads: 5000 is more than 1024"));
}

TEST_F(WorkerProcessTest, TwoWorkersWithTheSameInputsGiveTheSameRoots) {
  std::vector<std::string> works = {MakeWorkDir("a"), MakeWorkDir("b")};
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  for (const char* name : {"a", "b"}) {
    workers.push_back(Start(name, works[workers.size()]));
    ASSERT_NE(workers.back(), nullptr);
  }
  std::vector<std::vector<std::string>> roots(2);
  for (size_t w = 0; w < 2; ++w) {
    WorkerClient& client = workers[w]->client();
    auto init = client.InitModel(InitRequest("ckpt-0.tsck"));
    ASSERT_TRUE(init.ok()) << init.status();
    std::string root = init->root();
    roots[w].push_back(root);
    for (uint64_t round = 1; round <= 2; ++round) {
      auto inner = client.InnerSteps(InnerRequest(root, round, "delta.bin"));
      ASSERT_TRUE(inner.ok()) << inner.status();
      roots[w].push_back(inner->delta_sha256());
      auto outer = client.OuterStep(OuterRequest(root, "delta.bin", "ckpt.tsck"));
      ASSERT_TRUE(outer.ok()) << outer.status();
      root = outer->root();
      roots[w].push_back(root);
    }
  }
  EXPECT_EQ(roots[0], roots[1]);
  EXPECT_EQ(roots[0].size(), 5u);
}

TEST_F(WorkerProcessTest, BadInputIsRefusedClearlyAndTheWorkerStillServes) {
  const std::string work = MakeWorkDir("work");
  auto worker = Start("w", work, {"--file-bytes-max", "1048576", "--memory-bytes-max", "1048576"});
  ASSERT_NE(worker, nullptr);
  WorkerClient& client = worker->client();
  auto expect_refused = [](const absl::Status& s, absl::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr(text));
  };

  // Before any checkpoint.
  expect_refused(client.InnerSteps(InnerRequest(std::string(32, 'x'), 1, "d.bin")).status(),
                 absl::StatusCode::kFailedPrecondition, "no checkpoint is loaded");
  // Malformed specs.
  pb::InitModelRequest init = InitRequest("ckpt.tsck");
  init.clear_spec();
  expect_refused(client.InitModel(init).status(), absl::StatusCode::kInvalidArgument,
                 "spec: missing");
  init = InitRequest("ckpt.tsck");
  init.mutable_spec()->set_kind("mamba");
  expect_refused(client.InitModel(init).status(), absl::StatusCode::kInvalidArgument,
                 "spec.kind: \"mamba\" is not a known model");
  // A gpt config under the llama kind: the llama fields are missing, the gpt one is not its own.
  init = InitRequest("ckpt.tsck");
  init.mutable_spec()->set_kind("llama");
  expect_refused(client.InitModel(init).status(), absl::StatusCode::kInvalidArgument,
                 "spec.config.mlp_ratio: not a field of the llama family");
  init = InitRequest("ckpt.tsck");
  init.mutable_spec()->mutable_config()->set_heads(3);
  expect_refused(client.InitModel(init).status(), absl::StatusCode::kInvalidArgument,
                 "spec.config.heads: 3 does not divide d_model 32");
  init = InitRequest("ckpt.tsck");
  init.mutable_spec()->mutable_config()->set_layers(0);
  expect_refused(client.InitModel(init).status(), absl::StatusCode::kInvalidArgument,
                 "spec.config.layers: 0");
  init = InitRequest("ckpt.tsck");
  init.mutable_spec()->mutable_config()->set_d_model(4096);
  init.mutable_spec()->mutable_config()->set_heads(4);
  // A model whose fp32 training state would not fit the memory the worker may use.
  expect_refused(client.InitModel(init).status(), absl::StatusCode::kResourceExhausted,
                 "bytes of fp32 training state (16 per parameter), more than the 1048576");
  expect_refused(client.InitModel(InitRequest("../ckpt.tsck")).status(),
                 absl::StatusCode::kInvalidArgument, "checkpoint_file: \"../ckpt.tsck\"");

  auto good = client.InitModel(InitRequest("ckpt.tsck"));
  ASSERT_TRUE(good.ok()) << good.status();
  const std::string root = good->root();

  // Data shards: missing, corrupt, truncated; traversal names.
  pb::InnerStepsRequest inner = InnerRequest(root, 1, "d.bin");
  inner.set_shard_files(1, "data/nope.tsds");
  expect_refused(client.InnerSteps(inner).status(), absl::StatusCode::kNotFound,
                 "shard_files[1]: \"data/nope.tsds\" not found");
  ASSERT_TRUE(WriteWorkFile(work, "f", "data/corrupt.tsds", "TSXX0000000000000000000000").ok());
  inner = InnerRequest(root, 1, "d.bin");
  inner.set_shard_files(0, "data/corrupt.tsds");
  expect_refused(client.InnerSteps(inner).status(), absl::StatusCode::kInvalidArgument,
                 "shard_files[0]: \"data/corrupt.tsds\": ");
  std::string truncated = EncodeDataShard(PatternShard(9, 100));
  truncated.resize(truncated.size() - 3);
  ASSERT_TRUE(WriteWorkFile(work, "f", "data/short.tsds", truncated).ok());
  inner.set_shard_files(0, "data/short.tsds");
  expect_refused(client.InnerSteps(inner).status(), absl::StatusCode::kInvalidArgument,
                 "shard_files[0]: \"data/short.tsds\": ");
  inner = InnerRequest(root, 1, "d.bin");
  inner.set_shard_files(0, "/etc/passwd");
  expect_refused(client.InnerSteps(inner).status(), absl::StatusCode::kInvalidArgument,
                 "shard_files[0]: \"/etc/passwd\" is not a work dir file name");
  expect_refused(client.InnerSteps(InnerRequest(root, 1, "data/../../x")).status(),
                 absl::StatusCode::kInvalidArgument, "delta_file: \"data/../../x\"");
  // Other fields.
  inner = InnerRequest(root, 1, "d.bin");
  inner.mutable_adamw()->set_lr(-1);
  expect_refused(client.InnerSteps(inner).status(), absl::StatusCode::kInvalidArgument,
                 "adamw.lr: -1");
  inner = InnerRequest(root, 1, "d.bin");
  inner.set_steps(0);
  expect_refused(client.InnerSteps(inner).status(), absl::StatusCode::kInvalidArgument, "steps: 0");
  expect_refused(client.InnerSteps(InnerRequest(std::string(32, 'x'), 1, "d.bin")).status(),
                 absl::StatusCode::kFailedPrecondition, "is not the current checkpoint");

  // A checkpoint is refused from its header, before its values are read: not one; one whose size
  // is not what its header implies. A Δ of the wrong size too.
  ASSERT_TRUE(WriteWorkFile(work, "f", "big.tsck", std::string(2 << 20, 'x')).ok());
  pb::LoadCheckpointRequest load;
  load.set_checkpoint_file("big.tsck");
  expect_refused(client.LoadCheckpoint(load).status(), absl::StatusCode::kInvalidArgument,
                 "checkpoint_file: \"big.tsck\": checkpoint: wrong magic");
  {
    auto bytes = ReadWorkFile(work, "f", "ckpt.tsck", 1 << 30);
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(WriteWorkFile(work, "f", "long.tsck", *bytes + "1234").ok());
  }
  load.set_checkpoint_file("long.tsck");
  expect_refused(client.LoadCheckpoint(load).status(), absl::StatusCode::kInvalidArgument,
                 "bytes of values, expected");
  ASSERT_TRUE(WriteWorkFile(work, "f", "short.bin", std::string(12, '\0')).ok());
  expect_refused(client.OuterStep(OuterRequest(root, "short.bin", "c.tsck")).status(),
                 absl::StatusCode::kInvalidArgument, "holds 12 bytes, not 4 x");
  ASSERT_TRUE(WriteWorkFile(work, "f", "garbage.tsck", "not a checkpoint").ok());
  load.set_checkpoint_file("garbage.tsck");
  expect_refused(client.LoadCheckpoint(load).status(), absl::StatusCode::kInvalidArgument,
                 "checkpoint_file: \"garbage.tsck\": ");
  pb::EvaluateRequest eval = EvalRequest();
  eval.set_batch_size(0);
  expect_refused(client.Evaluate(eval).status(), absl::StatusCode::kInvalidArgument,
                 "batch_size: 0");
  pb::SampleRequest sample;
  sample.add_prompt_tokens(64);
  sample.set_count(4);
  sample.set_temperature(1);
  expect_refused(client.Sample(sample).status(), absl::StatusCode::kInvalidArgument,
                 "prompt_tokens[0]: 64 is not below vocab 64");

  // Still serving, and still at the good checkpoint.
  auto status = client.Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->root(), root);
  auto inner_ok = client.InnerSteps(InnerRequest(root, 1, "d.bin"));
  EXPECT_TRUE(inner_ok.ok()) << inner_ok.status();
  EXPECT_TRUE(worker->Running());

  // The current checkpoint is the file it was checked as: one replaced under its name since is
  // refused, not trained from, until it is loaded (and checked) again.
  auto bytes = ReadWorkFile(work, "f", "ckpt.tsck", 1 << 30);
  ASSERT_TRUE(bytes.ok());
  std::string other = *bytes;
  other[other.size() - 1] ^= 1;  // a different last parameter, still finite
  ASSERT_TRUE(WriteWorkFile(work, "f", "ckpt.tsck", other).ok());
  expect_refused(client.InnerSteps(InnerRequest(root, 1, "d.bin")).status(),
                 absl::StatusCode::kFailedPrecondition, "was replaced or changed");
  pb::LoadCheckpointRequest again;
  again.set_checkpoint_file("ckpt.tsck");
  auto reloaded = client.LoadCheckpoint(again);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_NE(reloaded->root(), root);
  EXPECT_TRUE(client.InnerSteps(InnerRequest(reloaded->root(), 1, "d.bin")).ok());
}

TEST_F(WorkerProcessTest, TheDeviceIsChosenReportedAndItsMemoryCheckedBeforeTheFirstSteps) {
  const std::string work = MakeWorkDir("work");
  // The model's state fits the cap; state and activations of a pass do not, by one byte.
  const uint64_t state = TrainingStateBytes(kConfig);
  const uint64_t need = state + ActivationBytes(kConfig, {.rows = kBatchSize,
                                                          .cols = uint64_t{kConfig.context} + 1,
                                                          .fused_attention = FusedAttention()});
  auto worker = Start("w", work, {"--memory-bytes-max", std::to_string(need - 1)});
  ASSERT_NE(worker, nullptr);
  auto status = worker->client().Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->device(), "cpu");  // the default
  EXPECT_EQ(status->device_name(), "cpu");
  EXPECT_GT(status->device_memory_bytes(), 0u);
  auto init = worker->client().InitModel(InitRequest("ckpt.tsck"));
  ASSERT_TRUE(init.ok()) << init.status();
  auto refused = worker->client().InnerSteps(InnerRequest(init->root(), 0, "d.bin"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat(" needs ", need, " bytes (training state ", state)));
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("more than the ", need - 1, " bytes this worker may use")));
  // Nothing was written, and one more byte is enough.
  EXPECT_FALSE(std::filesystem::exists(work + "/d.bin"));
  worker.reset();
  worker = Start("w2", work, {"--memory-bytes-max", std::to_string(need)});
  ASSERT_NE(worker, nullptr);
  pb::LoadCheckpointRequest load;
  load.set_checkpoint_file("ckpt.tsck");
  auto loaded = worker->client().LoadCheckpoint(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto inner = worker->client().InnerSteps(InnerRequest(init->root(), 0, "d.bin"));
  EXPECT_TRUE(inner.ok()) << inner.status();
  worker.reset();

  // --device auto is the CPU here, --device cuda a refusal at start naming what is missing.
  worker = Start("auto", work, {"--device", "auto"});
  ASSERT_NE(worker, nullptr);
  status = worker->client().Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->device(), torch::cuda::is_available() ? "cuda" : "cpu");
  worker.reset();
  if (!torch::cuda::is_available()) {
    auto cuda = WorkerProcess::Start({.binary = TS_WORKER_BINARY,
                                      .socket_path = dir_ + "/cuda.sock",
                                      .work_dir = work,
                                      .threads = kThreads,
                                      .extra_args = {"--device", "cuda"},
                                      .log_file = dir_ + "/cuda.log"});
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable) << cuda.status();
    EXPECT_THAT(cuda.status().message(), HasSubstr("exited with code 2"));
    std::ifstream log(dir_ + "/cuda.log");
    const std::string text((std::istreambuf_iterator<char>(log)), {});
    EXPECT_THAT(text, HasSubstr("device: cuda requested, but libtorch sees no CUDA device"));
  }
}

TEST_F(WorkerProcessTest, KilledMidCallIsUnavailableWithinTheDeadlineAndARestartServes) {
  const std::string work = MakeWorkDir("work");
  auto worker = Start("w", work);
  ASSERT_NE(worker, nullptr);
  auto init = worker->client().InitModel(InitRequest("ckpt-0.tsck"));
  ASSERT_TRUE(init.ok()) << init.status();

  pb::InnerStepsRequest long_call = InnerRequest(init->root(), 1, "d.bin");
  long_call.set_steps(100'000);  // far longer than the test waits
  absl::Status result;
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    result = worker->client().InnerSteps(long_call, /*timeout_ms=*/20'000).status();
    returned = true;
  });
  bool busy = false;
  for (int i = 0; i < 500 && !busy; ++i) {
    auto status = worker->client().Status(/*timeout_ms=*/1000);
    busy = status.ok() && status->busy();
    if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(busy);
  const auto killed = std::chrono::steady_clock::now();
  worker->Kill();
  caller.join();
  const auto waited = std::chrono::steady_clock::now() - killed;
  EXPECT_TRUE(returned);
  EXPECT_LT(waited, std::chrono::seconds(10));
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_THAT(result.message(), HasSubstr("worker unix:" + dir_ + "/w.sock: Worker/InnerSteps"));
  EXPECT_EQ(worker->client().Status(/*timeout_ms=*/1000).status().code(),
            absl::StatusCode::kUnavailable);

  // A fresh worker on the same socket serves from the checkpoint file.
  worker = Start("w", work);
  ASSERT_NE(worker, nullptr);
  pb::LoadCheckpointRequest load;
  load.set_checkpoint_file("ckpt-0.tsck");
  load.set_expected_root(init->root());
  auto loaded = worker->client().LoadCheckpoint(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->has_momentum());
  auto inner = worker->client().InnerSteps(InnerRequest(init->root(), 1, "d.bin"));
  EXPECT_TRUE(inner.ok()) << inner.status();
}

// PrepareData on a restart: intact files of the same request are re-verified and returned as
// they are; a changed file or request is built again, to the same bytes as the first time.
TEST_F(WorkerProcessTest, PreparedDataIsReusedWhenIntactAndRebuiltOtherwise) {
  const std::string work = dir_ + "/prep";
  ASSERT_EQ(mkdir(work.c_str(), 0700), 0);
  auto worker = Start("w", work);
  ASSERT_NE(worker, nullptr);
  pb::PrepareDataRequest req;
  req.set_corpus("fortunes");
  req.set_files(1);
  req.set_vocab(128);
  req.set_shard_tokens(4096);
  req.set_eval_every(20);
  req.set_out_dir("data");
  auto first = worker->client().PrepareData(req);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->reused());
  ASSERT_GE(first->shard_files_size(), 2);
  const std::string shard0 = Read(work, first->shard_files(0));

  // A new worker process on the same work dir, as after a crash.
  worker = Start("w2", work);
  ASSERT_NE(worker, nullptr);
  auto second = worker->client().PrepareData(req);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->reused());
  pb::PrepareDataResponse a = *first;
  pb::PrepareDataResponse b = *second;
  b.set_reused(false);
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());

  // One flipped byte in a training shard: rebuilt, and the shard is whole again.
  std::string damaged = shard0;
  damaged[damaged.size() / 2] ^= 1;
  ASSERT_TRUE(WriteWorkFile(work, "f", first->shard_files(0), damaged).ok());
  auto third = worker->client().PrepareData(req);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->reused());
  EXPECT_EQ(third->shard_ids(0), first->shard_ids(0));
  EXPECT_EQ(Read(work, first->shard_files(0)), shard0);

  // A missing tokenizer file: rebuilt.
  ASSERT_EQ(::unlink((work + "/" + first->tokenizer_file()).c_str()), 0);
  auto fourth = worker->client().PrepareData(req);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_FALSE(fourth->reused());

  // Another request (vocab) is not served from the files of this one.
  req.set_vocab(160);
  auto other = worker->client().PrepareData(req);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE(other->reused());
  EXPECT_NE(other->shard_ids(0), first->shard_ids(0));
}

}  // namespace
}  // namespace ts::worker
