#include "common/regular_file.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ts::common {
namespace {

using ::testing::HasSubstr;

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-regular-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string Write(const std::string& name, const std::string& content) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  // Reads `path` on a thread of its own and waits at most 5 s: a read that blocks on a FIFO
  // fails the test instead of hanging it (a writer is then opened to let the thread end).
  absl::StatusOr<std::string> ReadWithin5s(const std::string& path) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<std::string>>>();
    auto future = promise->get_future();
    std::thread reader([promise, path] { promise->set_value(ReadRegularFile("spec", path, 64)); });
    if (future.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << "reading " << path << " blocked";
      int unblock = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
      if (unblock >= 0) ::close(unblock);
    }
    reader.join();
    return future.get();
  }

  std::string dir_;
};

TEST_F(RegularFileTest, ReadsARegularFile) {
  auto read = ReadRegularFile("spec", Write("a.json", "{}\n"), 64);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "{}\n");
  auto empty = ReadRegularFile("spec", Write("empty", ""), 64);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
}

TEST_F(RegularFileTest, AFifoIsRefusedAtOnceNotWaitedOn) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto read = ReadWithin5s(fifo);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("spec " + fifo + ": not a regular file (a FIFO)"));
}

TEST_F(RegularFileTest, DirectoriesSocketsAndDevicesAreRefusedNamingTheKind) {
  auto dir = ReadRegularFile("config file", dir_, 64);
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));

  auto device = ReadRegularFile("key file", "/dev/zero", 64);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(device.status().message(), HasSubstr("a character device"));

  // A bound Unix socket: open() itself fails (ENXIO), which is the same refusal.
  const std::string socket_path = dir_ + "/sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  auto socket = ReadRegularFile("--spec", socket_path, 64);
  ::close(fd);
  EXPECT_EQ(socket.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(socket.status().message(), HasSubstr("--spec " + socket_path));
  EXPECT_THAT(socket.status().message(), HasSubstr("not a regular file"));
}

TEST_F(RegularFileTest, MissingAndOversizedFiles) {
  auto missing = ReadRegularFile("spec", dir_ + "/nope", 64);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_ + "/nope"));

  auto big = ReadRegularFile("spec", Write("big", std::string(65, 'x')), 64);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(big.status().message(), HasSubstr("more than 64"));
  auto exact = ReadRegularFile("spec", Write("exact", std::string(64, 'x')), 64);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->size(), 64u);
}

}  // namespace
}  // namespace ts::common
