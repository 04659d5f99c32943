#include "worker/data_shard.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

DataShard Shard(uint32_t vocab, size_t n, uint32_t salt = 0) {
  DataShard s{vocab, {}};
  for (size_t i = 0; i < n; ++i) s.tokens.push_back(static_cast<uint32_t>((i * 7 + salt) % vocab));
  return s;
}

TEST(DataShard, RoundTripsWithBothWidths) {
  for (uint32_t vocab : {2u, 1024u, 65536u, 65537u, 1u << 20}) {
    const DataShard s = Shard(vocab, 1000);
    const std::string bytes = EncodeDataShard(s);
    EXPECT_EQ(bytes.size(), kDataShardHeaderSize + 1000 * (vocab <= 65536 ? 2 : 4)) << vocab;
    absl::StatusOr<DataShard> back = DecodeDataShard(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->vocab, vocab);
    EXPECT_EQ(back->tokens, s.tokens);
    EXPECT_EQ(DataShardId(bytes).size(), 32u);
  }
}

TEST(DataShard, HeaderIsAsDocumented) {
  const std::string bytes = EncodeDataShard(DataShard{1024, {1, 2, 1023}});
  EXPECT_EQ(bytes, std::string("TSDS"
                               "\x01\x00\x00\x00"
                               "\x02\x00\x00\x00"
                               "\x00\x04\x00\x00"
                               "\x03\x00\x00\x00\x00\x00\x00\x00"
                               "\x01\x00\x02\x00\xff\x03",
                               30));
}

TEST(DataShard, RefusesBadInput) {
  const std::string good = EncodeDataShard(Shard(1024, 10));
  auto expect = [](absl::StatusOr<DataShard> r, std::string_view want) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_THAT(r.status().message(), HasSubstr(want));
  };
  expect(DecodeDataShard("TSD"), "wrong magic");
  expect(DecodeDataShard(good.substr(0, 20)), "truncated header");
  std::string b = good;
  b[4] = 9;
  expect(DecodeDataShard(b), "version 9");
  b = good;
  b[8] = 4;
  expect(DecodeDataShard(b), "token width 4 is not 2");
  b = good;
  b[12] = b[13] = 0;
  expect(DecodeDataShard(b), "vocab 0");
  expect(DecodeDataShard(good, /*tokens_max=*/9), "10 tokens exceed the cap of 9");
  expect(DecodeDataShard(good.substr(0, good.size() - 1)), "bytes of tokens");
  // A count that would need 2^61 bytes is refused by the cap before anything is allocated.
  b = good;
  b[23] = 0x40;
  expect(DecodeDataShard(b), "exceed the cap");
  b = good;
  b[kDataShardHeaderSize + 3] = 0x04;  // token[1] = 0x0407 >= 1024
  expect(DecodeDataShard(b), "token[1] = 1031 is not below vocab 1024");
}

AssignmentRequest Request() {
  AssignmentRequest r;
  r.data_seed = std::string(32, '\x5a');
  r.round = 3;
  r.host = "gonka1host";
  r.shards = {{std::string(32, 'a'), 100}, {std::string(32, 'b'), 10}, {std::string(32, 'c'), 50}};
  r.steps = 20;
  r.batch_size = 8;
  r.context = 16;
  return r;
}

TEST(Assignment, IsDeterministicAndDependsOnEveryInput) {
  const AssignmentRequest r = Request();
  absl::StatusOr<Assignment> a = AssignBatches(r);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->windows.size(), 160u);
  EXPECT_EQ(AssignBatches(r)->windows, a->windows);
  for (int field = 0; field < 3; ++field) {
    AssignmentRequest other = r;
    if (field == 0) other.data_seed[0] ^= 1;
    if (field == 1) other.round = 4;
    if (field == 2) other.host = "gonka1other";
    EXPECT_NE(AssignBatches(other)->windows, a->windows) << field;
  }
  // Every window lies inside its shard; the 10-token shard has none; both others are used,
  // roughly in proportion to their 84 and 34 windows.
  std::map<uint32_t, int> per_shard;
  for (const Window& w : a->windows) {
    ASSERT_LT(w.shard, 3u);
    EXPECT_LE(w.offset + r.context + 1, r.shards[w.shard].tokens);
    ++per_shard[w.shard];
  }
  EXPECT_EQ(per_shard.count(1), 0u);
  EXPECT_GT(per_shard[0], per_shard[2]);
  EXPECT_GT(per_shard[2], 10);
}

TEST(Assignment, RefusesBadRequests) {
  AssignmentRequest r = Request();
  r.steps = 0;
  EXPECT_EQ(AssignBatches(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Request();
  r.shards.clear();
  EXPECT_THAT(AssignBatches(r).status().message(), HasSubstr("no shards"));
  r = Request();
  r.context = 100;
  EXPECT_THAT(AssignBatches(r).status().message(), HasSubstr("no shard holds 101 tokens"));
  r = Request();
  r.steps = 1 << 13;
  r.batch_size = 1 << 12;
  EXPECT_THAT(AssignBatches(r).status().message(), HasSubstr("exceed the cap"));
}

TEST(Assignment, GatherCutsTheWindows) {
  const AssignmentRequest r = Request();
  const std::vector<DataShard> shards = {Shard(1000, 100, 1), Shard(1000, 10, 2),
                                         Shard(1000, 50, 3)};
  const Assignment a = *AssignBatches(r);
  absl::StatusOr<std::vector<TokenBatch>> batches = GatherBatches(a, shards);
  ASSERT_TRUE(batches.ok()) << batches.status();
  ASSERT_EQ(batches->size(), 20u);
  const TokenBatch& b = (*batches)[5];
  EXPECT_EQ(b.rows, 8u);
  EXPECT_EQ(b.cols, 17u);
  const Window& w = a.windows[5 * 8 + 2];
  for (uint32_t k = 0; k < 17; ++k) {
    EXPECT_EQ(b.tokens[2 * 17 + k], shards[w.shard].tokens[w.offset + k]);
  }
  // A shard list that does not match the assignment is refused, not read out of bounds.
  const std::vector<DataShard> short_shards = {Shard(1000, 20), Shard(1000, 10), Shard(1000, 5)};
  EXPECT_EQ(GatherBatches(a, short_shards).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherBatches(a, std::span<const DataShard>(shards).first(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::worker
