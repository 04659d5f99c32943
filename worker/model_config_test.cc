#include "worker/model_config.h"

#include <cmath>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

TEST(ModelConfig, DefaultIsValid) { EXPECT_TRUE(ValidateModelConfig(ModelConfig{}).ok()); }

TEST(ModelConfig, RefusesNamingFieldAndValue) {
  ModelConfig c;
  c.heads = 3;
  absl::Status s = ValidateModelConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("heads: 3 does not divide d_model 64"));

  c = ModelConfig{};
  c.layers = 0;
  EXPECT_THAT(ValidateModelConfig(c).message(), HasSubstr("layers: 0"));
  c = ModelConfig{};
  c.vocab = 1;
  EXPECT_THAT(ValidateModelConfig(c).message(), HasSubstr("vocab: 1"));
  c = ModelConfig{};
  c.context = kContextMax + 1;
  EXPECT_THAT(ValidateModelConfig(c).message(), HasSubstr("context: 65537"));
  c = ModelConfig{};
  c.mlp_ratio = 0;
  EXPECT_THAT(ValidateModelConfig(c).message(), HasSubstr("mlp_ratio: 0"));
  c = ModelConfig{};
  c.heads = 128;
  EXPECT_THAT(ValidateModelConfig(c).message(), HasSubstr("heads: 128"));
  // Each field in range, but far too many parameters in all.
  c = ModelConfig{
      .layers = 256, .d_model = 16384, .heads = 16, .context = 1024, .vocab = 1024, .mlp_ratio = 4};
  EXPECT_THAT(ValidateModelConfig(c).message(), HasSubstr("parameters"));
}

TEST(ModelConfig, LayoutIsContiguousAndCountsMatchTheFormula) {
  const ModelConfig c{
      .layers = 3, .d_model = 32, .heads = 4, .context = 16, .vocab = 100, .mlp_ratio = 4};
  const std::vector<TensorSpec> layout = ParameterLayout(c);
  ASSERT_EQ(layout.size(), 2u + 12u * 3 + 2);
  EXPECT_EQ(layout.front().name, "wte.weight");
  EXPECT_EQ(layout[1].name, "wpe.weight");
  EXPECT_EQ(layout[2].name, "blocks.0.ln1.weight");
  EXPECT_EQ(layout[4].name, "blocks.0.attn.qkv.weight");
  EXPECT_EQ(layout[4].shape, (std::vector<uint32_t>{96, 32}));
  EXPECT_EQ(layout.back().name, "ln_f.bias");
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const TensorSpec& t : layout) {
    EXPECT_EQ(t.offset, offset) << t.name;
    offset += t.numel;
    EXPECT_TRUE(names.insert(t.name).second) << t.name;
  }
  const uint64_t d = 32, h = 128;
  const uint64_t block = 4 * d + 3 * d * d + 3 * d + d * d + d + 2 * h * d + h + d;
  EXPECT_EQ(offset, 100 * d + 16 * d + 3 * block + 2 * d);
  EXPECT_EQ(ParameterCount(c), offset);
}

