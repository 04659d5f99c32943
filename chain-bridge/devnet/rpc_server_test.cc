// The devnet's CometBFT JSON-RPC on a real node and a real socket: what a client reads (status,
// blocks, results, searches, queries, broadcasts, the events the sidecar follows) and what an
// attacker gets (oversize bodies, junk, big batches, too many WebSocket clients).
#include "chain-bridge/devnet/rpc_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "chain-bridge/client/comet_rpc.h"
#include "chain-bridge/devnet/devnet_test_util.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/hex.h"
#include "cosmos/auth/v1beta1/query.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ts::bridge {
namespace {

using namespace devnet_test;  // NOLINT: the fixture's helpers
using Json = nlohmann::json;
using devnet::kMaxRpcRequestBytes;
using devnet::kMaxWebsocketClients;

// A connection to the loopback port of "host:port" with a 5 s receive timeout; -1 if refused.
int ConnectLoopback(const std::string& address) {
  int port = std::stoi(address.substr(address.rfind(':') + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A raw HTTP exchange on a fresh connection: what an attacker sends, what comes back.
std::string RawHttp(const std::string& address, const std::string& request) {
  int fd = ConnectLoopback(address);
  std::string out;
  if (fd >= 0) {
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buffer[4096];
    for (;;) {
      ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
      if (out.size() > (1 << 20)) break;
    }
  }
  if (fd >= 0) close(fd);
  return out;
}

std::string Post(const std::string& body, size_t content_length) {
  return absl::StrCat("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                      "Content-Length: ", content_length, "\r\nConnection: close\r\n\r\n", body);
}

class RpcTest : public ::testing::Test {
 protected:
  void SetUp() override { home_ = dir_.path() + "/home"; }

  void StartNode(const std::string& min_gas_price = "") {
    pb::Genesis genesis = TestGenesis(6);
    genesis.mutable_params()->set_min_gas_price(min_gas_price);
    ASSERT_TRUE(InitHome(home_, genesis).ok());
    DevnetOptions options = FastNode();
    options.rpc_listen_address = "127.0.0.1:0";
    auto node = DevnetNode::Open(home_, options);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    ASSERT_TRUE(node_->Start().ok());
    rpc_ = node_->rpc_listen_address();
    ASSERT_FALSE(rpc_.empty());
    client_ = NewGrpcChainClient(node_->listen_address(), FastClient());
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (node_->height() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(node_->height(), 2);
  }

  Json Call(const std::string& method, const Json& params) {
    auto result = CometRpcCall(rpc_, method, params.dump(), 5000);
    EXPECT_TRUE(result.ok()) << method << ": " << result.status();
    return result.ok() ? Json::parse(*result) : Json();
  }

  TempDir dir_;
  std::string home_;
  std::string rpc_;
  std::unique_ptr<DevnetNode> node_;
  std::unique_ptr<ChainClient> client_;
};

TEST_F(RpcTest, StatusBlocksAndResultsInCometBftShapes) {
  StartNode();
  Json status = Call("status", Json::object());
  EXPECT_EQ(status["node_info"]["version"], "0.38.17");
  EXPECT_EQ(status["node_info"]["network"], kChainId);
  EXPECT_TRUE(status["sync_info"]["latest_block_height"].is_string());
  EXPECT_EQ(status["sync_info"]["latest_app_hash"].get<std::string>().size(), 64u);
  EXPECT_EQ(status["validator_info"]["voting_power"], "1");

  Json block = Call("block", {{"height", "2"}});
  EXPECT_EQ(block["block"]["header"]["height"], "2");
  EXPECT_EQ(block["block"]["header"]["chain_id"], kChainId);
  EXPECT_EQ(block["block_id"]["parts"]["total"], 1);
  // Block 2's header names block 1, whose id `block` at height 1 reports.
  Json first = Call("block", {{"height", "1"}});
  EXPECT_EQ(block["block"]["header"]["last_block_id"]["hash"], first["block_id"]["hash"]);
  EXPECT_EQ(first["block"]["last_commit"]["block_id"]["parts"]["total"], 0);

  Json chain = Call("blockchain", {{"minHeight", "1"}, {"maxHeight", "2"}});
  ASSERT_EQ(chain["block_metas"].size(), 2u);
  EXPECT_EQ(chain["block_metas"][0]["header"]["height"], "2");
  Json validators = Call("validators", Json::object());
  EXPECT_EQ(validators["total"], "1");
  EXPECT_EQ(Call("health", Json::object()), Json::object());
  // A height not reached yet: NOT_FOUND for the event follower.
  EXPECT_TRUE(absl::IsNotFound(CometBlockEvents(rpc_, node_->height() + 1000, 5000).status()));
}

TEST_F(RpcTest, BroadcastSearchAndTheEventsTheSidecarFollows) {
  StartNode();
  std::string tx = BuildSignedTx(Key(1), kChainId, 1, 0, {Send(1, 2, 777)}, TxFee{kGasLimit, 0});
  Json sent = Call("broadcast_tx_commit", {{"tx", absl::Base64Escape(tx)}});
  ASSERT_EQ(sent["check_tx"]["code"], 0) << sent.dump();
  ASSERT_EQ(sent["tx_result"]["code"], 0) << sent.dump();
  const std::string hash = common::HexEncodeUpper(common::Sha256(tx));
  EXPECT_EQ(sent["hash"], hash);
  const int64_t height = std::stoll(sent["height"].get<std::string>());
  EXPECT_GT(height, 0);

  // By the SDK's event keys, by hash, by height; nothing for a recipient that got nothing.
  Json found = Call("tx_search",
                    {{"query", absl::StrCat("transfer.recipient='", Addr(2), "'")}, {"page", "1"}});
  ASSERT_EQ(found["total_count"], "1") << found.dump();
  EXPECT_EQ(found["txs"][0]["hash"], hash);
  EXPECT_EQ(found["txs"][0]["tx_result"]["gas_wanted"], absl::StrCat(kGasLimit));
  Json by_both =
      Call("tx_search",
           {{"query", absl::StrCat("message.sender='", Addr(1), "' AND tx.height=", height)}});
  EXPECT_EQ(by_both["total_count"], "1");
  Json by_hash = Call("tx_search", {{"query", absl::StrCat("tx.hash='", hash, "'")}});
  EXPECT_EQ(by_hash["total_count"], "1");
  Json none = Call("tx_search", {{"query", absl::StrCat("transfer.recipient='", Addr(3), "'")}});
  EXPECT_EQ(none["total_count"], "0");
  EXPECT_TRUE(none["txs"].empty());
  Json one = Call("tx", {{"hash", absl::Base64Escape(common::Sha256(tx))}});
  EXPECT_EQ(one["height"], absl::StrCat(height));

  // block_results gives the sidecar what the module's BlockEvents gives, event for event.
  auto over_rpc = CometBlockEvents(rpc_, height, 5000);
  auto over_grpc = client_->EventsAt(height);
  ASSERT_TRUE(over_rpc.ok()) << over_rpc.status();
  ASSERT_TRUE(over_grpc.ok()) << over_grpc.status();
  ASSERT_EQ(over_rpc->size(), over_grpc->size());
  for (size_t i = 0; i < over_rpc->size(); ++i) {
    EXPECT_EQ((*over_rpc)[i].SerializeAsString(), (*over_grpc)[i].SerializeAsString()) << i;
  }
  bool transfer = false;
  for (const auto& e : *over_rpc) transfer = transfer || e.type() == "transfer";
  EXPECT_TRUE(transfer);
}

TEST_F(RpcTest, RefusalsAndQueriesAnswerAsACosmosNode) {
  StartNode("0.5");
  // A fee below the minimum: a result with the SDK's code, never a JSON-RPC error.
  std::string cheap =
      BuildSignedTx(Key(1), kChainId, 1, 0, {Send(1, 2, 5)}, TxFee{100'000, 49'999});
  Json refused = Call("broadcast_tx_sync", {{"tx", absl::Base64Escape(cheap)}});
  EXPECT_EQ(refused["code"], static_cast<int>(SdkCode::kInsufficientFee));
  EXPECT_EQ(refused["codespace"], "sdk");
  EXPECT_FALSE(refused["hash"].get<std::string>().empty());
  // abci_query runs the node's gRPC queries: an unknown account is the SDK's NotFound.
  cosmos::auth::v1beta1::QueryAccountRequest request;
  request.set_address(common::AddressFromPublicKey(Key(99).public_key()));
  Json missing = Call("abci_query", {{"path", "/cosmos.auth.v1beta1.Query/Account"},
                                     {"data", common::HexEncode(request.SerializeAsString())}});
  EXPECT_EQ(missing["response"]["code"], 22);
  EXPECT_NE(missing["response"]["log"].get<std::string>().find("rpc error: code = NotFound"),
            std::string::npos);
  EXPECT_NE(missing["response"]["height"], "0");
  request.set_address(Addr(1));
  Json known = Call("abci_query", {{"path", "/cosmos.auth.v1beta1.Query/Account"},
                                   {"data", common::HexEncode(request.SerializeAsString())}});
  EXPECT_EQ(known["response"]["code"], 0);
  EXPECT_FALSE(known["response"]["value"].get<std::string>().empty());
  // A tx goes in through broadcast_tx_*, not through a query; a past height is not kept.
  EXPECT_TRUE(absl::IsInvalidArgument(
      CometRpcCall(rpc_, "abci_query",
                   R"({"path":"/cosmos.tx.v1beta1.Service/BroadcastTx","data":""})", 5000)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CometRpcCall(rpc_, "abci_query",
                   R"({"path":"/cosmos.bank.v1beta1.Query/Balance","data":"","height":"1"})", 5000)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(CometRpcCall(rpc_, "no_such_method", "{}", 5000).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CometRpcCall(rpc_, "tx_search", R"({"query":"a.b ~ 'x'"})", 5000).status()));
}

TEST_F(RpcTest, AnAttackerGetsErrorsNotTheNode) {
  StartNode();
  // A body announced beyond the cap is refused before it is read.
  std::string big = RawHttp(rpc_, Post("", kMaxRpcRequestBytes + 1));
  EXPECT_NE(big.find("413"), std::string::npos) << big.substr(0, 200);
  // Junk, an empty batch, a batch beyond the cap, a request that is not one.
  for (const auto& [body, code] : std::vector<std::pair<std::string, std::string>>{
           {"{\"jsonrpc\":", "-32700"},
           {"\xff\xfe\xfd", "-32700"},
           {"[]", "-32600"},
           {"[" + std::string(11 * 2, ' ') + "]", "-32600"},
           {"{\"id\":{\"a\":1},\"method\":\"status\"}", "-32600"},
           {"{\"id\":1,\"method\":\"status\",\"params\":[1,2]}", "-32600"}}) {
    std::string answer = RawHttp(rpc_, Post(body, body.size()));
    EXPECT_NE(answer.find(code), std::string::npos) << body << " -> " << answer.substr(0, 300);
  }
  std::string batch = "[";
  for (int i = 0; i < 11; ++i) batch += std::string(i ? "," : "") + R"({"id":1,"method":"health"})";
  batch += "]";
  EXPECT_NE(RawHttp(rpc_, Post(batch, batch.size())).find("-32600"), std::string::npos);
  // Bytes that are not UTF-8, in a method name or a parameter, are echoed back replaced, never
  // thrown on.
  std::string odd = RawHttp(rpc_, "GET /st%ff%c0atus HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(odd.find("-32601"), std::string::npos) << odd.substr(0, 300);
  std::string uri = RawHttp(rpc_, "GET /block?height=%22%ff%22 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(uri.find("error"), std::string::npos) << uri.substr(0, 300);
  // WebSocket clients beyond the cap are refused; those within it are served.
  auto upgrade = [&] {
    return absl::StrCat("GET /websocket HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
                        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
                        "Sec-WebSocket-Version: 13\r\n\r\n");
  };
  std::vector<int> held;
  int upgraded = 0;
  for (int i = 0; i < kMaxWebsocketClients + 2; ++i) {
    int fd = ConnectLoopback(rpc_);
    ASSERT_GE(fd, 0);
    std::string request = upgrade();
    send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buffer[512];
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0 && std::string(buffer, static_cast<size_t>(n)).find(" 101 ") != std::string::npos) {
      ++upgraded;
    }
    held.push_back(fd);
  }
  EXPECT_EQ(upgraded, kMaxWebsocketClients);
  // The node still answers plain calls meanwhile.
  EXPECT_EQ(Call("health", Json::object()), Json::object());
  for (int fd : held) close(fd);
}

}  // namespace
}  // namespace ts::bridge
