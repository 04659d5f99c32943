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

}  // namespace
}  // namespace ts::worker
