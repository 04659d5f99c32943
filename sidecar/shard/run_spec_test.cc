#include "sidecar/shard/run_spec.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"
#include "common/crypto/hash.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;
namespace pb = ::gonka::trainshard::v1;

constexpr char kSpec[] = R"({
  "version": 1,
  "model": {"kind": "gpt", "seed": "7",
            "config": {"layers": 2, "dModel": 64, "heads": 4, "context": 32, "vocab": 512,
                       "mlpRatio": 4}},
  "data": {"corpus": "fortunes", "files": 4, "vocab": 512, "shardTokens": 8192, "evalEvery": 20},
  "rounds": 4, "innerSteps": 10, "batchSize": 8,
  "inner": {"lr": 0.003, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weightDecay": 0.1,
            "gradClipNorm": 1.0},
  "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
  "codec": "int8", "aggregation": "mean", "evalEvery": 2, "evalBatchSize": 16, "seed": "5"
})";

TEST(RunSpec, ParsesAppliesDefaultsAndHashesTheExactBytes) {
  auto parsed = ParseRunSpec(kSpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->hash, common::Sha256(kSpec));
  EXPECT_EQ(parsed->spec.join_window_ms(), kDefaultJoinWindowMs);
  EXPECT_EQ(parsed->spec.exchange_timeout_ms(), kDefaultExchangeTimeoutMs);
  EXPECT_EQ(parsed->codec.kind, Compression::kInt8);
  EXPECT_EQ(parsed->aggregate.kind, Aggregator::kMean);
  // One more space is another document.
  EXPECT_NE(ParseRunSpec(std::string(kSpec) + " ")->hash, parsed->hash);
  auto zstd = ParseRunSpec(absl::StrReplaceAll(kSpec, {{R"("int8")", R"("int8-zstd")"}}));
  ASSERT_TRUE(zstd.ok()) << zstd.status();
  EXPECT_EQ(zstd->codec.kind, Compression::kInt8Zstd);
  auto lossless = ParseRunSpec(absl::StrReplaceAll(kSpec, {{R"("int8")", R"("fp32-zstd")"}}));
  ASSERT_TRUE(lossless.ok()) << lossless.status();
  EXPECT_EQ(lossless->codec.kind, Compression::kFp32Zstd);
}

