#include "worker/model.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ts::worker {
namespace {

const ModelConfig kSmall{
    .layers = 2, .d_model = 32, .heads = 4, .context = 16, .vocab = 50, .mlp_ratio = 4};

TEST(Model, ParametersAreTheLayout) {
  Gpt model(kSmall);
  const auto named = model->named_parameters();
  const std::vector<TensorSpec> layout = ParameterLayout(kSmall);
  ASSERT_EQ(named.size(), layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(named[i].key(), layout[i].name);
    EXPECT_EQ(named[i].value().sizes().vec(),
              std::vector<int64_t>(layout[i].shape.begin(), layout[i].shape.end()));
  }
  EXPECT_EQ(model->buffers().size(), 2u);  // the causal masks, not parameters
}

TEST(Model, LoadAndStoreTheFlatVector) {
  Gpt model(kSmall);
  const std::vector<float> flat = InitParams(kSmall, 11);
  ASSERT_TRUE(LoadParams(*model, flat).ok());
  EXPECT_EQ(StoreParams(*model), flat);
  // The first value is wte.weight[0][0], the last ln_f.bias[d - 1].
  EXPECT_EQ(model->named_parameters()["wte.weight"][0][0].item<float>(), flat.front());
  EXPECT_EQ(model->named_parameters()["ln_f.bias"][31].item<float>(), flat.back());
  EXPECT_EQ(LoadParams(*model, std::vector<float>(5)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Model, IsCausalAndHasTheRightShape) {
  torch::manual_seed(0);
  Gpt model(kSmall);
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor a = torch::randint(0, kSmall.vocab, {2, 16}, torch::kLong);
  torch::Tensor b = a.clone();
  b.index_put_({torch::indexing::Slice(), 10},
               (a.index({torch::indexing::Slice(), 10}) + 1) % int64_t{kSmall.vocab});
  const torch::Tensor la = model->forward(a), lb = model->forward(b);
  EXPECT_EQ(la.sizes().vec(), (std::vector<int64_t>{2, 16, 50}));
  // Positions before the changed token see exactly the same logits; the changed one differs.
  EXPECT_TRUE(torch::equal(la.slice(1, 0, 10), lb.slice(1, 0, 10)));
  EXPECT_FALSE(torch::allclose(la.slice(1, 10, 11), lb.slice(1, 10, 11)));
  // Shorter sequences than the context work (the mask is sliced).
  EXPECT_EQ(model->forward(a.slice(1, 0, 5)).size(1), 5);
}

ModelConfig Llama(bool tied) {
  return ModelConfig{.family = ModelFamily::kLlama,
                     .layers = 2,
                     .d_model = 32,
                     .heads = 4,
                     .context = 16,
                     .vocab = 50,
                     .mlp_ratio = 0,
                     .kv_heads = 2,
                     .mlp_hidden = 40,
                     .rope_theta = 10000,
                     .norm_eps = 1e-5f,
                     .tie_embeddings = tied};
}

TEST(LlamaModel, ParametersAreTheLayoutTiedOrNot) {
  for (bool tied : {false, true}) {
    const ModelConfig c = Llama(tied);
    std::shared_ptr<LanguageModel> model = MakeModel(c);
    const auto named = model->named_parameters();
    const std::vector<TensorSpec> layout = ParameterLayout(c);
    ASSERT_EQ(named.size(), layout.size());
    for (size_t i = 0; i < layout.size(); ++i) {
      EXPECT_EQ(named[i].key(), layout[i].name);
      EXPECT_EQ(named[i].value().sizes().vec(),
                std::vector<int64_t>(layout[i].shape.begin(), layout[i].shape.end()));
    }
    const std::vector<float> flat = InitParams(c, 5);
    ASSERT_TRUE(LoadParams(*model, flat).ok());
    EXPECT_EQ(StoreParams(*model), flat);
  }
}

TEST(LlamaModel, IsCausalAndTheTiedHeadIsTheEmbedding) {
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  std::shared_ptr<LanguageModel> model = MakeModel(Llama(/*tied=*/true));
  ASSERT_TRUE(LoadParams(*model, InitParams(Llama(true), 9)).ok());
  model->eval();
  torch::Tensor a = torch::randint(0, 50, {2, 16}, torch::kLong);
  torch::Tensor b = a.clone();
  b.index_put_({torch::indexing::Slice(), 10}, (a.index({torch::indexing::Slice(), 10}) + 1) % 50);
  const torch::Tensor la = model->Logits(a), lb = model->Logits(b);
  EXPECT_EQ(la.sizes().vec(), (std::vector<int64_t>{2, 16, 50}));
  EXPECT_TRUE(torch::allclose(la.slice(1, 0, 10), lb.slice(1, 0, 10), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(la.slice(1, 10, 11), lb.slice(1, 10, 11)));
  // A prefix gives the prefix's logits: positions are absolute (rotary), not learned per length.
  EXPECT_TRUE(torch::allclose(model->Logits(a.slice(1, 0, 5)), la.slice(1, 0, 5), 0, 1e-5));
  // Tied: scaling the embedding's row of a token scales nothing else of the head's output row
  // but that token's column.
  auto params = model->named_parameters();
  params["model.embed_tokens.weight"][7].mul_(2);
  const torch::Tensor lc = model->Logits(a);
  EXPECT_FALSE(torch::allclose(lc, la));
}

TEST(LlamaModel, RotaryTablesAreHuggingFaces) {
  auto [cos, sin] = RotaryTables(/*context=*/4, /*head_dim=*/4, /*theta=*/10000);
  ASSERT_EQ(cos.sizes().vec(), (std::vector<int64_t>{4, 4}));
  // inv_freq = [1, 1/100]; position 2: angles [2, 0.02, 2, 0.02].
  EXPECT_NEAR(cos[2][0].item<float>(), std::cos(2.0f), 1e-6);
  EXPECT_NEAR(cos[2][1].item<float>(), std::cos(0.02f), 1e-6);
  EXPECT_NEAR(sin[2][2].item<float>(), std::sin(2.0f), 1e-6);
  EXPECT_NEAR(sin[2][3].item<float>(), std::sin(0.02f), 1e-6);
  EXPECT_EQ(cos[0][0].item<float>(), 1.0f);
}

}  // namespace
}  // namespace ts::worker
