#include "sidecar/artifacts/file_policy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;

class FilePolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-policy-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    root_ = dir_template;
    // <root>/data (the data dir, with shards/7 and shards/7/state), <root>/files (files_root),
    // <root>/host.key, <root>/elsewhere.
    for (const char* dir : {"data/shards/7/state", "data/shards/7/ckpt/r1", "data/shards/8/data",
                            "data/state", "files/ckpt", "elsewhere"}) {
      std::filesystem::create_directories(root_ + "/" + dir);
    }
    ::close(::creat((root_ + "/host.key").c_str(), 0600));
    policy_.files_root = root_ + "/files";
    policy_.shards_dir = root_ + "/data/shards";
    policy_.protected_paths = {{"the data dir", root_ + "/data"},
                               {"the host key file", root_ + "/host.key"}};
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  absl::Status Check(const std::string& relative, uint64_t shard_id = 7) {
    return CheckOperatorPath(policy_, "source_dir", root_ + "/" + relative, shard_id);
  }

  std::string root_;
  OperatorFilePolicy policy_;
};

TEST_F(FilePolicyTest, FilesRootAndTheShardsOwnFolderAreAllowed) {
  EXPECT_TRUE(Check("files").ok());
  EXPECT_TRUE(Check("files/ckpt").ok());
  EXPECT_TRUE(Check("files/not-yet/made").ok()) << "an out_dir need not exist yet";
  EXPECT_TRUE(Check("data/shards/7/ckpt/r1").ok());
  EXPECT_TRUE(Check("data/shards/8/data", 8).ok());
}

TEST_F(FilePolicyTest, TheDataDirKeyAndWhatHoldsThemAreRefused) {
  for (const char* relative : {"data", "data/state", "data/shards"}) {
    absl::Status s = Check(relative);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << relative;
  }
  // The data dir inside files_root is still refused: files_root = the parent of everything.
  policy_.files_root = root_;
  absl::Status parent = Check("");
  EXPECT_EQ(parent.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(parent.message(), HasSubstr("holds the data dir"));
  absl::Status inside = Check("data/state");
  EXPECT_THAT(inside.message(), HasSubstr("is inside the data dir"));
  // A folder holding the key file, even under files_root.
  absl::Status key = CheckOperatorPath(policy_, "source_dir", root_, 0);
  EXPECT_EQ(key.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Check("elsewhere").ok());
}

TEST_F(FilePolicyTest, AnotherShardsFolderAndTheRecordsAreRefused) {
  absl::Status other = Check("data/shards/8/data", 7);
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  absl::Status records = Check("data/shards/7/state");
  EXPECT_EQ(records.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(records.message(), HasSubstr("records"));
  EXPECT_EQ(Check("data/shards/7").code(), absl::StatusCode::kPermissionDenied)
      << "the shard folder itself holds the records";
  EXPECT_EQ(Check("data/shards/7/ckpt", 0).code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(FilePolicyTest, OutsideFilesRootOrWithoutOneIsRefused) {
  absl::Status outside = Check("elsewhere");
  EXPECT_EQ(outside.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(outside.message(), HasSubstr("outside files_root"));
  EXPECT_THAT(CheckOperatorPath(policy_, "out_dir", "/etc", 7).message(),
              HasSubstr("out_dir: /etc"));
  policy_.files_root.clear();
  absl::Status unset = Check("files");
  EXPECT_EQ(unset.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(unset.message(), HasSubstr("set files_root"));
}

TEST_F(FilePolicyTest, LinksAndDotDotCannotLeadOut) {
  // A link inside files_root to the data dir resolves to the data dir.
  ASSERT_EQ(::symlink((root_ + "/data").c_str(), (root_ + "/files/link").c_str()), 0);
  EXPECT_EQ(Check("files/link").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Check("files/link/state").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Check("files/../data").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Check("files/../elsewhere").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Check("data/shards/7/ckpt/../state").code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace ts::sidecar
