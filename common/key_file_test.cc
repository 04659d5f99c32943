#include "common/key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/hex.h"

namespace ts::common {
namespace {

class KeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-keyfile-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string Write(const std::string& name, const std::string& content, mode_t mode) {
    std::string path = dir_ + "/" + name;
    {
      std::ofstream out(path, std::ios::binary);
      out << content;
    }
    chmod(path.c_str(), mode);
    return path;
  }

  std::string dir_;
};

const std::string kSecretHex(64, '1');  // 0x1111...11, a valid scalar

TEST_F(KeyFileTest, LoadsOwnerOnlyFile) {
  for (mode_t mode : {0600, 0400}) {
    std::string path = Write("k" + std::to_string(mode), kSecretHex + "\n", mode);
    auto key = ReadKeyFile(path);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ(HexEncode(key->secret()), kSecretHex);
  }
  // No trailing newline is fine too.
  EXPECT_TRUE(ReadKeyFile(Write("nonl", kSecretHex, 0600)).ok());
}

TEST_F(KeyFileTest, RefusesGroupOrOtherAccessNamingFileAndMode) {
  for (mode_t mode : {0640, 0604, 0660, 0644, 0610}) {
    std::string path = Write("open", kSecretHex + "\n", mode);
    auto key = ReadKeyFile(path);
    ASSERT_FALSE(key.ok()) << std::oct << mode;
    EXPECT_EQ(key.status().code(), absl::StatusCode::kPermissionDenied);
    char mode_text[8];
    snprintf(mode_text, sizeof(mode_text), "%04o", static_cast<unsigned>(mode));
    EXPECT_NE(key.status().message().find(mode_text), absl::string_view::npos)
        << key.status().message();
    EXPECT_NE(key.status().message().find(path), absl::string_view::npos);
  }
}

TEST_F(KeyFileTest, RefusesMalformedContent) {
  for (const std::string& content :
       {std::string(""), std::string(63, 'a'), std::string(66, 'a'), std::string(64, 'g'),
        std::string(64, '0'), kSecretHex + "x", std::string(1000, 'a')}) {
    auto key = ReadKeyFile(Write("bad", content, 0600));
    ASSERT_FALSE(key.ok()) << content;
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument) << content;
  }
}

TEST_F(KeyFileTest, AFifoIsRefusedAtOnce) {
  // Opening a FIFO for reading would wait for a writer forever; the key reader must not.
  const std::string fifo = dir_ + "/key.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto promise = std::make_shared<std::promise<absl::StatusOr<PrivateKey>>>();
  auto future = promise->get_future();
  std::thread reader([promise, fifo] { promise->set_value(ReadKeyFile(fifo)); });
  if (future.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "ReadKeyFile blocked on a FIFO";
    int unblock = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets the reader end
    if (unblock >= 0) close(unblock);
  }
  reader.join();
  auto key = future.get();
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(key.status().message().find("not a regular file"), absl::string_view::npos)
      << key.status();
}

TEST_F(KeyFileTest, MissingAndDirectory) {
  EXPECT_EQ(ReadKeyFile(dir_ + "/none").status().code(), absl::StatusCode::kNotFound);
  std::string sub = dir_ + "/sub";
  mkdir(sub.c_str(), 0700);
  EXPECT_EQ(ReadKeyFile(sub).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ts::common
