// WorkerClient and WorkerProcess without a worker: calls to a socket nobody serves are
// UNAVAILABLE naming the worker within their deadline; a binary that exits at once is reported
// with its exit status; bad options are refused.
#include "worker/client/worker_client.h"

#include <chrono>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ts::worker {
namespace {

using ::testing::HasSubstr;

TEST(WorkerClient, NobodyServingIsUnavailableNamingTheWorkerWithinTheDeadline) {
  WorkerClient client("/tmp/ts-worker-client-test-nobody.sock");
  const auto start = std::chrono::steady_clock::now();
  auto status = client.Status(/*timeout_ms=*/2000);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LE(elapsed, std::chrono::milliseconds(2500));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
  EXPECT_THAT(status.status().message(),
              HasSubstr("worker unix:/tmp/ts-worker-client-test-nobody.sock: Worker/Status"));
}

TEST(WorkerProcess, BadOptionsAndABinaryThatExitsAreReported) {
  EXPECT_EQ(WorkerProcess::Start({}).status().code(), absl::StatusCode::kInvalidArgument);
  WorkerProcessOptions options{.binary = "/bin/false",
                               .socket_path = "/tmp/ts-worker-client-test-false.sock",
                               .work_dir = "/tmp"};
  auto process = WorkerProcess::Start(options);
  ASSERT_FALSE(process.ok());
  EXPECT_EQ(process.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(process.status().message(), HasSubstr("exited with code 1 before serving"));
  options.threads = 0;
  EXPECT_THAT(WorkerProcess::Start(options).status().message(), HasSubstr("threads: 0"));
}

}  // namespace
}  // namespace ts::worker
