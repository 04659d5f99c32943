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

TEST_F(RunCheckTest, TheEmbeddedCorpusMustBeInstalled) {
  limits_.fortunes_dir += "/absent";
  EXPECT_THAT(RunSpecSkipReason(SpecWith(kSpec), limits_),
              HasSubstr("data.corpus \"fortunes\" needs " + limits_.fortunes_dir));
}

}  // namespace
}  // namespace ts::sidecar