TEST(ModelConfig, InitIsDeterministicAndFollowsTheScheme) {
  const ModelConfig c{
      .layers = 2, .d_model = 64, .heads = 4, .context = 32, .vocab = 256, .mlp_ratio = 4};
  const std::vector<float> a = InitParams(c, 7), b = InitParams(c, 7), other = InitParams(c, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  for (const TensorSpec& t : ParameterLayout(c)) {
    double sum = 0, sq = 0;
    for (uint64_t i = 0; i < t.numel; ++i) {
      sum += a[t.offset + i];
      sq += double{a[t.offset + i]} * a[t.offset + i];
    }
    const double mean = sum / t.numel, std = std::sqrt(sq / t.numel - mean * mean);
    if (t.shape.size() == 1) {
      const bool ln_weight = t.name.ends_with(".weight");
      EXPECT_EQ(mean, ln_weight ? 1.0 : 0.0) << t.name;
      EXPECT_EQ(std, 0.0) << t.name;
    } else {
      const bool residual = t.name.ends_with("proj.weight") && t.name.find("blocks") == 0;
      const double want = residual ? 0.02 / std::sqrt(4.0) : 0.02;
      EXPECT_NEAR(std, want, want * 0.1) << t.name;
      EXPECT_NEAR(mean, 0.0, want * 0.1) << t.name;
    }
  }
}

const ModelConfig kLlama{.family = ModelFamily::kLlama,
                         .layers = 2,
                         .d_model = 32,
                         .heads = 4,
                         .context = 16,
                         .vocab = 100,
                         .mlp_ratio = 0,
                         .kv_heads = 2,
                         .mlp_hidden = 48,
                         .rope_theta = 10000,
                         .norm_eps = 1e-5f,
                         .tie_embeddings = false};

TEST(ModelConfig, LlamaRefusesNamingFieldAndValue) {
  EXPECT_TRUE(ValidateModelConfig(kLlama).ok()) << ValidateModelConfig(kLlama);
  auto refused = [](ModelConfig c, std::string_view want) {
    absl::Status s = ValidateModelConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_THAT(s.message(), HasSubstr(want));
  };
  ModelConfig c = kLlama;
  c.kv_heads = 3;
  refused(c, "kv_heads: 3 does not divide heads 4");
  c = kLlama;
  c.kv_heads = 0;
  refused(c, "kv_heads: 0 is outside 1..4");
  c = kLlama;
  c.mlp_hidden = 0;
  refused(c, "mlp_hidden: 0");
  c = kLlama;
  c.rope_theta = std::nanf("");
  refused(c, "rope_theta: nan");
  c = kLlama;
  c.norm_eps = 0.5f;
  refused(c, "norm_eps: 0.5");
  c = kLlama;
  c.mlp_ratio = 4;
  refused(c, "mlp_ratio: not a field of the llama family");
  c = kLlama;
  c.heads = 8;  // head width 4 is fine; 16 heads of width 2 too; odd widths are not
  c.d_model = 24;
  c.kv_heads = 4;
  refused(c, "head width of 3");
  // A llama field on a gpt config.
  ModelConfig g;
  g.kv_heads = 2;
  refused(g, "kv_heads: not a field of the gpt family");
  g = ModelConfig{};
  g.tie_embeddings = true;
  refused(g, "tie_embeddings: not a field of the gpt family");
  ModelConfig f = kLlama;
  f.family = static_cast<ModelFamily>(7);
  refused(f, "family: 7");
}

TEST(ModelConfig, LlamaLayoutIsHuggingFacesAndCountsMatch) {
  const std::vector<TensorSpec> layout = ParameterLayout(kLlama);
  ASSERT_EQ(layout.size(), 1u + 9u * 2 + 2);
  EXPECT_EQ(layout[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(layout[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(layout[1].shape, (std::vector<uint32_t>{32, 32}));
  EXPECT_EQ(layout[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(layout[2].shape, (std::vector<uint32_t>{16, 32}));  // 2 kv heads of width 8
  EXPECT_EQ(layout[4].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(layout[5].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(layout[7].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(layout[7].shape, (std::vector<uint32_t>{32, 48}));
  EXPECT_EQ(layout[8].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(layout[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(layout[19].name, "model.norm.weight");
  EXPECT_EQ(layout[20].name, "lm_head.weight");
  const uint64_t d = 32, per_layer = 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 32 * 48 + 2 * 32;
  EXPECT_EQ(ParameterCount(kLlama), 2 * 100 * d + 2 * per_layer + d);
  ModelConfig tied = kLlama;
  tied.tie_embeddings = true;
  EXPECT_EQ(ParameterLayout(tied).back().name, "model.norm.weight");
  EXPECT_EQ(ParameterCount(tied), ParameterCount(kLlama) - 100 * d);
}

TEST(ModelConfig, PresetsHaveTheirSizes) {
  // Parameter counts at a 32,000-token vocabulary, as docs/worker.md "Presets" lists them.
  const std::pair<std::string_view, uint64_t> want[] = {
      {"20m", 21'730'176}, {"125m", 128'404'224}, {"350m", 334'808'064}, {"1b", 1'038'682'112}};
  for (const auto& [name, count] : want) {
    auto c = PresetConfig(name, 32000, 1024);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->family, ModelFamily::kLlama);
    EXPECT_EQ(ParameterCount(*c), count) << name;
  }
  auto tiny = PresetConfig("tiny", 384, 32);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_LT(ParameterCount(*tiny), 200'000u);
  auto unknown = PresetConfig("7b", 32000, 1024);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("\"7b\" is not one of tiny, 20m"));
  EXPECT_THAT(PresetConfig("20m", 1, 1024).status().message(), HasSubstr("vocab: 1"));
}

TEST(ModelConfig, ActivationEstimateFollowsTheMeasuredPeaks) {
  // The activations train_bench.py measured (docs/benchmarks.md "Training throughput and
  // memory": one pass of 8 windows of 129 tokens, fp32, libtorch 1.13's written-out attention):
  // 731 MiB at 20m, 1,427 MiB at 125m. The estimate is within a fifth of both.
  const ActivationShape shape{.rows = 8, .cols = 129};
  for (const auto& [name, measured_mib] : {std::pair{"20m", 731.0}, std::pair{"125m", 1427.0}}) {
    auto c = PresetConfig(name, 32000, 128);
    ASSERT_TRUE(c.ok()) << c.status();
    const double mib = static_cast<double>(ActivationBytes(*c, shape)) / (1 << 20);
    EXPECT_GT(mib, 0.8 * measured_mib) << name;
    EXPECT_LT(mib, 1.2 * measured_mib) << name;
  }
  auto c = PresetConfig("125m", 32000, 128);
  ASSERT_TRUE(c.ok());
  const uint64_t plain = ActivationBytes(*c, shape);
  // Twice the rows, twice the bytes; checkpointing, bf16 and fused attention each hold less.
  EXPECT_EQ(ActivationBytes(*c, {.rows = 16, .cols = 129}), 2 * plain);
  EXPECT_LT(ActivationBytes(*c, {.rows = 8, .cols = 129, .checkpointing = true}), plain / 2);
  EXPECT_LT(ActivationBytes(*c, {.rows = 8, .cols = 129, .bf16 = true}), plain);
  EXPECT_LT(ActivationBytes(*c, {.rows = 8, .cols = 129, .fused_attention = true}), plain);
}

TEST(ModelConfig, LlamaInitScalesTheResidualProjections) {
  const std::vector<float> a = InitParams(kLlama, 3);
  for (const TensorSpec& t : ParameterLayout(kLlama)) {
    double sq = 0;
    for (uint64_t i = 0; i < t.numel; ++i) sq += double{a[t.offset + i]} * a[t.offset + i];
    const double rms = std::sqrt(sq / t.numel);
    if (t.shape.size() == 1) {
      EXPECT_EQ(rms, 1.0) << t.name;  // RMSNorm weights
    } else {
      const bool residual =
          t.name.ends_with("o_proj.weight") || t.name.ends_with("down_proj.weight");
      const double want = residual ? 0.02 / std::sqrt(4.0) : 0.02;
      EXPECT_NEAR(rms, want, want * 0.15) << t.name;
    }
  }
}

}  // namespace
}  // namespace ts::worker
