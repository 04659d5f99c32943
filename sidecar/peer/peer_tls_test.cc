#include "sidecar/peer/peer_tls.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gtest/gtest.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

// Answers every query with the shard id asked, so a call that reaches it says so.
class EchoService final : public pb::SettlementQuery::Service {
  grpc::Status GetSettlement(grpc::ServerContext* context, const pb::GetSettlementRequest* request,
                             pb::GetSettlementResponse* response) override {
    response->mutable_settlement()->set_shard_id(request->shard_id());
    // How the call came: "tls" over TLS.
    auto type = context->auth_context()->FindPropertyValues("transport_security_type");
    if (!type.empty()) {
      response->mutable_settlement()->set_chain_id(std::string(type[0].data(), type[0].size()));
    }
    return grpc::Status::OK;
  }
};

class PeerTlsTest : public ::testing::Test {
 protected:
  void Serve(const common::TlsIdentity* identity) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", PeerServerCredentials(identity), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  grpc::Status Call(const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                    pb::GetSettlementResponse* response) {
    auto stub = pb::SettlementQuery::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), credentials));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::GetSettlementRequest request;
    request.set_shard_id(42);
    return stub->GetSettlement(&context, request, response);
  }

  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  EchoService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(PeerTlsTest, ThePinnedCertificateIsAcceptedAndNoOther) {
  auto identity = common::NewTlsIdentity("gonka1server");
  ASSERT_TRUE(identity.ok()) << identity.status();
  Serve(&*identity);

  pb::GetSettlementResponse response;
  grpc::Status ok = Call(PeerChannelCredentials(identity->cert_sha256), &response);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(response.settlement().shard_id(), 42u);
  EXPECT_EQ(response.settlement().chain_id(), "tls");

  // A server presenting another certificate than the reservation pins (an impostor at the
  // member's address, or a member whose key changed) is refused before any request is sent.
  auto other = common::NewTlsIdentity("gonka1server");
  ASSERT_TRUE(other.ok());
  pb::GetSettlementResponse refused;
  grpc::Status wrong = Call(PeerChannelCredentials(other->cert_sha256), &refused);
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAVAILABLE) << wrong.error_message();
  EXPECT_EQ(refused.settlement().shard_id(), 0u);

  // A plaintext client gets nothing from a TLS listener.
  pb::GetSettlementResponse plain;
  EXPECT_FALSE(Call(PeerChannelCredentials(""), &plain).ok());
}

TEST_F(PeerTlsTest, PlaintextOnlyWhenBothSidesAskForIt) {
  Serve(nullptr);
  pb::GetSettlementResponse response;
  grpc::Status ok = Call(PeerChannelCredentials(""), &response);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(response.settlement().shard_id(), 42u);
  EXPECT_NE(response.settlement().chain_id(), "tls");
  // A client that pins a certificate never talks to a plaintext listener.
  auto identity = common::NewTlsIdentity("gonka1server");
  ASSERT_TRUE(identity.ok());
  EXPECT_FALSE(Call(PeerChannelCredentials(identity->cert_sha256), &response).ok());
}

}  // namespace
}  // namespace ts::sidecar
