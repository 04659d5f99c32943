#include "worker/checkpoint.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/hex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

const ModelConfig kTiny{
    .layers = 1, .d_model = 8, .heads = 2, .context = 4, .vocab = 10, .mlp_ratio = 2};

Checkpoint Make(bool momentum) {
  Checkpoint ck{kTiny, InitParams(kTiny, 1), std::nullopt};
  if (momentum) {
    ck.momentum.emplace(ck.params.size());
    for (size_t i = 0; i < ck.momentum->size(); ++i) (*ck.momentum)[i] = 0.001f * i;
  }
  return ck;
}

TEST(Checkpoint, RoundTripsWithAndWithoutMomentum) {
  for (bool momentum : {false, true}) {
    const Checkpoint ck = Make(momentum);
    const std::string bytes = EncodeCheckpoint(ck);
    absl::StatusOr<Checkpoint> back = DecodeCheckpoint(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->config, ck.config);
    EXPECT_EQ(back->params, ck.params);
    EXPECT_EQ(back->momentum, ck.momentum);
    EXPECT_EQ(EncodeCheckpoint(*back), bytes);
    EXPECT_EQ(CheckpointRoot(bytes).size(), 32u);
  }
  EXPECT_NE(CheckpointRootOf(Make(false)), CheckpointRootOf(Make(true)));
}

TEST(Checkpoint, HeaderBytesAreAsDocumented) {
  const std::string bytes = EncodeCheckpoint(Make(false));
  EXPECT_EQ(bytes.substr(0, 4), "TSCK");
  EXPECT_EQ(bytes.substr(4, 4), std::string("\x01\x00\x00\x00", 4));       // version
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x01\x00\x00\x00", 4));       // layers
  EXPECT_EQ(bytes.substr(12, 4), std::string("\x08\x00\x00\x00", 4));      // d_model
  EXPECT_EQ(bytes.substr(36, 4), std::string("\x10\x00\x00\x00", 4));      // 16 tensors
  EXPECT_EQ(bytes.substr(40, 12), std::string("\x0a\x00wte.weight", 12));  // name
  EXPECT_EQ(bytes.substr(52, 9), std::string("\x02\x0a\x00\x00\x00\x08\x00\x00\x00", 9));
  // The values are the last 4·N bytes, little-endian.
  const uint64_t n = ParameterCount(kTiny);
  float first;
  std::memcpy(&first, bytes.data() + bytes.size() - 4 * n, 4);
  EXPECT_EQ(first, Make(false).params[0]);
}

TEST(Checkpoint, KnownRoot) {
  // A fixed input pins the encoding: a change of format must change this root (and the version).
  Checkpoint ck{kTiny, std::vector<float>(ParameterCount(kTiny), 0.5f), std::nullopt};
  EXPECT_EQ(common::HexEncode(CheckpointRootOf(ck)),
            "16d7f6e41a13c10a80d85ef2fd8d6fd060a8b6b8e47e9cc59f8481dbed1dd073");
  EXPECT_EQ(CheckpointRootOf(ck), CheckpointRootOf(ck));
}

