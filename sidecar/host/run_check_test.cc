#include "sidecar/host/run_check.h"

#include <cstdlib>
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
  "model": {"kind": "llama", "preset": "tiny", "seed": "7", "config": {"context": 32, "vocab": 512}},
  "data": {"corpus": "fortunes", "files": 4, "vocab": 512, "shardTokens": 8192, "evalEvery": 20},
  "rounds": 4, "innerSteps": 10, "batchSize": 8,
  "inner": {"lr": 0.003, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weightDecay": 0.1,
            "gradClipNorm": 1.0},
  "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
  "codec": "int8", "aggregation": "mean", "evalEvery": 2, "evalBatchSize": 16, "seed": "5"
})";

pb::ShardSpec SpecWith(const std::string& run_spec) {
  pb::ShardSpec spec;
  spec.set_run_spec(run_spec);
  spec.set_run_spec_hash(common::Sha256(run_spec));
  return spec;
}

class RunCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-runcheck-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    limits_.fortunes_dir = dir_template;  // a folder that exists stands in for the package's
    limits_.worker_memory_bytes_max = uint64_t{1} << 30;
  }
  void TearDown() override { std::system(("rm -rf " + limits_.fortunes_dir).c_str()); }
  RunCheckLimits limits_;
};

TEST_F(RunCheckTest, ARunnableSpecAndAShardWithoutOnePass) {
  EXPECT_EQ(RunSpecSkipReason(SpecWith(kSpec), limits_), "");
  // No document on chain: the operators hand the run over themselves.
  EXPECT_EQ(RunSpecSkipReason(pb::ShardSpec(), limits_), "");
}

TEST_F(RunCheckTest, ADocumentThatDoesNotCheckIsRefusedWithItsField) {
  EXPECT_THAT(RunSpecSkipReason(SpecWith("{not json"), limits_), HasSubstr("run spec: "));
  const std::string unknown = absl::StrReplaceAll(kSpec, {{R"("llama")", R"("mamba")"}});
  EXPECT_THAT(RunSpecSkipReason(SpecWith(unknown), limits_), HasSubstr("model.kind: \"mamba\""));
  const std::string bad_shape =
      absl::StrReplaceAll(kSpec, {{R"("vocab": 512})", R"("vocab": 0})"}});
  ASSERT_NE(bad_shape, kSpec);
  EXPECT_THAT(RunSpecSkipReason(SpecWith(bad_shape), limits_), HasSubstr("vocab"));
}

TEST_F(RunCheckTest, AModelLargerThanTheDeclaredMemoryIsRefusedWithBothNumbers) {
  const std::string big = absl::StrReplaceAll(
      kSpec, {{R"("preset": "tiny", "seed": "7", "config": {"context": 32, "vocab": 512})",
               R"("preset": "1b", "seed": "7", "config": {"context": 32, "vocab": 512})"}});
  ASSERT_NE(big, kSpec);
  const std::string reason = RunSpecSkipReason(SpecWith(big), limits_);
  EXPECT_THAT(reason, HasSubstr("bytes of fp32 training state"));
  EXPECT_THAT(reason, HasSubstr("1073741824 bytes of worker_memory_bytes_max"));
  // The same model with room for it passes.
  limits_.worker_memory_bytes_max = uint64_t{1} << 40;
  EXPECT_EQ(RunSpecSkipReason(SpecWith(big), limits_), "");
}

