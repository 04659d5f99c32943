// HostLink against a real gRPC server on a Unix socket that plays the host: a publish refused as
// busy is tried again, a fetch stops when the run says so, the host's errors come back naming the
// call, a settlement the chain refused is FAILED_PRECONDITION naming its code.
#include "sidecar/shard/host_link.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

class FakeArtifacts final : public pb::ArtifactOperator::Service {
 public:
  std::atomic<int> publish_calls{0};
  int busy_answers = 2;

  grpc::Status Publish(grpc::ServerContext*, const pb::PublishArtifactRequest* request,
                       grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    if (publish_calls.fetch_add(1) < busy_answers) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "too many publish calls");
    }
    pb::ArtifactProgress done;
    done.set_done(true);
    done.set_artifact_id(std::string(32, static_cast<char>('a' + request->round())));
    writer->Write(done);
    return grpc::Status::OK;
  }
  // Progress every 100 ms until the client goes away.
  grpc::Status Fetch(grpc::ServerContext* context, const pb::FetchArtifactRequest*,
                     grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    pb::ArtifactProgress progress;
    progress.set_phase("fetching");
    while (!context->IsCancelled()) {
      writer->Write(progress);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  grpc::Status Export(grpc::ServerContext*, const pb::ExportArtifactRequest*,
                      pb::ArtifactProgress*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such complete artifact here");
  }
};

class FakeHost final : public pb::HostOperator::Service {
 public:
  grpc::Status SubmitSettlement(grpc::ServerContext*, const pb::SubmitSettlementRequest*,
                                pb::SubmitSettlementResponse* response) override {
    response->set_txhash("ABC");
    response->set_code(7);
    response->set_raw_log("signatures below the threshold");
    return grpc::Status::OK;
  }
};

class HostLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-hostlink-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    socket_ = dir_ + "/host.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(&artifacts_);
    builder.RegisterService(&host_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    link_ = std::make_unique<HostLink>(socket_);
  }
  void TearDown() override {
    link_.reset();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    std::system(("rm -rf " + dir_).c_str());
  }

  std::string dir_, socket_;
  FakeArtifacts artifacts_;
  FakeHost host_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HostLink> link_;
};

TEST_F(HostLinkTest, APublishRefusedAsBusyIsTriedAgain) {
  auto id = link_->Publish(3, dir_, "checkpoint", 1);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, std::string(32, 'b'));
  EXPECT_EQ(artifacts_.publish_calls.load(), 3);
}

TEST_F(HostLinkTest, AFetchStopsWhenTheRunSaysSo) {
  const auto start = std::chrono::steady_clock::now();
  auto cancelled = [&] {
    return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(300);
  };
  auto got = link_->Fetch(3, std::string(32, 'x'), {}, cancelled);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(HostLinkTest, TheHostsErrorsNameTheCall) {
  absl::Status exported = link_->Export(3, std::string(32, 'x'), dir_ + "/out");
  EXPECT_EQ(exported.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(exported.message().find("ArtifactOperator/Export"), std::string::npos) << exported;
  EXPECT_NE(exported.message().find("no such complete artifact here"), std::string::npos);

  auto submitted = link_->SubmitSettlement(pb::Settlement(), {});
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(submitted.status().message().find("code 7"), std::string::npos) << submitted.status();
  EXPECT_NE(submitted.status().message().find("signatures below the threshold"), std::string::npos);
}

TEST_F(HostLinkTest, AHostThatIsGoneIsUnavailable) {
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  auto listed = link_->List(3);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnavailable) << listed.status();
}

}  // namespace
}  // namespace ts::sidecar
