#include "worker/client/model_spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::worker {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;

pb::ModelSpec Llama() {
  pb::ModelSpec spec;
  spec.set_kind("llama");
  pb::WorkerModelConfig* c = spec.mutable_config();
  c->set_layers(2);
  c->set_d_model(64);
  c->set_heads(4);
  c->set_kv_heads(2);
  c->set_mlp_hidden(176);
  c->set_context(32);
  c->set_vocab(384);
  c->set_rope_theta(10000);
  c->set_norm_eps(1e-5f);
  c->set_tie_embeddings(true);
  return spec;
}

void ExpectRefused(const pb::ModelSpec& spec, std::string_view want) {
  auto config = ModelConfigFromSpec(spec);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << want;
  EXPECT_THAT(config.status().message(), HasSubstr(want));
}

TEST(ModelSpec, ExplicitAndPresetConfigs) {
  auto explicit_config = ModelConfigFromSpec(Llama());
  ASSERT_TRUE(explicit_config.ok()) << explicit_config.status();
  EXPECT_EQ(explicit_config->family, ModelFamily::kLlama);
  EXPECT_EQ(explicit_config->kv_heads, 2u);

  pb::ModelSpec preset;
  preset.set_kind("llama");
  preset.set_preset("tiny");
  preset.mutable_config()->set_vocab(384);
  preset.mutable_config()->set_context(32);
  auto from_preset = ModelConfigFromSpec(preset);
  ASSERT_TRUE(from_preset.ok()) << from_preset.status();
  // The tiny preset is the explicit config above.
  EXPECT_EQ(*from_preset, *explicit_config);

  // Back to the proto and again: the same config.
  pb::ModelSpec round_trip;
  round_trip.set_kind("llama");
  ModelConfigToProto(*from_preset, round_trip.mutable_config());
  EXPECT_EQ(ModelConfigFromSpec(round_trip).value(), *from_preset);
}

TEST(ModelSpec, EveryBadFieldIsNamedWithItsValue) {
  pb::ModelSpec spec = Llama();
  spec.set_kind("rwkv");
  ExpectRefused(spec, "model.kind: \"rwkv\" is not a known model (known: gpt, llama)");
  spec = Llama();
  spec.clear_kind();
  ExpectRefused(spec, "model.kind: missing");
  spec = Llama();
  spec.mutable_config()->set_kv_heads(3);
  ExpectRefused(spec, "model.config.kv_heads: 3 does not divide heads 4");
  spec = Llama();
  spec.mutable_config()->set_norm_eps(-1);
  ExpectRefused(spec, "model.config.norm_eps: -1");
  spec = Llama();
  spec.mutable_config()->set_mlp_ratio(4);
  ExpectRefused(spec, "model.config.mlp_ratio: not a field of the llama family");

  pb::ModelSpec preset;
  preset.set_kind("llama");
  preset.set_preset("13b");
  preset.mutable_config()->set_vocab(384);
  preset.mutable_config()->set_context(32);
  ExpectRefused(preset, "model.preset: \"13b\" is not one of tiny, 20m, 125m, 350m, 1b");
  preset.set_preset("20m");
  preset.mutable_config()->set_layers(3);
  ExpectRefused(preset, "may give only vocab and context");
  preset.mutable_config()->set_layers(0);
  preset.mutable_config()->set_context(0);
  ExpectRefused(preset, "model.config.context: 0");
  preset.set_kind("gpt");
  ExpectRefused(preset, "model.preset: \"20m\" is a llama size");
}

TEST(TrainingSpec, ChecksEveryFieldAgainstTheRun) {
  pb::TrainingSpec spec;
  auto plain = TrainingFromSpec(spec, /*batch_size=*/8, /*total_steps=*/100);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->micro_batch, 0u);
  EXPECT_FALSE(plain->cosine);
  EXPECT_FALSE(plain->bf16);

  spec.set_micro_batch(4);
  spec.set_schedule("cosine");
  spec.set_warmup_steps(10);
  spec.set_min_lr_ratio(0.1f);
  spec.set_activation_checkpointing(true);
  spec.set_precision("bf16");
  auto full = TrainingFromSpec(spec, 8, 100);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->micro_batch, 4u);
  EXPECT_TRUE(full->cosine && full->activation_checkpointing && full->bf16);

  auto refused = [](const pb::TrainingSpec& s, std::string_view want) {
    auto r = TrainingFromSpec(s, 8, 100);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_THAT(r.status().message(), HasSubstr(want));
  };
  pb::TrainingSpec bad = spec;
  bad.set_micro_batch(3);
  refused(bad, "training.micro_batch: 3 does not divide batch_size 8");
  bad = spec;
  bad.set_micro_batch(16);
  refused(bad, "training.micro_batch: 16");
  bad = spec;
  bad.set_schedule("linear");
  refused(bad, "training.schedule: \"linear\"");
  bad = spec;
  bad.set_min_lr_ratio(1.5f);
  refused(bad, "training.min_lr_ratio: 1.5 is outside 0..1");
  bad = spec;
  bad.set_schedule("constant");
  refused(bad, "min_lr_ratio: 0.1 is for the \"cosine\" schedule only");
  bad = spec;
  bad.set_warmup_steps(101);
  refused(bad, "training.warmup_steps: 101 is more than the run's 100 inner steps");
  bad = spec;
  bad.set_precision("fp8");
  refused(bad, "training.precision: \"fp8\"");
}

}  // namespace
}  // namespace ts::worker
