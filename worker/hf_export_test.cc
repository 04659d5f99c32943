#include "worker/hf_export.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/crypto/hash.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint.h"

namespace ts::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const ModelConfig kLlama{.family = ModelFamily::kLlama,
                         .layers = 2,
                         .d_model = 8,
                         .heads = 2,
                         .context = 4,
                         .vocab = 10,
                         .mlp_ratio = 0,
                         .kv_heads = 1,
                         .mlp_hidden = 12,
                         .rope_theta = 10000,
                         .norm_eps = 1e-5f,
                         .tie_embeddings = false};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class HfExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-hfexport-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
    return dir_ + "/" + name;
  }
  std::string dir_;
};

// The file is read back here with the format's own rules (length, JSON header, buffers): every
// tensor under its Llama name and shape, its bytes the checkpoint's values; the momentum is not
// exported; config.json says what the model is.
TEST_F(HfExportTest, SafetensorsHoldEveryTensorUnderItsLlamaName) {
  Checkpoint ck{kLlama, InitParams(kLlama, 3), std::vector<float>(ParameterCount(kLlama), 0.5f)};
  const std::string encoded = EncodeCheckpoint(ck);
  HfExportOptions options;
  options.checkpoint_file = Write("ck.tsck", encoded);
  options.tokenizer_file = Write("tok.model", "sentencepiece bytes");
  options.out_dir = dir_ + "/out";
  auto result = ExportHuggingFace(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->root, common::Sha256(encoded));
  EXPECT_EQ(result->parameters, ParameterCount(kLlama));

  const std::string file = ReadAll(dir_ + "/out/model.safetensors");
  EXPECT_EQ(file.size(), result->safetensors_bytes);
  ASSERT_GE(file.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, file.size());
  auto header = nlohmann::json::parse(file.substr(8, n));
  const std::string data = file.substr(8 + n);
  EXPECT_EQ(data.size(), 4 * ParameterCount(kLlama));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  size_t seen = 0;
  for (const TensorSpec& t : ParameterLayout(kLlama)) {
    ASSERT_TRUE(header.contains(t.name)) << t.name;
    const auto& entry = header[t.name];
    EXPECT_EQ(entry["dtype"], "F32");
    EXPECT_EQ(entry["shape"].get<std::vector<uint32_t>>(), t.shape) << t.name;
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    ASSERT_EQ(end - begin, 4 * t.numel) << t.name;
    EXPECT_EQ(std::memcmp(data.data() + begin, ck.params.data() + t.offset, 4 * t.numel), 0)
        << t.name;
    ++seen;
  }
  EXPECT_EQ(header.size(), seen + 1);  // and the metadata, nothing else
  EXPECT_TRUE(header.contains("lm_head.weight"));
  EXPECT_TRUE(header.contains("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_EQ(header["model.layers.1.self_attn.k_proj.weight"]["shape"],
            nlohmann::json::array({4, 8}));  // kv_heads · head width, d

  auto config = nlohmann::json::parse(ReadAll(dir_ + "/out/config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["hidden_size"], 8);
  EXPECT_EQ(config["intermediate_size"], 12);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["num_attention_heads"], 2);
  EXPECT_EQ(config["num_key_value_heads"], 1);
  EXPECT_EQ(config["vocab_size"], 10);
  EXPECT_EQ(config["max_position_embeddings"], 4);
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);
  EXPECT_EQ(config["rope_theta"], 10000.0);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(ReadAll(dir_ + "/out/tokenizer.model"), "sentencepiece bytes");
}

TEST_F(HfExportTest, ATiedModelHasNoHeadTensor) {
  ModelConfig tied = kLlama;
  tied.tie_embeddings = true;
  HfExportOptions options;
  options.checkpoint_file = Write("ck.tsck", EncodeCheckpoint({tied, InitParams(tied, 1), {}}));
  options.out_dir = dir_ + "/out";
  ASSERT_TRUE(ExportHuggingFace(options).ok());
  const std::string header = SafetensorsHeader(tied);
  EXPECT_THAT(header, Not(HasSubstr("lm_head")));
  EXPECT_EQ(ReadAll(dir_ + "/out/model.safetensors").substr(8, header.size()), header);
  EXPECT_EQ(nlohmann::json::parse(ReadAll(dir_ + "/out/config.json"))["tie_word_embeddings"], true);
}

// Bad input: named, and nothing left behind — no out folder, no partial folder beside it.
TEST_F(HfExportTest, BadInputIsNamedAndLeavesNothing) {
  auto nothing_left = [&] {
    int entries = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      entries +=
          e.path().filename().string().rfind(".partial-", 0) == 0 || e.path().filename() == "out";
    }
    return entries == 0;
  };
  HfExportOptions options;
  options.out_dir = dir_ + "/out";
  options.checkpoint_file = dir_ + "/absent.tsck";
  EXPECT_EQ(ExportHuggingFace(options).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(nothing_left());

  ModelConfig gpt;
  options.checkpoint_file = Write("gpt.tsck", EncodeCheckpoint({gpt, InitParams(gpt, 1), {}}));
  auto refused = ExportHuggingFace(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("only the llama family"));
  EXPECT_TRUE(nothing_left());

  std::string encoded = EncodeCheckpoint({kLlama, InitParams(kLlama, 3), {}});
  options.checkpoint_file = Write("short.tsck", encoded.substr(0, encoded.size() - 4));
  refused = ExportHuggingFace(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("short.tsck"));
  EXPECT_TRUE(nothing_left());

  // A NaN among the values: found while streaming, after the safetensors file was begun.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(encoded.data() + encoded.size() - 4, &nan, 4);
  options.checkpoint_file = Write("nan.tsck", encoded);
  refused = ExportHuggingFace(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(nothing_left());

  options.checkpoint_file = Write("ok.tsck", EncodeCheckpoint({kLlama, InitParams(kLlama, 3), {}}));
  options.tokenizer_file = dir_ + "/absent.model";
  EXPECT_EQ(ExportHuggingFace(options).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(nothing_left());

  options.tokenizer_file.clear();
  std::filesystem::create_directory(dir_ + "/out");
  EXPECT_EQ(ExportHuggingFace(options).status().code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace ts::worker