TEST(RunSpec, CommitmentsWhenAskedForOrWhenTheAggregatorGathersAnyway) {
  EXPECT_FALSE(ParseRunSpec(kSpec)->commitments);
  auto asked = ParseRunSpec(absl::StrReplaceAll(
      kSpec, {{R"("seed": "5")", R"("seed": "5", "verification": {"commitments": true})"}}));
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_TRUE(asked->commitments);
  EXPECT_EQ(asked->aggregate.kind, Aggregator::kMean);
  auto robust = ParseRunSpec(absl::StrReplaceAll(kSpec, {{R"("mean")", R"("trimmed_mean")"}}));
  ASSERT_TRUE(robust.ok()) << robust.status();
  EXPECT_TRUE(robust->commitments);
  // Without an aggregation: "auto", the trimmed mean at the Byzantine bound (the mean up to 3
  // members), which gathers and so commits.
  auto unnamed = ParseRunSpec(absl::StrReplaceAll(kSpec, {{R"("aggregation": "mean", )", ""}}));
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  EXPECT_EQ(unnamed->spec.aggregation(), "auto");
  EXPECT_TRUE(unnamed->aggregate_auto);
  EXPECT_TRUE(unnamed->commitments);
  // ... and without a verification section, replays at the default rate; a section says its own.
  EXPECT_EQ(unnamed->spec.verification().replay_rate_bps(), kDefaultReplayRateBps);
  EXPECT_EQ(ParseRunSpec(kSpec)->spec.verification().replay_rate_bps(), 0u);  // the mean
  EXPECT_EQ(asked->spec.verification().replay_rate_bps(), 0u);
  // Up to 3 hosts the mean; from 4 the trim of the shard's bound, kept in a round that lacks
  // members (at most what the round's own members allow).
  EXPECT_EQ(RoundAggregate(*unnamed, 3, 3).kind, Aggregator::kMean);
  EXPECT_EQ(RoundAggregate(*unnamed, 1, 1).kind, Aggregator::kMean);
  const AggregateSpec four = RoundAggregate(*unnamed, 4, 4);
  EXPECT_EQ(four.kind, Aggregator::kTrimmedMean);
  EXPECT_EQ(four.trim, 1u);
  EXPECT_EQ(RoundAggregate(*unnamed, 4, 3).trim, 1u);
  EXPECT_EQ(RoundAggregate(*unnamed, 7, 7).trim, 2u);
  EXPECT_EQ(RoundAggregate(*unnamed, 7, 4).trim, 1u);
  EXPECT_EQ(RoundAggregate(*unnamed, 7, 2).kind, Aggregator::kMean);
  // A named aggregator is what it says, whatever the round.
  EXPECT_EQ(RoundAggregate(*robust, 7, 7).trim, 0u);
  EXPECT_THAT(
      ParseRunSpec(absl::StrReplaceAll(kSpec, {{R"("mean")", R"("krum")"}})).status().message(),
      HasSubstr("aggregation: \"krum\" is not one of auto, mean"));
  // Replays need one determinism class: a run that replays and names no device trains on
  // CPUs; one that names another device does not replay by default.
  EXPECT_EQ(unnamed->spec.requirements().device(), "cpu");
  EXPECT_EQ(ParseRunSpec(kSpec)->spec.requirements().device(), "");  // the mean: no replays
  auto gpus = ParseRunSpec(absl::StrReplaceAll(
      kSpec, {{R"("aggregation": "mean", )", ""},
              {R"("seed": "5")", R"("seed": "5", "requirements": {"device": "cuda"})"}}));
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_TRUE(gpus->commitments);
  EXPECT_EQ(gpus->spec.verification().replay_rate_bps(), 0u);
  EXPECT_EQ(gpus->spec.verification().scoring(), "off");
  // Scoring (docs/verification.md "Scoring"): "record" where the run replays, else "off"; a
  // section says its own.
  EXPECT_EQ(unnamed->spec.verification().scoring(), "record");
  EXPECT_EQ(unnamed->spec.verification().score_windows(), kDefaultScoreWindows);
  EXPECT_EQ(unnamed->spec.verification().exclude_after_marks(), kDefaultExcludeAfterMarks);
  EXPECT_EQ(unnamed->spec.verification().score_margin_micro(), kDefaultScoreMarginMicro);
  EXPECT_EQ(ParseRunSpec(kSpec)->spec.verification().scoring(), "off");
  EXPECT_EQ(asked->spec.verification().scoring(), "off");  // commitments without replays
  auto recorded = ParseRunSpec(absl::StrReplaceAll(
      kSpec, {{R"("seed": "5")",
               R"("seed": "5", "verification": {"commitments": true, "scoring": "record"})"}}));
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(recorded->spec.verification().scoring(), "record");
  // Unknown fields of the section are refused like any other.
  auto unknown = ParseRunSpec(absl::StrReplaceAll(
      kSpec, {{R"("seed": "5")", R"("seed": "5", "verification": {"replay": 1})"}}));
  EXPECT_THAT(unknown.status().message(), HasSubstr("replay"));
}

// A shard of `members` (address, frozen weight).
ShardView ViewOf(std::vector<std::pair<std::string, uint64_t>> members) {
  ShardView view;
  for (const auto& [address, weight] : members) view.members.push_back({address, "", weight});
  return view;
}

