#include "sidecar/host/stats_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "sidecar/host/stats_page.h"

namespace ts::sidecar {
namespace {

int Port(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` as is and reads the answer until the server closes.
std::string Exchange(int port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return "";
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buffer[4096];
  while (true) {
    ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    answer.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return answer;
}

std::string Get(int port, const std::string& path, const std::string& method = "GET") {
  return Exchange(port, absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: x\r\n\r\n"));
}

std::string Body(const std::string& answer) {
  size_t end = answer.find("\r\n\r\n");
  return end == std::string::npos ? "" : answer.substr(end + 4);
}

class StatsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatsSources sources;
    sources.overview_json = [] { return std::string(R"({"shards":[]})"); };
    sources.metrics = &metrics_;
    auto started = StatsServer::Start("127.0.0.1:0", std::move(sources));
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    port_ = Port(server_->address());
  }

  HostMetrics metrics_;
  std::unique_ptr<StatsServer> server_;
  int port_ = 0;
};

TEST_F(StatsServerTest, ServesThePageTheJsonAndTheMetrics) {
  EXPECT_EQ(server_->address().substr(0, 10), "127.0.0.1:");
  const std::string page = Get(port_, "/");
  EXPECT_EQ(page.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_NE(page.find("Content-Type: text/html"), std::string::npos);
  EXPECT_NE(page.find("Content-Security-Policy: default-src 'none'"), std::string::npos);
  EXPECT_EQ(Body(page), std::string(StatsPageFiles()[0].body));
  for (const EmbeddedFile& file : StatsPageFiles()) {
    const std::string answer = Get(port_, std::string(file.path));
    EXPECT_EQ(answer.substr(0, 15), "HTTP/1.1 200 OK") << file.path;
    EXPECT_EQ(Body(answer), std::string(file.body)) << file.path;
  }
  EXPECT_NE(Get(port_, "/stats.js").find("Content-Type: text/javascript"), std::string::npos);

  const std::string api = Get(port_, "/api/v1/overview");
  EXPECT_NE(api.find("Content-Type: application/json"), std::string::npos);
  EXPECT_EQ(Body(api), R"({"shards":[]})");

  const std::string metrics = Get(port_, "/metrics");
  EXPECT_NE(metrics.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  // The requests above are counted, by the class of their path.
  EXPECT_NE(Body(metrics).find("trainshard_stats_requests_total{path=\"api\"} 1"),
            std::string::npos)
      << Body(metrics);
}

TEST_F(StatsServerTest, ReadsOnlyAndOnlyWhatItHolds) {
  const std::string head = Get(port_, "/api/v1/overview", "HEAD");
  EXPECT_EQ(head.substr(0, 15), "HTTP/1.1 200 OK");
  EXPECT_EQ(Body(head), "");
  const std::string post =
      Exchange(port_, "POST /api/v1/overview HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  EXPECT_EQ(post.substr(0, 12), "HTTP/1.1 405");
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos);
  for (const char* path : {"/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/index.html/",
                           "/api/v1/overview/../../etc/passwd", "/state/CURRENT"}) {
    EXPECT_EQ(Get(port_, path).substr(0, 12), "HTTP/1.1 404") << path;
  }
}

TEST_F(StatsServerTest, OversizedAndParallelRequestsLeaveItServing) {
  // A request over the cap is refused without an answer the attacker can use, and the server
  // goes on serving.
  const std::string huge = absl::StrCat("GET / HTTP/1.1\r\nHost: x\r\nX-Fill: ",
                                        std::string(kMaxStatsRequestBytes * 2, 'a'), "\r\n\r\n");
  const std::string refused = Exchange(port_, huge);
  EXPECT_EQ(refused.find("200 OK"), std::string::npos) << refused.substr(0, 100);
  // Many readers at once, more than the server's threads.
  std::vector<std::thread> readers;
  std::vector<std::string> answers(4 * kStatsThreads);
  for (size_t i = 0; i < answers.size(); ++i) {
    readers.emplace_back([this, &answers, i] { answers[i] = Get(port_, "/metrics"); });
  }
  for (std::thread& t : readers) t.join();
  for (const std::string& answer : answers) EXPECT_EQ(answer.substr(0, 15), "HTTP/1.1 200 OK");
}

TEST(StatsServerStartTest, BadAddressesNameTheKey) {
  HostMetrics metrics;
  StatsSources sources;
  sources.overview_json = [] { return std::string("{}"); };
  sources.metrics = &metrics;
  auto bad = StatsServer::Start("localhost", sources);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("stats_listen"), std::string::npos);

  auto first = StatsServer::Start("127.0.0.1:0", sources);
  ASSERT_TRUE(first.ok()) << first.status();
  auto taken = StatsServer::Start((*first)->address(), sources);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(taken.status().message().find((*first)->address()), std::string::npos)
      << taken.status();
}

}  // namespace
}  // namespace ts::sidecar
