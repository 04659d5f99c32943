// The corpus, tokenizer and dataset on the real text of Debian's `fortunes` package.
#include "worker/corpus.h"

#include <chrono>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/test_corpus.h"

namespace ts::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Corpus, SplitFortunes) {
  EXPECT_THAT(SplitFortunes("A  fool\n\tand his money.\n%\n%\n  -- Anon\n%\nlast"),
              ElementsAre("A fool and his money.", "-- Anon", "last"));
  EXPECT_TRUE(SplitFortunes("%\n%\n").empty());
}

TEST(Corpus, ReadsTheRealCorpus) {
  absl::StatusOr<std::vector<std::string>> docs = ReadFortuneFiles(kFortunesDir);
  ASSERT_TRUE(docs.ok()) << docs.status();
  uint64_t bytes = 0;
  for (const std::string& d : *docs) bytes += d.size();
  EXPECT_GT(docs->size(), 10000u);
  EXPECT_GT(bytes, 2'000'000u);
  std::vector<std::string_view> missing = {"no-such-file"};
  EXPECT_EQ(ReadFortuneFiles(kFortunesDir, missing).status().code(), absl::StatusCode::kNotFound);
}

TEST(Tokenizer, TrainingIsByteIdenticalAndRoundTrips) {
  const TestCorpus& corpus = GetTestCorpus();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> again = TrainTokenizer(corpus.documents, corpus.tokenizer_options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, corpus.tokenizer_model);  // byte-identical to the first training
  std::printf("tokenizer: %zu documents, vocab %u, %.2f s, model %zu bytes\n",
              corpus.documents.size(), corpus.tokenizer->vocab_size(), seconds, again->size());

  const Tokenizer& tok = *corpus.tokenizer;
  EXPECT_EQ(tok.vocab_size(), corpus.tokenizer_options.vocab_size);
  EXPECT_EQ(tok.eos_id(), 1u);
  const std::string text = "A fool and his money are soon parted.";
  absl::StatusOr<std::vector<uint32_t>> ids = tok.Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_LT(ids->size(), text.size());  // pieces longer than one character
  EXPECT_EQ(*tok.Decode(*ids), text);
  const std::vector<uint32_t> bad = {tok.vocab_size()};
  EXPECT_EQ(tok.Decode(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Tokenizer, RefusesBadInput) {
  EXPECT_EQ(Tokenizer::Load("not a model").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainTokenizer({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> texts = {"tiny"};
  EXPECT_THAT(TrainTokenizer(texts, {.vocab_size = 4}).status().message(),
              HasSubstr("vocab_size 4"));
  // SentencePiece's own refusal comes back as a status: far more pieces than the text has.
  EXPECT_EQ(TrainTokenizer(texts, {.vocab_size = 5000}).status().code(),
            absl::StatusCode::kInternal);
}

TEST(Dataset, ShardsAndHeldOutSet) {
  const TestCorpus& corpus = GetTestCorpus();
  const Dataset& ds = corpus.dataset;
  ASSERT_GE(ds.train.size(), 2u);
  uint64_t train_tokens = 0;
  for (size_t i = 0; i < ds.train.size(); ++i) {
    if (i + 1 < ds.train.size()) {
      EXPECT_EQ(ds.train[i].tokens.size(), 16384u);
    }
    train_tokens += ds.train[i].tokens.size();
    const std::string bytes = EncodeDataShard(ds.train[i]);
    absl::StatusOr<DataShard> back = DecodeDataShard(bytes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->tokens, ds.train[i].tokens);
  }
  // About 1 in 20 documents is held out.
  EXPECT_GT(ds.eval.tokens.size() * 30, train_tokens);
  EXPECT_LT(ds.eval.tokens.size() * 10, train_tokens);
  // Rebuilding gives the same shard ids.
  absl::StatusOr<Dataset> again =
      BuildDataset(corpus.documents, *corpus.tokenizer, corpus.dataset_options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(DataShardId(EncodeDataShard(again->train[0])),
            DataShardId(EncodeDataShard(ds.train[0])));
  EXPECT_EQ(DataShardId(EncodeDataShard(again->eval)), DataShardId(EncodeDataShard(ds.eval)));
  EXPECT_EQ(BuildDataset(corpus.documents, *corpus.tokenizer, {.shard_tokens = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::worker