TEST_F(RunCheckTest, TheRequiredDeviceMustBeTheWorkers) {
  auto with_device = [](const std::string& device) {
    return absl::StrReplaceAll(
        kSpec,
        {{R"("seed": "5")", R"("seed": "5", "requirements": {"device": ")" + device + R"("})"}});
  };
  // A CPU host runs "cpu" and "any" specs and refuses "cuda" ones.
  EXPECT_EQ(RunSpecSkipReason(SpecWith(with_device("cpu")), limits_), "");
  EXPECT_EQ(RunSpecSkipReason(SpecWith(with_device("any")), limits_), "");
  EXPECT_EQ(RunSpecSkipReason(SpecWith(with_device("cuda")), limits_),
            "run spec: requirements.device \"cuda\" is not where this host's workers train (cpu)");
  // A GPU host the other way round.
  limits_.device = {.device = worker::Device::kCuda,
                    .name = "NVIDIA H200",
                    .memory_bytes = uint64_t{140} << 30,
                    .free_bytes = uint64_t{139} << 30};
  limits_.worker_memory_bytes_max = 0;  // the GPU's memory, then
  EXPECT_EQ(RunSpecSkipReason(SpecWith(with_device("cuda")), limits_), "");
  EXPECT_THAT(RunSpecSkipReason(SpecWith(with_device("cpu")), limits_),
              HasSubstr("requirements.device \"cpu\" is not where this host's workers train"));
  // A spec that replays (the default aggregation's default) and names no device is a CPU run:
  // replays reproduce steps bit for bit only within one determinism class.
  const std::string replaying = absl::StrReplaceAll(kSpec, {{R"("aggregation": "mean", )", ""}});
  ASSERT_NE(replaying, kSpec);
  EXPECT_THAT(RunSpecSkipReason(SpecWith(replaying), limits_),
              HasSubstr("requirements.device \"cpu\" is not where this host's workers train"));
  // A device no host has is refused by the document's own check.
  EXPECT_THAT(RunSpecSkipReason(SpecWith(with_device("tpu")), limits_),
              HasSubstr("requirements.device: \"tpu\" is not one of any, cpu, cuda"));
  // The GPU's memory bounds the model: 1 B parameters' state fits 140 GiB, not 10 GiB.
  const std::string big =
      absl::StrReplaceAll(with_device("cuda"), {{R"("preset": "tiny")", R"("preset": "1b")"}});
  EXPECT_EQ(RunSpecSkipReason(SpecWith(big), limits_), "");
  limits_.device.memory_bytes = uint64_t{10} << 30;
  EXPECT_THAT(RunSpecSkipReason(SpecWith(big), limits_),
              HasSubstr("more than the 10737418240 bytes of NVIDIA H200"));
}

TEST_F(RunCheckTest, TheActivationsOfTheSpecsPassesCountToo) {
  // 20m at 32 k vocabulary, context 128: its state fits 1 GiB (16 × 21.7 M = 348 MB); with 64
  // windows a pass its activations do not, with micro-batches of 4 they do.
  const std::string spec = absl::StrReplaceAll(
      kSpec, {{R"("preset": "tiny", "seed": "7", "config": {"context": 32, "vocab": 512})",
               R"("preset": "20m", "seed": "7", "config": {"context": 128, "vocab": 32000})"},
              {R"("vocab": 512, "shardTokens")", R"("vocab": 32000, "shardTokens")"},
              {R"("batchSize": 8)", R"("batchSize": 64)"}});
  const std::string reason = RunSpecSkipReason(SpecWith(spec), limits_);
  EXPECT_THAT(reason, HasSubstr("activations "));
  EXPECT_THAT(reason, HasSubstr("for passes of 64 x 129 tokens), more than the 1073741824 bytes "
                                "of worker_memory_bytes_max"));
  const std::string micro = absl::StrReplaceAll(
      spec, {{R"("seed": "5")", R"("seed": "5", "training": {"microBatch": 4})"}});
  EXPECT_EQ(RunSpecSkipReason(SpecWith(micro), limits_), "");
}

TEST_F(RunCheckTest, TheEmbeddedCorpusMustBeInstalled) {
  limits_.fortunes_dir += "/absent";
  EXPECT_THAT(RunSpecSkipReason(SpecWith(kSpec), limits_),
              HasSubstr("data.corpus \"fortunes\" needs " + limits_.fortunes_dir));
}

}  // namespace
}  // namespace ts::sidecar