TEST(Checkpoint, RefusesBadInput) {
  const std::string good = EncodeCheckpoint(Make(true));
  auto code_and = [](absl::StatusOr<Checkpoint> r, std::string_view want) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_THAT(r.status().message(), HasSubstr(want));
  };
  code_and(DecodeCheckpoint(good, good.size() - 1), "exceed the cap");
  code_and(DecodeCheckpoint(""), "wrong magic");
  std::string b = good;
  b[0] = 'X';
  code_and(DecodeCheckpoint(b), "wrong magic");
  b = good;
  b[4] = 3;
  code_and(DecodeCheckpoint(b), "version 3 is not 1 or 2");
  b = good;
  b[4] = 2;  // a gpt body read as a llama header
  code_and(DecodeCheckpoint(b), "family 1 in a version 2 header");
  b = good;
  b[16] = 3;  // heads 3 does not divide 8
  code_and(DecodeCheckpoint(b), "heads: 3");
  b = good;
  b[32] = 4;
  code_and(DecodeCheckpoint(b), "unknown flags");
  b = good;
  b[36] = 15;
  code_and(DecodeCheckpoint(b), "tensor count 15 is not 16");
  b = good;
  b[42] = 'W';
  code_and(DecodeCheckpoint(b), "tensor 'Wte.weight' where 'wte.weight' belongs");
  b = good;
  b[53] = 11;
  code_and(DecodeCheckpoint(b), "dimension 0 is 11");
  code_and(DecodeCheckpoint(good.substr(0, good.size() - 1)), "bytes of values");
  code_and(DecodeCheckpoint(good + "x"), "bytes of values");
  code_and(DecodeCheckpoint(good.substr(0, 30)), "truncated header");
  code_and(DecodeCheckpoint(good.substr(0, 45)), "truncated tensor table");
  b = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(b.data() + b.size() - 4, &nan, 4);
  code_and(DecodeCheckpoint(b), "momentum[");
  // Dropping the momentum flag makes the value bytes twice too many.
  b = good;
  b[32] = 0;
  code_and(DecodeCheckpoint(b), "bytes of values");
}

const ModelConfig kTinyLlama{.family = ModelFamily::kLlama,
                             .layers = 1,
                             .d_model = 8,
                             .heads = 2,
                             .context = 4,
                             .vocab = 10,
                             .mlp_ratio = 0,
                             .kv_heads = 1,
                             .mlp_hidden = 12,
                             .rope_theta = 500000,
                             .norm_eps = 1e-6f,
                             .tie_embeddings = true};

TEST(Checkpoint, LlamaRoundTripsInVersionTwo) {
  Checkpoint ck{kTinyLlama, InitParams(kTinyLlama, 4), std::vector<float>(0)};
  ck.momentum->assign(ck.params.size(), 0.25f);
  const std::string bytes = EncodeCheckpoint(ck);
  EXPECT_EQ(bytes.substr(4, 4), std::string("\x02\x00\x00\x00", 4));   // version 2
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x02\x00\x00\x00", 4));   // family llama
  EXPECT_EQ(bytes.substr(24, 4), std::string("\x01\x00\x00\x00", 4));  // kv_heads 1
  EXPECT_EQ(bytes.substr(28, 4), std::string("\x0c\x00\x00\x00", 4));  // mlp_hidden 12
  float theta;
  std::memcpy(&theta, bytes.data() + 40, 4);
  EXPECT_EQ(theta, 500000.0f);
  absl::StatusOr<CheckpointHeader> header = DecodeCheckpointHeader(bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->config, kTinyLlama);
  EXPECT_TRUE(header->has_momentum);
  EXPECT_EQ(header->header_bytes + header->value_bytes, bytes.size());
  absl::StatusOr<Checkpoint> back = DecodeCheckpoint(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->config, kTinyLlama);
  EXPECT_EQ(back->params, ck.params);
  EXPECT_EQ(EncodeCheckpoint(*back), bytes);

  std::string b = bytes;
  b[48] = 2;  // tie_embeddings
  EXPECT_THAT(DecodeCheckpoint(b).status().message(), HasSubstr("tie_embeddings 2"));
  b = bytes;
  b[48] = 0;  // untied: one more tensor than the table holds
  EXPECT_THAT(DecodeCheckpoint(b).status().message(), HasSubstr("tensor count"));
  b = bytes;
  b[20] = 3;  // 3 heads of width 8/3
  EXPECT_THAT(DecodeCheckpoint(b).status().message(), HasSubstr("heads: 3 does not divide"));
  // The header alone parses; a prefix inside it does not.
  EXPECT_TRUE(DecodeCheckpointHeader(bytes.substr(0, header->header_bytes)).ok());
  EXPECT_THAT(DecodeCheckpointHeader(bytes.substr(0, header->header_bytes - 1)).status().message(),
              HasSubstr("truncated"));
}

}  // namespace
}  // namespace ts::worker
