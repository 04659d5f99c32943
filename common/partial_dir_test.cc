#include "common/partial_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace ts::common {
namespace {

namespace fs = std::filesystem;

class PartialDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-partial-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { fs::remove_all(dir_); }
  size_t Entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  std::string dir_;
};

TEST_F(PartialDirTest, UncommittedLeavesNothingCommittedLeavesTheTargetOnly) {
  {
    auto partial = PartialDir::Make("--out", dir_ + "/out");
    ASSERT_TRUE(partial.ok()) << partial.status();
    std::ofstream(partial->path() + "/half") << "written";
  }
  EXPECT_EQ(Entries(), 0u);  // a failure half-way: nothing left

  {
    auto partial = PartialDir::Make("--out", dir_ + "/out");
    ASSERT_TRUE(partial.ok());
    std::ofstream(partial->path() + "/whole") << "written";
    ASSERT_TRUE(partial->Commit().ok());
    EXPECT_EQ(partial->path(), "");
  }
  EXPECT_TRUE(fs::exists(dir_ + "/out/whole"));
  EXPECT_EQ(Entries(), 1u);
  EXPECT_EQ(PartialDir::Make("--out", dir_ + "/out").status().code(),
            absl::StatusCode::kAlreadyExists);

  // A folder under it committed; the rest (a private store, say) goes.
  {
    auto partial = PartialDir::Make("--out", dir_ + "/model");
    ASSERT_TRUE(partial.ok());
    fs::create_directories(partial->path() + "/store");
    fs::create_directories(partial->path() + "/export");
    std::ofstream(partial->path() + "/export/checkpoint") << "bytes";
    ASSERT_TRUE(partial->Commit(partial->path() + "/export").ok());
  }
  EXPECT_TRUE(fs::exists(dir_ + "/model/checkpoint"));
  EXPECT_EQ(Entries(), 2u);
  EXPECT_EQ(PartialDir::Make("--out", "").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::common
