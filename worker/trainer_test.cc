#include "worker/trainer.h"

#include <chrono>
#include <cmath>

#include <torch/cuda.h>

#include "common/hex.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/checkpoint.h"
#include "worker/outer_step.h"
#include "worker/test_corpus.h"

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

const ModelConfig kTiny{
    .layers = 2, .d_model = 64, .heads = 4, .context = 32, .vocab = 512, .mlp_ratio = 4};

std::vector<ShardRef> Refs(const Dataset& ds) {
  std::vector<ShardRef> refs;
  for (const DataShard& s : ds.train) {
    refs.push_back({DataShardId(EncodeDataShard(s)), s.tokens.size()});
  }
  return refs;
}

std::vector<TokenBatch> Batches(const Dataset& ds, uint64_t round, const std::string& host,
                                uint32_t steps, uint32_t batch_size) {
  AssignmentRequest req{.data_seed = std::string(32, '\x11'),
                        .round = round,
                        .host = host,
                        .shards = Refs(ds),
                        .steps = steps,
                        .batch_size = batch_size,
                        .context = kTiny.context};
  absl::StatusOr<Assignment> a = AssignBatches(req);
  TS_CHECK(a.ok());
  absl::StatusOr<std::vector<TokenBatch>> b = GatherBatches(*a, ds.train);
  TS_CHECK(b.ok());
  return *b;
}

std::unique_ptr<Trainer> MakeTrainer(const AdamWOptions& adamw = {}) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(kTiny, adamw, RuntimeOptions{});
  TS_CHECK(t.ok());
  return std::move(*t);
}

TEST(Trainer, RefusesBadConfigAndOptions) {
  ModelConfig bad = kTiny;
  bad.heads = 5;
  EXPECT_THAT(Trainer::Create(bad, {}, {}).status().message(), HasSubstr("heads: 5"));
  EXPECT_THAT(Trainer::Create(kTiny, {.lr = -1}, {}).status().message(), HasSubstr("adamw.lr"));
  EXPECT_THAT(Trainer::Create(kTiny, {}, {.num_threads = 0}).status().message(),
              HasSubstr("runtime.num_threads"));
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(Trainer::Create(kTiny, {}, {.device = Device::kCuda}).status().code(),
              absl::StatusCode::kFailedPrecondition);
    absl::StatusOr<std::unique_ptr<Trainer>> t =
        Trainer::Create(kTiny, {}, {.device = Device::kAuto});
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE((*t)->on_cuda());
  }
}