TEST(RunSpec, TheInnerStepsRequestIsTheSameForTheMemberAndItsValidator) {
  auto parsed = ParseRunSpec(kSpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  google::protobuf::RepeatedPtrField<std::string> files;
  files.Add("data/a.tsds");
  files.Add("data/b.tsds");
  const ShardView shard = ViewOf({{"host-a", 10}, {"host-b", 10}});
  pb::InnerStepsRequest r = InnerStepsRequestOf(*parsed, shard, files, 3, "seed", "host-a", "base");
  EXPECT_EQ(r.shard_files_size(), 2);
  EXPECT_EQ(r.round(), 3u);
  EXPECT_EQ(r.host(), "host-a");
  EXPECT_EQ(r.data_seed(), "seed");
  EXPECT_EQ(r.base_root(), "base");
  EXPECT_EQ(r.steps(), 10u);
  EXPECT_EQ(r.batch_size(), 8u);
  EXPECT_EQ(r.first_step(), 20u);  // (round − 1) · H
  EXPECT_EQ(r.total_steps(), 40u);
  EXPECT_FALSE(r.reset_optimizer());
  // With commitments every round starts with fresh moments, so anyone can replay it.
  auto committed = ParseRunSpec(absl::StrReplaceAll(
      kSpec, {{R"("seed": "5")", R"("seed": "5", "verification": {"commitments": true})"}}));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(
      InnerStepsRequestOf(*committed, shard, files, 3, "seed", "host-a", "base").reset_optimizer());
}

TEST(RunSpec, AMembersBatchFollowsItsWeight) {
  auto parsed = ParseRunSpec(kSpec);  // batch 8, no micro-batches
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // Of the mean weight: the spec's batch; ten times another's weight, ten times its batch.
  const ShardView shard = ViewOf({{"a", 10}, {"b", 100}, {"c", 10}});
  EXPECT_EQ(MemberBatchOf(*parsed, shard, "a"), 2u);   // 8 × 3 × 10 / 120
  EXPECT_EQ(MemberBatchOf(*parsed, shard, "b"), 20u);  // 8 × 3 × 100 / 120
  EXPECT_EQ(MemberTokensOf(*parsed, shard, "b"), 10u * MemberTokensOf(*parsed, shard, "a"));
  EXPECT_EQ(MemberBatchOf(*parsed, ViewOf({{"a", 7}, {"b", 7}}), "a"), 8u);
  EXPECT_EQ(MemberBatchOf(*parsed, shard, "stranger"), 8u);
  // At least one sequence; at most 4096.
  EXPECT_EQ(MemberBatchOf(*parsed, ViewOf({{"a", 1}, {"b", 1'000'000}}), "a"), 1u);
  auto big =
      ParseRunSpec(absl::StrReplaceAll(kSpec, {{R"("batchSize": 8)", R"("batchSize": 4096)"}}));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(MemberBatchOf(*big, ViewOf({{"a", 1}, {"b", 3}}), "b"), 4096u);
  // In whole micro-batches: 8 × 2 × 3 / 4 = 12 sequences, three micro-batches of 4.
  auto micro = ParseRunSpec(absl::StrReplaceAll(
      kSpec, {{R"("seed": "5")", R"("seed": "5", "training": {"microBatch": 4})"}}));
  ASSERT_TRUE(micro.ok()) << micro.status();
  EXPECT_EQ(MemberBatchOf(*micro, ViewOf({{"a", 1}, {"b", 3}}), "b"), 12u);
  EXPECT_EQ(MemberBatchOf(*micro, ViewOf({{"a", 1}, {"b", 3}}), "a"), 4u);
}

TEST(RunSpec, ALlamaPresetWithTrainingAtSize) {
  const std::string doc = absl::StrReplaceAll(
      kSpec, {{R"("model": {"kind": "gpt", "seed": "7",
            "config": {"layers": 2, "dModel": 64, "heads": 4, "context": 32, "vocab": 512,
                       "mlpRatio": 4}},)",
               R"("model": {"kind": "llama", "preset": "tiny", "seed": "7",
            "config": {"context": 32, "vocab": 512}},)"},
              {R"("seed": "5")", R"("seed": "5", "training": {"microBatch": 4, "schedule":
            "cosine", "warmupSteps": "4", "minLrRatio": 0.1, "activationCheckpointing": true,
            "precision": "bf16"})"}});
  ASSERT_NE(doc, kSpec);
  auto parsed = ParseRunSpec(doc);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->spec.model().preset(), "tiny");
  EXPECT_EQ(parsed->spec.training().micro_batch(), 4u);
}

