// The work dir's file-name whitelist, size caps before reading, and atomic writes.
#include "worker/client/work_dir.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

TEST(WorkDir, NamesOutsideTheWhitelistAreRefusedNamingFieldAndValue) {
  EXPECT_TRUE(ValidateWorkFileName("f", "round-1/delta.bin").ok());
  EXPECT_TRUE(ValidateWorkFileName("f", "ckpt_0.tsck").ok());
  for (const char* bad :
       {"", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/", "a b", "a\\b", "..", "x\n"}) {
    absl::Status s = ValidateWorkFileName("delta_file", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("delta_file")) << bad;
  }
  EXPECT_THAT(ValidateWorkFileName("delta_file", "../x").message(), HasSubstr("\"../x\""));
  EXPECT_EQ(ValidateWorkFileName("f", std::string(kWorkFileNameMax + 1, 'a')).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkDir, ReadsCapSizeAndWritesReplaceWhole) {
  char tmpl[] = "/tmp/ts-workdir-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(WriteWorkFile(dir, "f", "a.bin", "hello").ok());
  ASSERT_TRUE(WriteWorkFile(dir, "f", "a.bin", "hello world").ok());
  auto read = ReadWorkFile(dir, "f", "a.bin", 100);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "hello world");
  auto big = ReadWorkFile(dir, "f", "a.bin", 5);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), HasSubstr("11 bytes, more than the cap of 5"));
  EXPECT_EQ(ReadWorkFile(dir, "f", "missing.bin", 100).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_EQ(symlink("/etc/hostname", (dir + "/link").c_str()), 0);
  EXPECT_EQ(ReadWorkFile(dir, "f", "link", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteWorkFile(dir, "f", "../escape", "x").code(), absl::StatusCode::kInvalidArgument);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ts::worker
