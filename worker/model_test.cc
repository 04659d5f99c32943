#include "worker/model.h"

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

}  // namespace
}  // namespace ts::worker
