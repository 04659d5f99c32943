// The peer-facing listener: bound at once, UNAVAILABLE until the chain id is known, then the
// real transfer service (which refuses unsigned requests); a port already taken is an error.
#include "sidecar/host/shard_server.h"

#include <chrono>
#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/secp256k1.h"
#include "sidecar/artifacts/operator_service.h"
#include "sidecar/artifacts/store.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;

class ShardServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-shard-server-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    state::DbOptions options;
    options.tables = {std::string(kTableArtifacts)};
    auto db = state::Db::Open(dir_ + "/db", options);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    ShardStoreRegistryOptions registry_options;
    registry_options.artifacts_dir = dir_ + "/artifacts";
    registry_options.self_address = self_;
    registry_ = std::make_unique<ShardStoreRegistry>(db_.get(), &directory_, &common::SystemClock(),
                                                     registry_options);
  }
  void TearDown() override {
    registry_.reset();
    db_.reset();
    std::system(("rm -rf " + dir_).c_str());
  }

  grpc::Status GetManifest(const std::string& address) {
    auto stub = pb::ArtifactTransfer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::GetManifestRequest request;
    request.set_shard_id(1);
    request.set_artifact_id(std::string(32, 'a'));
    pb::GetManifestResponse response;
    return stub->GetManifest(&context, request, &response);
  }

  std::string dir_;
  std::string self_ = common::AddressFromPublicKey(common::PrivateKey::Generate().public_key());
  StaticShardDirectory directory_;
  std::unique_ptr<state::Db> db_;
  std::unique_ptr<ShardStoreRegistry> registry_;
};

TEST_F(ShardServerTest, UnavailableUntilActivatedThenChecksRequests) {
  auto server = ShardServer::Start("127.0.0.1:0", registry_.get(), &directory_, self_,
                                   &common::SystemClock());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->address(), ::testing::StartsWith("127.0.0.1:"));
  EXPECT_NE((*server)->address(), "127.0.0.1:0");
  EXPECT_FALSE((*server)->active());

  grpc::Status before = GetManifest((*server)->address());
  EXPECT_EQ(before.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(before.error_message(), HasSubstr("not reached its chain"));

  (*server)->Activate("test-chain");
  EXPECT_TRUE((*server)->active());
  grpc::Status after = GetManifest((*server)->address());
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAUTHENTICATED) << after.error_message();
  EXPECT_THAT(after.error_message(), HasSubstr("auth"));
  (*server)->Shutdown(std::chrono::system_clock::now());
}

TEST_F(ShardServerTest, APortAlreadyTakenIsRefusedNotShared) {
  auto first = ShardServer::Start("127.0.0.1:0", registry_.get(), &directory_, self_,
                                  &common::SystemClock());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = ShardServer::Start((*first)->address(), registry_.get(), &directory_, self_,
                                   &common::SystemClock());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("shard_listen: cannot bind " + (*first)->address()));
}

// The chunk stream is bound beside the gRPC listener, answers with an UNAVAILABLE frame until
// the chain id is known and then checks requests like GetChunks; without it, no port.
TEST_F(ShardServerTest, ChunkStreamBoundAndGatedLikeTheService) {
  auto server = ShardServer::Start("127.0.0.1:0", registry_.get(), &directory_, self_,
                                   &common::SystemClock());
  ASSERT_TRUE(server.ok()) << server.status();
  const uint16_t port = (*server)->chunk_stream_port();
  ASSERT_GT(port, 0);
  pb::GetChunksRequest request;
  request.set_shard_id(1);
  request.set_artifact_id(std::string(32, 'a'));
  request.add_chunks(std::string(32, 'c'));
  auto next = [&]() {
    ChunkStreamCall call(&common::SystemClock(), common::SystemClock().MonotonicMs() + 5000);
    absl::Status started = call.Start("127.0.0.1", port, request);
    if (!started.ok()) return started;
    char buffer[16];
    return call.Next(buffer, sizeof(buffer)).status();
  };
  absl::Status before = next();
  EXPECT_EQ(before.code(), absl::StatusCode::kUnavailable) << before;
  EXPECT_THAT(std::string(before.message()), HasSubstr("not reached its chain"));
  (*server)->Activate("test-chain");
  absl::Status after = next();
  EXPECT_EQ(after.code(), absl::StatusCode::kUnauthenticated) << after;
  (*server)->Shutdown(std::chrono::system_clock::now());

  auto plain = ShardServer::Start("127.0.0.1:0", registry_.get(), &directory_, self_,
                                  &common::SystemClock(), /*chunk_stream=*/false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->chunk_stream_port(), 0);
}

}  // namespace
}  // namespace ts::sidecar