TEST(RunSpec, TheInnerStepsTimeoutFollowsTheModel) {
  auto small = ParseRunSpec(kSpec);
  ASSERT_TRUE(small.ok());
  // ~0.1 M parameters × 10 steps × 8 × 32 tokens: the 600 s floor and a little.
  EXPECT_GE(InnerStepsTimeoutMs(small->spec), 600'000);
  EXPECT_LT(InnerStepsTimeoutMs(small->spec), 610'000);
  pb::RunSpec large = small->spec;
  large.mutable_model()->Clear();
  large.mutable_model()->set_kind("llama");
  large.mutable_model()->set_preset("1b");
  large.mutable_model()->mutable_config()->set_vocab(32000);
  large.mutable_model()->mutable_config()->set_context(1024);
  // 1.04 B parameters × 10 × 8 × 1024 tokens × 6 at 1 GFLOP/s: about 51,000 s.
  EXPECT_NEAR(InnerStepsTimeoutMs(large) / 1000.0, 600 + 6 * 1038682112.0 * 81920 / 1e9, 1.0);
  large.set_inner_timeout_ms(120'000);
  EXPECT_EQ(InnerStepsTimeoutMs(large), 120'000);
}

TEST(RunSpec, BadDocumentsNameTheFieldAndValue) {
  struct Case {
    std::string from, to, want;
  };
  const Case cases[] = {
      {R"("kind": "gpt")", R"("kind": "rnn")", "model.kind: \"rnn\" is not a known model"},
      {R"("heads": 4)", R"("heads": 3)", "model.config.heads: 3"},
      {R"("corpus": "fortunes")", R"("corpus": "wiki")", "data.corpus: \"wiki\""},
      {R"("corpus": "fortunes")", R"("corpus": "packed")", "data.dataset_root: 0 bytes"},
      {R"("files": 4)", R"("files": 99)", "data.files: 99 is outside 1..41"},
      {R"("vocab": 512, "shardTokens")", R"("vocab": 256, "shardTokens")",
       "data.vocab: 256 is not model.config.vocab 512"},
      {R"("rounds": 4)", R"("rounds": 0)", "rounds: 0 is outside"},
      {R"("lr": 0.003)", R"("lr": -1)", "inner.lr: -1 is not a positive"},
      {R"("momentum": 0.9)", R"("momentum": 1.5)", "outer.momentum: 1.5 is outside [0, 1)"},
      {R"("codec": "int8")", R"("codec": "topk")", "codec: \"topk\""},
      {R"("aggregation": "mean")", R"("aggregation": "max")", "aggregation: \"max\""},
      {R"("evalEvery": 2, )", R"("evalEvery": 0, )", "eval_every: 0"},
      {R"("seed": "5")", R"("seed": "5", "colour": "red")", "not a RunSpec document"},
      {R"("rounds": 4)", R"("rounds": "four")", "not a RunSpec document"},
      {R"("kind": "gpt", "seed": "7",)", R"("kind": "llama", "seed": "7",)",
       "model.config.mlp_ratio: not a field of the llama family"},
      {R"("seed": "5")", R"("seed": "5", "training": {"microBatch": 3})",
       "training.micro_batch: 3 does not divide batch_size 8"},
      {R"("seed": "5")", R"("seed": "5", "training": {"warmupSteps": "41"})",
       "training.warmup_steps: 41 is more than the run's 40 inner steps"},
      {R"("seed": "5")", R"("seed": "5", "training": {"precision": "fp16"})",
       "training.precision: \"fp16\""},
      {R"("seed": "5")", R"("seed": "5", "innerTimeoutMs": "10")",
       "inner_timeout_ms: 10 is outside"},
      {R"("seed": "5")",
       R"("seed": "5", "verification": {"commitments": true, "replayRateBps": 10001})",
       "verification.replay_rate_bps: 10001 is outside 0..10000"},
      {R"("seed": "5")", R"("seed": "5", "verification": {"replayRateBps": 100})",
       "verification.replay_rate_bps: 100 needs verification.commitments"},
      {R"("seed": "5")",
       R"("seed": "5", "overlap": true, "verification": {"commitments": true, "replayRateBps": 1})",
       "verification.replay_rate_bps: 1 cannot be used with overlap"},
      {R"("seed": "5")",
       R"("seed": "5", "requirements": {"device": "any"}, "verification": {"commitments": true, "replayRateBps": 100})",
       "verification.replay_rate_bps: 100 needs requirements.device \"cpu\", not \"any\""},
      {R"("seed": "5")",
       R"("seed": "5", "verification": {"commitments": true, "scoring": "vibes"})",
       "verification.scoring: \"vibes\" is not drop, record or off"},
      {R"("seed": "5")", R"("seed": "5", "verification": {"scoring": "record"})",
       "verification.scoring: \"record\" needs commitments and no overlap"},
      {R"("seed": "5")",
       R"("seed": "5", "overlap": true, "verification": {"commitments": true, "scoring": "drop"})",
       "verification.scoring: \"drop\" needs commitments and no overlap"},
      {R"("seed": "5")",
       R"("seed": "5", "verification": {"commitments": true, "scoreWindows": 1025})",
       "verification.score_windows: 1025 is outside 1..1024"},
      {R"("seed": "5")",
       R"("seed": "5", "verification": {"commitments": true, "scoreMarginMicro": "1099511627777"})",
       "verification.score_margin_micro: 1099511627777 is outside 1..1099511627776"},
  };
  for (const Case& c : cases) {
    std::string doc = absl::StrReplaceAll(kSpec, {{c.from, c.to}});
    ASSERT_NE(doc, kSpec) << c.from;
    auto parsed = ParseRunSpec(doc);
    ASSERT_FALSE(parsed.ok()) << c.to;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.want)) << c.to;
  }
  EXPECT_THAT(ParseRunSpec("{").status().message(), HasSubstr("not a RunSpec document"));
  EXPECT_THAT(ParseRunSpec(std::string(kRunSpecBytesMax + 1, ' ')).status().message(),
              HasSubstr("is larger than"));
}

}  // namespace
}  // namespace ts::sidecar
