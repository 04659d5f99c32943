#include "worker/pack.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/hex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data_shard.h"
#include "worker/tokenizer.h"

namespace ts::worker {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Some English to pack: enough distinct text for a small vocabulary.
std::string Paragraphs(int count, int seed) {
  static const char* const kWords[] = {
      "the",    "river", "ran",     "past",   "old",     "mills", "and",     "quiet",
      "fields", "where", "farmers", "grew",   "barley",  "wheat", "beside",  "stone",
      "walls",  "built", "long",    "ago",    "by",      "hands", "nobody",  "remembers",
      "a",      "boat",  "drifted", "slowly", "towards", "the",   "harbour", "lights"};
  std::string out;
  uint32_t x = static_cast<uint32_t>(seed) * 2654435761u + 1;
  for (int p = 0; p < count; ++p) {
    for (int w = 0; w < 24; ++w) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      out += kWords[x % 32];
      out += w % 8 == 7 ? ".\n" : " ";
    }
    out += "\n";  // a blank line ends the paragraph
  }
  return out;
}

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-pack-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  PackOptions Options(std::vector<std::string> inputs) {
    PackOptions o;
    o.inputs = std::move(inputs);
    o.vocab = 96;
    o.shard_tokens = 2048;
    o.eval_every = 10;
    return o;
  }
  void ExpectRefused(const PackOptions& o, std::string_view want) {
    const std::string out = dir_ + "/refused";
    auto packed = PackDataset(o, out);
    ASSERT_FALSE(packed.ok()) << want;
    EXPECT_THAT(packed.status().message(), HasSubstr(want));
    EXPECT_FALSE(fs::exists(out)) << "a refused pack left " << out;
    fs::remove_all(out);  // so one failure does not cascade
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();
    }
  }

  std::string dir_;
};

TEST_F(PackTest, TextFoldersAndJsonLinesBecomeADatasetWhoseRootTheFilesGive) {
  Write("corpus/a.txt", Paragraphs(120, 1));
  Write("corpus/sub/b.txt", Paragraphs(80, 2));
  const std::string out = dir_ + "/ds";
  auto packed = PackDataset(Options({dir_ + "/corpus"}), out);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->documents, 200u);
  EXPECT_EQ(packed->input_files, 2u);
  EXPECT_EQ(packed->vocab, 96u);
  EXPECT_GE(packed->train.size(), 2u);
  EXPECT_GT(packed->eval.tokens, 100u);

  // Read back: every id from the bytes, the root from the ids; the shards decode.
  auto read = ReadPackedDataset(out);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->root, packed->root);
  std::ifstream in(out + "/" + packed->train[0].file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto shard = DecodeDataShard(bytes);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->vocab, 96u);
  EXPECT_EQ(shard->tokens.size(), packed->train[0].tokens);

  // Deterministic: the same input packs to the same root.
  auto again = PackDataset(Options({dir_ + "/corpus"}), dir_ + "/ds2");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->root, packed->root);

  // JSON Lines with a named field, and a tokenizer given instead of trained.
  std::string jsonl;
  for (int i = 0; i < 60; ++i) {
    std::string text = Paragraphs(1, i + 7).substr(0, 100);
    for (char& c : text) c = c == '\n' ? ' ' : c;  // one record a line
    jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": \"" + text + "\"}\n";
  }
  Write("records.jsonl", jsonl);
  PackOptions json = Options({dir_ + "/records.jsonl"});
  json.jsonl_field = "text";
  json.vocab = 0;
  json.tokenizer_file = out + "/" + kDatasetTokenizerFile;
  auto from_json = PackDataset(json, dir_ + "/ds-json");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(from_json->documents, 60u);
  EXPECT_EQ(from_json->tokenizer_sha256, packed->tokenizer_sha256);

  // Tampering with a shard is caught by show.
  std::ofstream(out + "/" + packed->train[0].file, std::ios::binary | std::ios::app) << "x";
  EXPECT_THAT(ReadPackedDataset(out).status().message(), HasSubstr("has id"));
}

TEST_F(PackTest, BadInputIsNamedWithFileAndLineAndLeavesNothing) {
  Write("ok.txt", Paragraphs(40, 3));
  ExpectRefused(Options({Write("empty.txt", "")}), "empty.txt: is empty");
  ExpectRefused(
      Options({dir_ + "/ok.txt", Write("bin.txt", std::string("text\nmore\0text\n", 15))}),
      "bin.txt:2: holds a NUL byte");
  ExpectRefused(Options({Write("latin1.txt", "caf\xe9 au lait\n")}),
                "latin1.txt:1: invalid UTF-8 at byte 4");
  PackOptions long_lines = Options({Write("long.txt", std::string(300, 'a') + "\n")});
  long_lines.line_bytes_max = 200;
  ExpectRefused(long_lines, "long.txt:1: line of 300 bytes, more than 200");
  ExpectRefused(Options({Write("blank.txt", "\n \n\t\n")}), "blank.txt: holds no text");
  ExpectRefused(Options({dir_ + "/missing.txt"}), "--input " + dir_ + "/missing.txt");

  PackOptions json = Options({Write("r.jsonl", "{\"text\": \"a b c\"}\n{\"body\": \"x\"}\n")});
  json.jsonl_field = "text";
  ExpectRefused(json, "r.jsonl:2: no field \"text\"");
  json.inputs = {Write("n.jsonl", "{\"text\": 5}\n")};
  ExpectRefused(json, "n.jsonl:1: field \"text\" is number, not a string");
  json.inputs = {Write("g.jsonl", "{\"text\": \"ok\"}\n{oops\n")};
  ExpectRefused(json, "g.jsonl:2: not a JSON value");

  PackOptions tokenizer = Options({dir_ + "/ok.txt"});
  tokenizer.vocab = 0;
  tokenizer.tokenizer_file = Write("bad.model", "not a sentencepiece model");
  ExpectRefused(tokenizer, "does not load");
  PackOptions both = Options({dir_ + "/ok.txt"});
  both.tokenizer_file = dir_ + "/bad.model";
  ExpectRefused(both, "--vocab / --tokenizer: give one");
  PackOptions vocab = Options({dir_ + "/ok.txt"});
  vocab.vocab = 70000;
  ExpectRefused(vocab, "--vocab: 70000 is outside 8..65536");
  ASSERT_EQ(::symlink((dir_ + "/ok.txt").c_str(), (dir_ + "/link.txt").c_str()), 0);
  ExpectRefused(Options({dir_ + "/link.txt"}), "is a symlink");

  // An existing --out is never touched.
  fs::create_directories(dir_ + "/taken");
  auto taken = PackDataset(Options({dir_ + "/ok.txt"}), dir_ + "/taken");
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace ts::worker