TEST(Trainer, LoadStoreAndPseudoGradient) {
  const Dataset& ds = GetTestCorpus().dataset;
  std::unique_ptr<Trainer> t = MakeTrainer();
  const std::vector<float> base = InitParams(kTiny, 1);
  ASSERT_TRUE(t->Evaluate(base, ds.eval, {.windows_max = 1}).ok());  // loads base
  EXPECT_EQ(t->Params(), base);
  absl::StatusOr<InnerResult> r = t->InnerSteps(base, Batches(ds, 0, "h", 3, 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->losses.size(), 3u);
  EXPECT_EQ(r->local_params, t->Params());
  ASSERT_EQ(r->pseudo_gradient.size(), base.size());
  size_t moved = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(r->pseudo_gradient[i], base[i] - r->local_params[i]);
    moved += r->pseudo_gradient[i] != 0;
  }
  EXPECT_GT(moved, base.size() / 2);
  // Bad input is refused with a status, not an exception.
  EXPECT_EQ(t->InnerSteps(std::vector<float>(3), Batches(ds, 0, "h", 1, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  TokenBatch b{.rows = 1, .cols = 3, .tokens = {1, 2, 512}};
  EXPECT_THAT(t->InnerSteps(base, std::span<const TokenBatch>(&b, 1)).status().message(),
              HasSubstr("token[2] = 512"));
  b = {.rows = 1, .cols = 34, .tokens = std::vector<int64_t>(34, 1)};
  EXPECT_THAT(t->InnerSteps(base, std::span<const TokenBatch>(&b, 1)).status().message(),
              HasSubstr("for context 32"));
}

// One DiLoCo round from scratch: the checkpoint after the outer step, and its root.
std::string RoundRoot(const Dataset& ds) {
  const std::vector<float> base = InitParams(kTiny, 42);
  absl::StatusOr<InnerResult> r = InnerSteps(kTiny, base, Batches(ds, 7, "gonka1a", 5, 8), {}, {});
  TS_CHECK(r.ok());
  Checkpoint ck{kTiny, base, std::vector<float>(base.size(), 0.0f)};
  TS_CHECK(OuterStep(ck.params, *ck.momentum, r->pseudo_gradient, {}).ok());
  return CheckpointRootOf(ck);
}

TEST(Trainer, SameInputsGiveTheSameCheckpointRoot) {
  const Dataset& ds = GetTestCorpus().dataset;
  const std::string a = RoundRoot(ds), b = RoundRoot(ds);
  EXPECT_EQ(common::HexEncode(a), common::HexEncode(b));
}

TEST(Trainer, OptimizerStatePersistsUntilReset) {
  const Dataset& ds = GetTestCorpus().dataset;
  const std::vector<float> base = InitParams(kTiny, 3);
  const std::vector<TokenBatch> round0 = Batches(ds, 0, "h", 2, 4);
  const std::vector<TokenBatch> round1 = Batches(ds, 1, "h", 2, 4);
  const InnerResult fresh = *InnerSteps(kTiny, base, round1, {}, {});
  std::unique_ptr<Trainer> t = MakeTrainer();
  ASSERT_TRUE(t->InnerSteps(base, round0).ok());
  const InnerResult kept = *t->InnerSteps(base, round1);  // moments from round 0
  EXPECT_NE(kept.local_params, fresh.local_params);
  ASSERT_TRUE(t->InnerSteps(base, round0).ok());
  t->ResetOptimizer();
  EXPECT_EQ(t->InnerSteps(base, round1)->local_params, fresh.local_params);
}

TEST(Trainer, LossGoesDownOnTheRealCorpus) {
  const Dataset& ds = GetTestCorpus().dataset;
  const std::vector<float> base = InitParams(kTiny, 5);
  std::unique_ptr<Trainer> t = MakeTrainer({.lr = 2e-3f});
  const EvalOptions eval{.batch_size = 32, .windows_max = 64};
  const double before = *t->Evaluate(base, ds.eval, eval);
  EXPECT_NEAR(before, std::log(512.0), 0.5);  // an untrained model is near uniform
  constexpr uint32_t kSteps = 300;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<InnerResult> r = t->InnerSteps(base, Batches(ds, 0, "h", kSteps, 8));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status();
  const double after = *t->Evaluate(r->local_params, ds.eval, eval);
  std::printf(
      "loss: %u params, %u steps of 8x%u tokens in %.2f s (%.1f steps/s); "
      "train %.3f -> %.3f, eval %.3f -> %.3f\n",
      static_cast<unsigned>(ParameterCount(kTiny)), kSteps, kTiny.context, seconds,
      kSteps / seconds, r->losses.front(), r->losses.back(), before, after);
  EXPECT_LT(after, before - 0.8);
}

TEST(Trainer, EvaluateAndSample) {
  const TestCorpus& corpus = GetTestCorpus();
  std::unique_ptr<Trainer> t = MakeTrainer();
  const std::vector<float> params = InitParams(kTiny, 9);
  // The same windows in batches of any size give the same token-weighted mean. The last 50
  // tokens alone hold a shorter final window, which gets a batch of its own.
  const double all =
      *t->Evaluate(params, corpus.dataset.eval, {.batch_size = 64, .windows_max = 96});
  const double small =
      *t->Evaluate(params, corpus.dataset.eval, {.batch_size = 7, .windows_max = 96});
  DataShard tail = corpus.dataset.eval;
  tail.tokens.erase(tail.tokens.begin(), tail.tokens.end() - 50);
  absl::StatusOr<double> tail_loss = t->Evaluate(params, tail, {.batch_size = 4});
  ASSERT_TRUE(tail_loss.ok()) << tail_loss.status();
  EXPECT_GT(*tail_loss, 0.0);
  EXPECT_NEAR(all, small, 1e-5);
  DataShard wrong = corpus.dataset.eval;
  wrong.vocab = 100;
  EXPECT_EQ(t->Evaluate(params, wrong).status().code(), absl::StatusCode::kInvalidArgument);

  const std::vector<uint32_t> prompt = {5, 6, 7};
  absl::StatusOr<std::vector<uint32_t>> a = t->Sample(params, prompt, 40, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size(), 40u);  // more than the context: the window slides
  EXPECT_EQ(*t->Sample(params, prompt, 40, 1), *a);
  EXPECT_NE(*t->Sample(params, prompt, 40, 2), *a);
  absl::StatusOr<std::string> text =
      SampleText(*t, params, *corpus.tokenizer, "The meaning of life", 10, 1, {.top_k = 20});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, ::testing::StartsWith("The meaning of life"));
  EXPECT_EQ(t->Sample(params, prompt, 1, 1, {.temperature = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Nucleus sampling: a tiny top_p keeps the most likely token only (greedy, as top_k = 1),
  // whatever the seed; top_p = 1 cuts nothing (the same draws as without it).
  const auto greedy = t->Sample(params, prompt, 12, 1, {.top_k = 1});
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_EQ(*t->Sample(params, prompt, 12, 1, {.top_p = 1e-6f}), *greedy);
  EXPECT_EQ(*t->Sample(params, prompt, 12, 7, {.top_p = 1e-6f}), *greedy);
  EXPECT_EQ(*t->Sample(params, prompt, 40, 1, {.top_p = 1.0f}), *a);
  const auto nucleus = t->Sample(params, prompt, 40, 1, {.top_p = 0.9f});
  ASSERT_TRUE(nucleus.ok()) << nucleus.status();
  EXPECT_EQ(nucleus->size(), 40u);
  EXPECT_EQ(t->Sample(params, prompt, 1, 1, {.top_p = 1.5f}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

ModelConfig TinyLlama(bool tied) {
  return ModelConfig{.family = ModelFamily::kLlama,
                     .layers = 2,
                     .d_model = 64,
                     .heads = 4,
                     .context = 32,
                     .vocab = 512,
                     .mlp_ratio = 0,
                     .kv_heads = 2,
                     .mlp_hidden = 96,
                     .rope_theta = 10000,
                     .norm_eps = 1e-5f,
                     .tie_embeddings = tied};
}

InnerOptions With(uint32_t micro_batch, bool checkpointing, uint64_t first_step = 0,
                  ScheduleOptions schedule = {}) {
  InnerOptions o;
  o.micro_batch = micro_batch;
  o.activation_checkpointing = checkpointing;
  o.first_step = first_step;
  o.schedule = schedule;
  return o;
}

absl::StatusOr<InnerResult> RunSteps(const ModelConfig& c, const std::vector<TokenBatch>& batches,
                                     const InnerOptions& options) {
  return InnerSteps(c, InitParams(c, 3), batches, AdamWOptions{}, RuntimeOptions{}, options);
}

TEST(Trainer, ActivationCheckpointingGivesTheSameStepsBitForBit) {
  const Dataset& ds = GetTestCorpus().dataset;
  const std::vector<TokenBatch> batches = Batches(ds, 0, "h", 3, 4);
  for (const ModelConfig& c : {kTiny, TinyLlama(false), TinyLlama(true)}) {
    absl::StatusOr<InnerResult> plain = RunSteps(c, batches, {});
    absl::StatusOr<InnerResult> checkpointed = RunSteps(c, batches, With(0, true));
    ASSERT_TRUE(plain.ok() && checkpointed.ok()) << plain.status() << checkpointed.status();
    EXPECT_EQ(plain->losses, checkpointed->losses) << ModelConfigString(c);
    EXPECT_EQ(plain->local_params, checkpointed->local_params) << ModelConfigString(c);
  }
}

TEST(Trainer, MicroBatchesAccumulateToTheWholeBatchsStep) {
  const Dataset& ds = GetTestCorpus().dataset;
  const std::vector<TokenBatch> batches = Batches(ds, 0, "h", 2, 6);
  for (const ModelConfig& c : {kTiny, TinyLlama(true)}) {
    absl::StatusOr<InnerResult> whole = RunSteps(c, batches, {});
    // 6 rows as 4 + 2: the shares weigh the two passes; with checkpointing too.
    absl::StatusOr<InnerResult> split = RunSteps(c, batches, With(4, false));
    absl::StatusOr<InnerResult> split_ckpt = RunSteps(c, batches, With(4, true));
    ASSERT_TRUE(whole.ok() && split.ok() && split_ckpt.ok());
    for (size_t i = 0; i < whole->losses.size(); ++i) {
      EXPECT_NEAR(split->losses[i], whole->losses[i], 1e-5) << i;
    }
    double diff = 0;
    for (size_t i = 0; i < whole->local_params.size(); ++i) {
      diff = std::max<double>(diff, std::abs(split->local_params[i] - whole->local_params[i]));
    }
    // Two AdamW steps of lr 6e-4 (each moves a value by up to 6e-4): summing the gradient in
    // another order moves the result by rounding only.
    EXPECT_LT(diff, 1e-5) << ModelConfigString(c);
    // Checkpointing with micro-batches: the tied embedding's two contributions are added to the
    // accumulated gradient one at a time rather than as their sum, so rounding again.
    double ckpt_diff = 0;
    for (size_t i = 0; i < split->local_params.size(); ++i) {
      ckpt_diff = std::max<double>(ckpt_diff,
                                   std::abs(split->local_params[i] - split_ckpt->local_params[i]));
    }
    EXPECT_LT(ckpt_diff, 1e-5) << ModelConfigString(c);
  }
}

TEST(Trainer, AveragedGradientsStepAsTheWholeBatch) {
  // Data parallel: two workers' gradients on 3 rows each, averaged and applied once, are the
  // step of one worker on all 6 rows (accumulated as two micro-batches of 3).
  const Dataset& ds = GetTestCorpus().dataset;
  const std::vector<TokenBatch> whole = Batches(ds, 0, "h", 2, 6);
  const ModelConfig c = TinyLlama(true);
  const AdamWOptions adamw{.grad_clip_norm = 1.0f};
  absl::StatusOr<InnerResult> reference =
      InnerSteps(c, InitParams(c, 3), whole, adamw, RuntimeOptions{}, With(3, false));
  ASSERT_TRUE(reference.ok()) << reference.status();

  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(c, adamw, RuntimeOptions{});
  ASSERT_TRUE(t.ok());
  const std::vector<float> init = InitParams(c, 3);
  VectorReader load(init);
  ASSERT_TRUE((*t)->Load(load).ok());
  for (size_t step = 0; step < whole.size(); ++step) {
    const TokenBatch& b = whole[step];
    std::vector<float> mean(init.size(), 0.0f);
    double loss = 0;
    for (uint32_t half = 0; half < 2; ++half) {
      TokenBatch part{.rows = 3, .cols = b.cols, .tokens = {}};
      part.tokens.assign(b.tokens.begin() + half * 3 * b.cols,
                         b.tokens.begin() + (half + 1) * 3 * b.cols);
      std::vector<float> grad;
      VectorWriter out(&grad);
      absl::StatusOr<double> l = (*t)->Gradient(part, out);
      ASSERT_TRUE(l.ok()) << l.status();
      ASSERT_EQ(grad.size(), init.size());
      for (size_t i = 0; i < grad.size(); ++i) mean[i] += grad[i] / 2;
      loss += *l / 2;
    }
    EXPECT_NEAR(loss, reference->losses[step], 1e-5) << step;
    VectorReader apply(mean);
    ASSERT_TRUE((*t)->ApplyGradient(apply, With(0, false, step)).ok());
  }
  const std::vector<float> got = (*t)->Params();
  double diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max<double>(diff, std::abs(got[i] - reference->local_params[i]));
  }
  EXPECT_LT(diff, 1e-5);
  // Gradient alone moves nothing; a gradient of the wrong length is refused and moves nothing.
  std::vector<float> ignored;
  VectorWriter sink(&ignored);
  ASSERT_TRUE((*t)->Gradient(whole[0], sink).ok());
  EXPECT_EQ((*t)->Params(), got);
  const std::vector<float> short_grad(got.size() - 1, 1.0f);
  VectorReader bad(short_grad);
  EXPECT_THAT((*t)->ApplyGradient(bad).message(), HasSubstr("gradient: "));
  EXPECT_EQ((*t)->Params(), got);
}

TEST(Trainer, TheScheduleWarmsUpThenDecaysOnTheGlobalStep) {
  const ScheduleOptions s{.warmup_steps = 10, .total_steps = 110, .min_lr_ratio = 0.1f};
  EXPECT_DOUBLE_EQ(ScheduledLr(1.0, s, 0), 0.1);
  EXPECT_DOUBLE_EQ(ScheduledLr(1.0, s, 4), 0.5);
  EXPECT_DOUBLE_EQ(ScheduledLr(1.0, s, 10), 1.0);     // the peak, the cosine's start
  EXPECT_NEAR(ScheduledLr(1.0, s, 60), 0.55, 1e-7);   // half-way: floor + (1 − floor) / 2
  EXPECT_NEAR(ScheduledLr(1.0, s, 110), 0.1, 1e-7);   // the floor (a float ratio)
  EXPECT_NEAR(ScheduledLr(1.0, s, 1000), 0.1, 1e-7);  // and held there
  EXPECT_DOUBLE_EQ(ScheduledLr(0.5, {}, 123), 0.5);   // no schedule: constant
  // A rejoining host's steps are the same as the host that never left: what the rate depends
  // on is the global step, so running steps 2..3 from step 2's parameters and moments equals
  // steps 0..3 in one go only if the first_step is given — shown by the rate alone differing.
  const Dataset& ds = GetTestCorpus().dataset;
  const std::vector<TokenBatch> batches = Batches(ds, 0, "h", 1, 4);
  const InnerOptions early = With(0, false, 0, s), late = With(0, false, 60, s);
  absl::StatusOr<InnerResult> a = RunSteps(kTiny, batches, early),
                              b = RunSteps(kTiny, batches, late);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->local_params, b->local_params);
  EXPECT_EQ(a->losses, b->losses);  // the same parameters before the step
  InnerOptions bad = With(0, false, 0, {.warmup_steps = 5, .total_steps = 3, .min_lr_ratio = 0});
  EXPECT_THAT(RunSteps(kTiny, batches, bad).status().message(),
              HasSubstr("schedule.total_steps: 3"));
  bad.schedule = {.warmup_steps = 0, .total_steps = 0, .min_lr_ratio = 2};
  EXPECT_THAT(RunSteps(kTiny, batches, bad).status().message(), HasSubstr("min_lr_ratio: 2"));
}

}  // namespace
}  // namespace ts::worker
