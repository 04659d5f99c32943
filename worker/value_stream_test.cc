#include "worker/value_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "common/crypto/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

const ModelConfig kTiny{
    .layers = 1, .d_model = 8, .heads = 2, .context = 4, .vocab = 10, .mlp_ratio = 2};

class ValueStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-values-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  absl::StatusOr<std::unique_ptr<CheckpointFileReader>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    return CheckpointFileReader::Open(fd, std::filesystem::file_size(path), "ckpt");
  }

  std::string dir_;
};

TEST_F(ValueStreamTest, ACheckpointStreamsBackWithItsRoot) {
  Checkpoint ck{kTiny, InitParams(kTiny, 2), std::vector<float>(ParameterCount(kTiny), 0.5f)};
  const std::string bytes = EncodeCheckpoint(ck);
  // Written through the streaming writer: the same bytes and the same root.
  const std::string path = dir_ + "/w.tsck";
  FileByteWriter out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), "w");
  const std::string header = EncodeCheckpointHeader(kTiny, true);
  ASSERT_TRUE(out.WriteBytes(header.data(), header.size()).ok());
  FileValueWriter values(&out, 2 * ck.params.size());
  ASSERT_TRUE(values.Write(ck.params).ok());
  ASSERT_TRUE(values.Write(*ck.momentum).ok());
  auto written_root = out.Close();
  ASSERT_TRUE(written_root.ok());
  EXPECT_EQ(*written_root, CheckpointRoot(bytes));
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), bytes);

  auto reader = Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().config, kTiny);
  EXPECT_TRUE((*reader)->header().has_momentum);
  std::vector<float> params(ck.params.size());
  ASSERT_TRUE((*reader)->Read(params).ok());
  EXPECT_EQ(params, ck.params);
  auto root = (*reader)->Finish();
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(*root, CheckpointRoot(bytes));

  // Seeking to the momentum reads it without the parameters; the root is then unknown.
  auto momentum = Open(path);
  ASSERT_TRUE((*momentum)->SeekValue(ck.params.size()).ok());
  std::vector<float> m(ck.params.size());
  ASSERT_TRUE((*momentum)->Read(m).ok());
  EXPECT_EQ(m, *ck.momentum);
  EXPECT_EQ((*momentum)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ValueStreamTest, BadFilesAreRefusedNamingWhere) {
  Checkpoint ck{kTiny, InitParams(kTiny, 2), std::vector<float>(ParameterCount(kTiny), 0.5f)};
  std::string bytes = EncodeCheckpoint(ck);
  // A size other than the header implies: refused at Open, before any value.
  auto longer = Open(Write("long", bytes + "x"));
  EXPECT_THAT(longer.status().message(), HasSubstr("bytes of values, expected"));
  auto shorter = Open(Write("short", bytes.substr(0, bytes.size() - 4)));
  EXPECT_THAT(shorter.status().message(), HasSubstr("bytes of values, expected"));
  EXPECT_THAT(Open(Write("tiny", "TSCK")).status().message(), HasSubstr("truncated header"));
  // A non-finite value is named with its part and index.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + bytes.size() - 4, &nan, 4);
  auto reader = Open(Write("nan", bytes));
  ASSERT_TRUE(reader.ok());
  auto finished = (*reader)->Finish();
  EXPECT_THAT(finished.status().message(),
              HasSubstr("momentum[" + std::to_string(ck.params.size() - 1) + "]"));

  // A raw Δ file must be 4 bytes a parameter, every value finite.
  const std::string raw = Write("d", std::string(12, '\0'));
  auto wrong = RawValuesReader::Open(::open(raw.c_str(), O_RDONLY), 12, 4, "delta_file");
  EXPECT_THAT(wrong.status().message(), HasSubstr("holds 12 bytes, not 4 x 4 parameters"));
  std::string inf(8, '\0');
  const float infinity = std::numeric_limits<float>::infinity();
  std::memcpy(inf.data() + 4, &infinity, 4);
  const std::string inf_path = Write("inf", inf);
  auto values = RawValuesReader::Open(::open(inf_path.c_str(), O_RDONLY), 8, 2, "delta_file");
  ASSERT_TRUE(values.ok());
  std::vector<float> two(2);
  EXPECT_THAT((*values)->Read(two).message(), HasSubstr("not finite (index 1)"));
}

TEST_F(ValueStreamTest, DifferenceAndCopy) {
  const std::vector<float> a = {5, 6, 7}, b = {1, 2, 3};
  VectorReader ra(a), rb(b);
  DifferenceReader diff(&ra, &rb);
  std::vector<float> out;
  VectorWriter writer(&out);
  ASSERT_TRUE(CopyValues(diff, writer, 3).ok());
  EXPECT_EQ(out, (std::vector<float>{4, 4, 4}));
  EXPECT_EQ(diff.remaining(), 0u);
  std::vector<float> more(1);
  EXPECT_FALSE(diff.Read(more).ok());
}

}  // namespace
}  // namespace ts::worker
