#include "chain-bridge/devnet/node.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/devnet/devnet_test_util.h"
#include "chain-bridge/devnet/store.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "cosmos/auth/v1beta1/query.grpc.pb.h"
#include "cosmos/bank/v1beta1/query.grpc.pb.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "gonka/trainshard/v1/chain.grpc.pb.h"
#include "gtest/gtest.h"
#include "proto/cosmos_tendermint_service.h"
#include "proto/cosmos_tx_service.h"
#include "proto/hand_service.h"

namespace ts::bridge {
namespace {

using namespace devnet_test;  // NOLINT: the fixture's helpers

using cosmos::base::abci::v1beta1::TxResponse;

// A node on 127.0.0.1:0 in a fresh home, with a client connected to it.
class DevnetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = dir_.path() + "/home";
    ASSERT_TRUE(InitHome(home_, TestGenesis(6)).ok());
  }

  void StartNode(DevnetOptions options = FastNode()) {
    auto node = DevnetNode::Open(home_, options);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    ASSERT_TRUE(node_->Start().ok());
    client_ = NewGrpcChainClient(node_->listen_address(), FastClient());
  }

  void StopNode() {
    client_.reset();
    node_.reset();
  }

  void WaitHeight(int64_t h) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (node_->height() < h && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(node_->height(), h);
  }

  std::string Signed(int signer, uint64_t sequence, const google::protobuf::Any& msg) {
    // Genesis accounts are numbered in genesis order from 0.
    return BuildSignedTx(Key(signer), kChainId, static_cast<uint64_t>(signer), sequence, {msg},
                         TxFee{kGasLimit, 0});
  }

  TempDir dir_;
  std::string home_;
  std::unique_ptr<DevnetNode> node_;
  std::unique_ptr<ChainClient> client_;
};

// bank AllBalances, which Cosmos wallets ask first: the ngonka an account holds, nothing for an
// account that holds none, INVALID_ARGUMENT for an address that is not one.
TEST_F(DevnetTest, AllBalancesListsWhatAnAccountHolds) {
  StartNode();
  auto stub = cosmos::bank::v1beta1::Query::NewStub(
      grpc::CreateChannel(node_->listen_address(), grpc::InsecureChannelCredentials()));
  auto all = [&](const std::string& address, cosmos::bank::v1beta1::QueryAllBalancesResponse* out) {
    cosmos::bank::v1beta1::QueryAllBalancesRequest request;
    request.set_address(address);
    request.mutable_pagination()->set_count_total(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->AllBalances(&context, request, out);
  };
  cosmos::bank::v1beta1::QueryAllBalancesResponse funded;
  ASSERT_TRUE(all(Addr(1), &funded).ok());
  ASSERT_EQ(funded.balances_size(), 1);
  EXPECT_EQ(funded.balances(0).denom(), "ngonka");
  EXPECT_EQ(funded.balances(0).amount(), std::to_string(kInitialBalance));
  EXPECT_EQ(funded.pagination().total(), 1u);
  cosmos::bank::v1beta1::QueryAllBalancesResponse empty;
  ASSERT_TRUE(all(Addr(77), &empty).ok());
  EXPECT_EQ(empty.balances_size(), 0);
  cosmos::bank::v1beta1::QueryAllBalancesResponse bad;
  EXPECT_EQ(all("gonka1nothing", &bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// cosmos.base.tendermint.v1beta1.Service, as explorers and wallets ask a Cosmos node: its info,
// syncing, the latest block and one by height (the same block the tx service returns), the
// validator set; heights out of range are INVALID_ARGUMENT.
TEST_F(DevnetTest, TendermintServiceAnswersAsACosmosNode) {
  namespace tm = cosmos::base::tendermint::v1beta1;
  StartNode();
  auto sent = client_->SignAndBroadcast(Key(2), {Send(2, 3, 55)}, /*wait=*/true);
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_EQ(sent->code(), 0u) << sent->raw_log();
  auto channel = grpc::CreateChannel(node_->listen_address(), grpc::InsecureChannelCredentials());
  auto call = [&](const char* path, const auto& request, auto* response) {
    grpc::internal::RpcMethod method(path, grpc::internal::RpcMethod::NORMAL_RPC, channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return proto::UnaryCall(channel.get(), method, &context, request, response);
  };
  tm::GetNodeInfoResponse info;
  ASSERT_TRUE(call(tm::kGetNodeInfoPath, tm::GetNodeInfoRequest(), &info).ok());
  EXPECT_EQ(info.default_node_info().network(), kChainId);
  EXPECT_EQ(info.default_node_info().default_node_id().size(), 40u);
  EXPECT_EQ(info.application_version().name(), "trainshard");
  tm::GetSyncingResponse syncing;
  ASSERT_TRUE(call(tm::kGetSyncingPath, tm::GetSyncingRequest(), &syncing).ok());
  EXPECT_FALSE(syncing.syncing());

  tm::GetLatestBlockResponse latest;
  ASSERT_TRUE(call(tm::kGetLatestBlockPath, tm::GetLatestBlockRequest(), &latest).ok());
  EXPECT_GE(latest.sdk_block().header().height(), sent->height());
  EXPECT_EQ(latest.sdk_block().header().chain_id(), kChainId);
  EXPECT_EQ(latest.sdk_block().header().proposer_address().rfind("gonkavalcons1", 0), 0u);
  tm::GetBlockByHeightRequest at;
  at.set_height(sent->height());
  tm::GetBlockByHeightResponse block;
  ASSERT_TRUE(call(tm::kGetBlockByHeightPath, at, &block).ok());
  ASSERT_EQ(block.sdk_block().data().txs_size(), 1);
  EXPECT_EQ(TxHash(block.sdk_block().data().txs(0)), sent->txhash());
  EXPECT_EQ(block.block().data().txs(0), block.sdk_block().data().txs(0));
  EXPECT_EQ(block.block().header().proposer_address().size(), 20u);
  cosmos::tx::v1beta1::TxServiceStub tx_stub(channel);
  cosmos::tx::v1beta1::GetBlockWithTxsRequest with_txs_request;
  with_txs_request.set_height(sent->height());
  cosmos::tx::v1beta1::GetBlockWithTxsResponse with_txs;
  grpc::ClientContext context;
  ASSERT_TRUE(tx_stub.GetBlockWithTxs(&context, with_txs_request, &with_txs).ok());
  EXPECT_EQ(block.block_id().hash(), with_txs.block_id().hash());
  EXPECT_EQ(block.sdk_block().header().app_hash(), with_txs.block().header().app_hash());

  at.set_height(latest.sdk_block().header().height() + 1000);
  grpc::Status beyond = call(tm::kGetBlockByHeightPath, at, &block);
  EXPECT_EQ(beyond.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(beyond.error_message().find("is bigger then the chain length"), std::string::npos);
  at.set_height(0);
  EXPECT_EQ(call(tm::kGetBlockByHeightPath, at, &block).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  tm::GetLatestValidatorSetResponse validators;
  ASSERT_TRUE(
      call(tm::kGetLatestValidatorSetPath, tm::GetLatestValidatorSetRequest(), &validators).ok());
  ASSERT_EQ(validators.validators_size(), 1);
  EXPECT_EQ(validators.validators(0).voting_power(), 1);
  EXPECT_EQ(validators.validators(0).pub_key().type_url(), "/cosmos.crypto.ed25519.PubKey");
  EXPECT_EQ(validators.validators(0).address(), latest.sdk_block().header().proposer_address());
}

TEST_F(DevnetTest, TransfersLandAndBalancesChange) {
  StartNode();
  auto r = client_->SignAndBroadcast(Key(2), {Send(2, 3, 1234)}, /*wait=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code(), 0u) << r->raw_log();
  EXPECT_GT(r->height(), 0);
  EXPECT_EQ(*client_->Balance(Addr(2)), kInitialBalance - 1234);
  EXPECT_EQ(*client_->Balance(Addr(3)), kInitialBalance + 1234);

  // Back to back, without waiting for blocks: the client's sequence cache signs 1, 2, 3.
  for (uint64_t amount : {1u, 2u, 3u}) {
    auto q = client_->SignAndBroadcast(Key(2), {Send(2, 4, amount)}, /*wait=*/false);
    ASSERT_TRUE(q.ok()) << q.status();
    ASSERT_EQ(q->code(), 0u) << q->raw_log();
  }
  auto last = client_->SignAndBroadcast(Key(2), {Send(2, 4, 4)}, /*wait=*/true);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->code(), 0u);
  EXPECT_EQ(*client_->Balance(Addr(4)), kInitialBalance + 10);
  auto acc = client_->Account(Addr(2));
  ASSERT_TRUE(acc.ok());
  EXPECT_EQ(acc->sequence, 5u);
  EXPECT_EQ(acc->account_number, 2u);

  auto status = client_->Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->chain_id, kChainId);
  EXPECT_GE(status->latest_height, last->height());
}

TEST_F(DevnetTest, StaleSequenceCacheIsRefetched) {
  StartNode();
  // Another client spends sequence 0 behind this client's back.
  auto other = NewGrpcChainClient(node_->listen_address(), FastClient());
  ASSERT_EQ(client_->SignAndBroadcast(Key(1), {Send(1, 3, 5)}, true)->code(), 0u);
  ASSERT_EQ(other->SignAndBroadcast(Key(1), {Send(1, 3, 5)}, true)->code(), 0u);
  auto r = client_->SignAndBroadcast(Key(1), {Send(1, 3, 5)}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code(), 0u) << r->raw_log();
  EXPECT_EQ(*client_->Balance(Addr(3)), kInitialBalance + 15);
}

TEST_F(DevnetTest, RestartResumesAtLastHeightWithSameAppHash) {
  StartNode();
  ASSERT_EQ(client_->SignAndBroadcast(Key(1), {Send(1, 2, 77)}, true)->code(), 0u);
  WaitHeight(node_->height() + 3);
  node_->Shutdown();
  const int64_t height = node_->height();
  const std::string app_hash = node_->app_hash();
  StopNode();

  StartNode();
  EXPECT_EQ(node_->height(), height);
  EXPECT_EQ(node_->app_hash(), app_hash);
  auto status = client_->Status();
  ASSERT_TRUE(status.ok());
  EXPECT_GE(status->latest_height, height);
  EXPECT_EQ(*client_->Balance(Addr(2)), kInitialBalance + 77);
  // The chain goes on from there, and the account's sequence survived.
  auto r = client_->SignAndBroadcast(Key(1), {Send(1, 2, 1)}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code(), 0u) << r->raw_log();
  EXPECT_GT(r->height(), height);
  // The header chain continues across the restart.
  StopNode();
  auto report = Replay(home_);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->mismatch;
}

TEST_F(DevnetTest, AcceptedTxSurvivesRestartBeforeItsBlock) {
  DevnetOptions slow;
  slow.block_interval_ms = 60'000;  // no block before the restart
  StartNode(slow);
  std::string tx = Signed(2, 0, Send(2, 3, 600));
  std::string second = Signed(4, 0, Send(4, 3, 1));
  ASSERT_EQ(client_->BroadcastRaw(tx)->code(), 0u);
  ASSERT_EQ(client_->BroadcastRaw(second)->code(), 0u);
  EXPECT_EQ(node_->mempool_size(), 2u);
  StopNode();

  StartNode(slow);
  EXPECT_EQ(node_->mempool_size(), 2u);
  StopNode();

  StartNode();
  auto found = [&](const std::string& bytes) {
    absl::StatusOr<TxResponse> r;
    for (int i = 0; i < 500; ++i) {
      r = client_->GetTx(TxHash(bytes));
      if (r.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return r;
  };
  auto r = found(tx);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code(), 0u);
  EXPECT_TRUE(found(second).ok());
  EXPECT_EQ(*client_->Balance(Addr(3)), kInitialBalance + 601);
  EXPECT_EQ(node_->mempool_size(), 0u);
  // Included txs leave the mempool table too: another restart brings nothing back.
  StopNode();
  StartNode(slow);
  EXPECT_EQ(node_->mempool_size(), 0u);
}

TEST_F(DevnetTest, ForgedSignatureRefusedAndStateUnchanged) {
  StartNode();
  std::string tx = Signed(3, 0, Send(3, 4, 500));
  cosmos::tx::v1beta1::TxRaw raw;
  ASSERT_TRUE(raw.ParseFromString(tx));
  std::string sig = raw.signatures(0);
  sig[10] ^= 0x01;
  raw.set_signatures(0, sig);
  auto r = client_->BroadcastRaw(raw.SerializeAsString());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->code(), static_cast<uint32_t>(SdkCode::kUnauthorized)) << r->raw_log();
  EXPECT_EQ(r->codespace(), "sdk");
  EXPECT_EQ(node_->mempool_size(), 0u);

  WaitHeight(node_->height() + 2);
  EXPECT_EQ(*client_->Balance(Addr(3)), kInitialBalance);
  EXPECT_EQ(*client_->Balance(Addr(4)), kInitialBalance);
  EXPECT_EQ(client_->Account(Addr(3))->sequence, 0u);
  auto found = client_->GetTx(TxHash(raw.SerializeAsString()));
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DevnetTest, TxFindableByHashAfterInclusion) {
  StartNode();
  auto unknown = client_->GetTx(common::HexEncodeUpper(common::Sha256("no such tx")));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->GetTx("not-hex").status().code(), absl::StatusCode::kInvalidArgument);

  std::string tx = Signed(4, 0, Send(4, 5, 42));
  auto sent = client_->BroadcastRaw(tx);
  ASSERT_TRUE(sent.ok());
  ASSERT_EQ(sent->code(), 0u) << sent->raw_log();
  EXPECT_EQ(sent->txhash(), TxHash(tx));
  // The same bytes again are refused as already queued (or, if a block came between, by their
  // now stale sequence).
  auto again = client_->BroadcastRaw(tx);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->code(), 0u);

  absl::StatusOr<TxResponse> found;
  for (int i = 0; i < 500; ++i) {
    found = client_->GetTx(TxHash(tx));
    if (found.ok()) break;
    ASSERT_EQ(found.status().code(), absl::StatusCode::kNotFound) << found.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->txhash(), TxHash(tx));
  EXPECT_EQ(found->code(), 0u);
  EXPECT_GT(found->height(), 0);
  EXPECT_FALSE(found->timestamp().empty());
  EXPECT_EQ(found->tx().type_url(), "/cosmos.tx.v1beta1.Tx");
  ASSERT_FALSE(found->events().empty());
  EXPECT_EQ(found->events(0).type(), "tx");
  EXPECT_GT(found->gas_used(), 0);
  EXPECT_EQ(found->gas_wanted(), static_cast<int64_t>(kGasLimit));

  // GetBlockWithTxs serves the block with the tx decoded.
  auto channel = grpc::CreateChannel(node_->listen_address(), grpc::InsecureChannelCredentials());
  cosmos::tx::v1beta1::TxServiceStub stub(channel);
  cosmos::tx::v1beta1::GetBlockWithTxsRequest req;
  req.set_height(found->height());
  cosmos::tx::v1beta1::GetBlockWithTxsResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(stub.GetBlockWithTxs(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.block().header().height(), found->height());
  ASSERT_EQ(resp.txs_size(), 1);
  EXPECT_EQ(resp.block().data().txs(0), tx);
  EXPECT_EQ(resp.txs(0).body().messages(0).type_url(), "/cosmos.bank.v1beta1.MsgSend");
  EXPECT_EQ(resp.block_id().hash().size(), 32u);

  req.set_height(node_->height() + 1000);
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(stub.GetBlockWithTxs(&ctx2, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(DevnetTest, BroadcastBlockModeReturnsDeliveredResponse) {
  StartNode();
  auto channel = grpc::CreateChannel(node_->listen_address(), grpc::InsecureChannelCredentials());
  cosmos::tx::v1beta1::TxServiceStub stub(channel);
  cosmos::tx::v1beta1::BroadcastTxRequest req;
  req.set_tx_bytes(Signed(5, 0, Send(5, 1, 9)));
  req.set_mode(cosmos::tx::v1beta1::BROADCAST_MODE_BLOCK);
  cosmos::tx::v1beta1::BroadcastTxResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status s = stub.BroadcastTx(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.tx_response().code(), 0u);
  EXPECT_GT(resp.tx_response().height(), 0);
  EXPECT_TRUE(std::any_of(resp.tx_response().events().begin(), resp.tx_response().events().end(),
                          [](const auto& e) { return e.type() == "transfer"; }));

  req.set_mode(cosmos::tx::v1beta1::BROADCAST_MODE_UNSPECIFIED);
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(stub.BroadcastTx(&ctx2, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(DevnetTest, BlockEventsInTxOrder) {
  StartNode();
  // Three txs sent back to back; they land in one or more blocks, in this order.
  int64_t first_height = 0, last_height = 0;
  for (uint64_t amount : {101u, 102u, 103u}) {
    auto r = client_->SignAndBroadcast(Key(1), {Send(1, 2, amount)}, /*wait=*/false);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->code(), 0u);
  }
  auto last = client_->SignAndBroadcast(Key(1), {Send(1, 2, 104)}, /*wait=*/true);
  ASSERT_TRUE(last.ok());
  last_height = last->height();
  first_height = std::max<int64_t>(1, last_height - 20);
  std::vector<std::string> amounts;
  for (int64_t h = first_height; h <= last_height; ++h) {
    auto events = client_->EventsAt(h);
    ASSERT_TRUE(events.ok()) << events.status();
    for (const auto& e : *events) {
      if (e.type() != "transfer") continue;
      for (const auto& a : e.attributes()) {
        if (a.key() == "amount") amounts.push_back(a.value());
      }
    }
  }
  EXPECT_EQ(amounts,
            (std::vector<std::string>{"101ngonka", "102ngonka", "103ngonka", "104ngonka"}));
  EXPECT_EQ(client_->EventsAt(node_->height() + 1000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->EventsAt(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DevnetTest, QueriesAnswerAndRefuseUnknowns) {
  StartNode();
  EXPECT_EQ(client_->Account(common::AddressFromPublicKey(Key(99).public_key())).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Account("gonka1notanaddress").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Shard(7).status().code(), absl::StatusCode::kNotFound);
  auto shards = client_->Shards(pb::SHARD_STATUS_UNSPECIFIED);
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_TRUE(shards->empty());
  auto params = client_->Params();
  ASSERT_TRUE(params.ok());
  EXPECT_EQ(params->chain_id(), kChainId);
  EXPECT_EQ(params->params().voting_period_blocks(), 10u);
  auto weights = client_->Weights(0, /*current=*/true);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ASSERT_EQ(weights->weights_size(), 1);
  EXPECT_EQ(weights->weights(0).host(), Addr(1));
}

TEST_F(DevnetTest, ReplayMatchesAfterRun) {
  StartNode();
  for (int i = 1; i <= 4; ++i) {
    ASSERT_EQ(client_->SignAndBroadcast(Key(i), {Send(i, 0, 10 * static_cast<uint64_t>(i))}, false)
                  ->code(),
              0u);
  }
  ASSERT_EQ(client_->SignAndBroadcast(Key(5), {Send(5, 0, 1)}, true)->code(), 0u);
  // A live node holds the database: replay must not read under it.
  EXPECT_EQ(Replay(home_).status().code(), absl::StatusCode::kUnavailable);
  node_->Shutdown();
  const int64_t height = node_->height();
  StopNode();

  auto report = Replay(home_);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->mismatch;
  EXPECT_EQ(report->blocks_replayed, height);
  EXPECT_EQ(report->latest_height, height);
  EXPECT_FALSE(report->first_mismatch_height.has_value());
}

TEST_F(DevnetTest, CorruptedBlockMakesReplayReportItsHeight) {
  StartNode();
  auto r = client_->SignAndBroadcast(Key(1), {Send(1, 2, 3)}, true);
  ASSERT_TRUE(r.ok());
  const int64_t tx_height = r->height();
  WaitHeight(tx_height + 3);
  StopNode();

  pb::StoredBlock original;
  {
    auto db = devnet::OpenStore(home_, false);
    ASSERT_TRUE(db.ok()) << db.status();
    auto block = devnet::ReadBlock(**db, tx_height);
    ASSERT_TRUE(block.ok());
    original = *block;
    // Another amount in the stored tx: its data hash (and signature) no longer hold.
    std::string* tx = block->mutable_block()->mutable_data()->mutable_txs(0);
    (*tx)[tx->size() / 2] ^= 0x01;
    state::WriteBatch b;
    b.PutProto(devnet::kBlocksTable, state::EncodeU64Key(tx_height), *block);
    ASSERT_TRUE((*db)->Write(b).ok());
  }
  auto report = Replay(home_);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->ok());
  ASSERT_TRUE(report->first_mismatch_height.has_value());
  EXPECT_EQ(*report->first_mismatch_height, tx_height) << report->mismatch;
  EXPECT_EQ(report->blocks_replayed, tx_height - 1);

  {
    // With the block restored, an unreadable later block is reported at its own height.
    auto db = devnet::OpenStore(home_, false);
    ASSERT_TRUE(db.ok());
    state::WriteBatch b;
    b.PutProto(devnet::kBlocksTable, state::EncodeU64Key(tx_height), original);
    b.Put(devnet::kBlocksTable, state::EncodeU64Key(tx_height + 2), std::string("\xff\xff\xff", 3));
    ASSERT_TRUE((*db)->Write(b).ok());
  }
  report = Replay(home_);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->first_mismatch_height.value_or(-1), tx_height + 2) << report->mismatch;
  EXPECT_EQ(report->blocks_replayed, tx_height + 1);
}

// A chain with a minimum gas price: the client simulates, asks for the gas with its margin
// and pays for it; the fee goes to the fee collector; a tx that pays too little is refused
// with the SDK's code; a simulation that would fail says why.
TEST_F(DevnetTest, ClientsSimulateAndPayTheMinimumGasPrice) {
  home_ = dir_.path() + "/priced";
  pb::Genesis genesis = TestGenesis(6);
  genesis.mutable_params()->set_min_gas_price("0.5");
  ASSERT_TRUE(InitHome(home_, genesis).ok());
  StartNode();
  auto sent = client_->SignAndBroadcast(Key(1), {Send(1, 2, 1000)}, /*wait=*/true);
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_EQ(sent->code(), 0u) << sent->raw_log();
  const uint64_t wanted = static_cast<uint64_t>(sent->gas_wanted());
  EXPECT_GT(sent->gas_used(), 0);
  EXPECT_LE(static_cast<uint64_t>(sent->gas_used()), wanted);
  // The margin: 30% and 5,000 over what the simulation measured.
  EXPECT_GE(wanted, static_cast<uint64_t>(sent->gas_used()) * 13 / 10);
  const uint64_t fee = (wanted + 1) / 2;
  EXPECT_EQ(*client_->Balance(Addr(1)), kInitialBalance - 1000 - fee);
  EXPECT_EQ(*client_->Balance(Addr(2)), kInitialBalance + 1000);
  EXPECT_EQ(*client_->Balance(common::ModuleAddress("fee_collector")), fee);

  auto simulated = client_->Simulate(BuildSimulateTx(Key(3).public_key(), 0, {Send(3, 4, 5)}));
  ASSERT_TRUE(simulated.ok()) << simulated.status();
  EXPECT_EQ(simulated->code(), 0u) << simulated->raw_log();
  EXPECT_GT(simulated->gas_used(), 0);
  auto refused =
      client_->Simulate(BuildSimulateTx(Key(3).public_key(), 0, {Send(3, 4, kInitialBalance + 1)}));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->codespace(), "sdk");
  EXPECT_EQ(refused->code(), static_cast<uint32_t>(SdkCode::kInsufficientFunds))
      << refused->raw_log();
  EXPECT_NE(refused->raw_log().find("insufficient funds"), std::string::npos);

  auto cheap = client_->BroadcastRaw(
      BuildSignedTx(Key(3), kChainId, 3, 0, {Send(3, 4, 5)}, TxFee{100'000, 49'999}));
  ASSERT_TRUE(cheap.ok()) << cheap.status();
  EXPECT_EQ(cheap->codespace(), "sdk");
  EXPECT_EQ(cheap->code(), static_cast<uint32_t>(SdkCode::kInsufficientFee)) << cheap->raw_log();
  // A message the chain would refuse is refused at CheckTx: nothing is paid.
  auto broke = client_->SignAndBroadcast(Key(3), {Send(3, 4, kInitialBalance * 2)}, true);
  ASSERT_TRUE(broke.ok()) << broke.status();
  EXPECT_EQ(broke->code(), static_cast<uint32_t>(SdkCode::kInsufficientFunds));
  EXPECT_EQ(*client_->Balance(Addr(3)), kInitialBalance);
}

TEST_F(DevnetTest, MempoolCapRefusesBeyondIt) {
  DevnetOptions o;
  o.block_interval_ms = 60'000;  // no block during the test
  o.mempool_max_txs = 3;
  StartNode(o);
  for (uint64_t seq = 0; seq < 3; ++seq) {
    auto r = client_->BroadcastRaw(Signed(1, seq, Send(1, 2, 1)));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->code(), 0u) << r->raw_log();
  }
  EXPECT_EQ(node_->mempool_size(), 3u);
  auto full = client_->BroadcastRaw(Signed(2, 0, Send(2, 1, 1)));
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->code(), static_cast<uint32_t>(SdkCode::kMempoolIsFull));
  EXPECT_EQ(full->codespace(), "sdk");
  EXPECT_EQ(node_->mempool_size(), 3u);
}

TEST_F(DevnetTest, OpenRefusesAnotherGenesis) {
  StartNode();
  WaitHeight(1);
  StopNode();
  pb::Genesis other = TestGenesis(6);
  other.set_chain_id("other-chain");
  std::filesystem::remove(home_ + "/genesis.json");
  ASSERT_TRUE(InitHome(home_, other).ok());
  EXPECT_EQ(DevnetNode::Open(home_, FastNode()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Replay(home_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DevnetHomeTest, InitHomeValidatesAndRefusesOverwrite) {
  TempDir dir;
  const std::string home = dir.path() + "/h";
  pb::Genesis bad = TestGenesis(2);
  bad.mutable_params()->set_voting_period_blocks(0);
  EXPECT_EQ(InitHome(home, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(home + "/genesis.json"));

  ASSERT_TRUE(InitHome(home, TestGenesis(2)).ok());
  EXPECT_EQ(InitHome(home, TestGenesis(2)).code(), absl::StatusCode::kAlreadyExists);
  auto read = ReadGenesis(home);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->chain_id(), kChainId);
  EXPECT_EQ(read->accounts_size(), 2);

  EXPECT_EQ(DevnetNode::Open(dir.path() + "/nothing").status().code(), absl::StatusCode::kNotFound);
  std::ofstream(home + "/genesis.json", std::ios::trunc) << "{ not json";
  EXPECT_EQ(DevnetNode::Open(home).status().code(), absl::StatusCode::kDataLoss);
}

TEST(DevnetHomeTest, StartWritesNodeAddr) {
  TempDir dir;
  const std::string home = dir.path() + "/h";
  ASSERT_TRUE(InitHome(home, TestGenesis(2)).ok());
  auto node = DevnetNode::Open(home, FastNode());
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->Start().ok());
  std::ifstream f(home + "/node.addr");
  std::string addr;
  f >> addr;
  EXPECT_EQ(addr, (*node)->listen_address());
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  EXPECT_NE(addr, "127.0.0.1:0");
  EXPECT_EQ((*node)->Start().code(), absl::StatusCode::kFailedPrecondition);
}

// --- Crash consistency: a child process runs the node and is killed with SIGKILL --------------

constexpr char kCrashHomeEnv[] = "TS_DEVNET_CRASH_CHILD_HOME";

// Runs only inside the child started by KillNineLeavesAConsistentDatabase.
TEST(DevnetCrashChild, RunNodeUntilKilled) {
  const char* home = getenv(kCrashHomeEnv);
  if (home == nullptr) GTEST_SKIP() << "runs only as the crash test's child";
  DevnetOptions o;
  o.block_interval_ms = 10;
  auto node = DevnetNode::Open(home, o);
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->Start().ok());
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

std::string ReadAddr(const std::string& home) {
  std::ifstream f(home + "/node.addr");
  std::string addr;
  f >> addr;
  return addr;
}

TEST(DevnetCrashTest, KillNineLeavesAConsistentDatabase) {
  TempDir dir;
  const std::string home = dir.path() + "/h";
  ASSERT_TRUE(InitHome(home, TestGenesis(6)).ok());
  std::vector<std::pair<int64_t, std::string>> observed;  // (height, app hash) seen live
  uint64_t sent = 0, attempted = 0;
  for (int round = 0; round < 3; ++round) {
    std::filesystem::remove(home + "/node.addr");
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv(kCrashHomeEnv, home.c_str(), 1);
      execl("/proc/self/exe", "devnet_crash_child",
            "--gtest_filter=DevnetCrashChild.RunNodeUntilKilled", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::string addr;
    for (int i = 0; i < 1000 && addr.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      addr = ReadAddr(home);
    }
    ASSERT_FALSE(addr.empty()) << "child node did not start";
    {
      auto client = NewGrpcChainClient(addr, FastClient());
      // Txs in flight while the node dies: some land, some are lost with the mempool.
      for (int i = 0; i < 15; ++i) {
        ++attempted;
        auto r = client->SignAndBroadcast(Key(1), {Send(1, 2, 1)}, /*wait=*/i % 5 == 4);
        if (r.ok() && r->code() == 0) ++sent;
        auto st = client->Status();
        if (st.ok()) observed.emplace_back(st->latest_height, st->app_hash);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * (round + 1)));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus));
  }
  ASSERT_GT(sent, 0u);

  // Everything seen live is still stored, and replay from genesis agrees with the database.
  {
    auto db = devnet::OpenStore(home, false);
    ASSERT_TRUE(db.ok()) << db.status();
    for (const auto& [height, app_hash] : observed) {
      if (height == 0) continue;
      auto block = devnet::ReadBlock(**db, height);
      ASSERT_TRUE(block.ok()) << "height " << height << ": " << block.status();
      EXPECT_EQ(block->results().app_hash(), app_hash) << "height " << height;
    }
  }
  auto report = Replay(home);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->mismatch;
  EXPECT_GE(report->latest_height, observed.back().first);

  auto node = DevnetNode::Open(home, FastNode());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ((*node)->height(), report->latest_height);

  // No tx the node accepted is lost: queued ones come back from the mempool table and land.
  ASSERT_TRUE((*node)->Start().ok());
  for (int i = 0; i < 1000 && (*node)->mempool_size() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*node)->mempool_size(), 0u);
  auto client = NewGrpcChainClient((*node)->listen_address(), FastClient());
  auto balance = client->Balance(Addr(2));
  ASSERT_TRUE(balance.ok());
  // Each accepted send moved 1; a send whose answer was lost in the kill may have landed too.
  EXPECT_GE(*balance, kInitialBalance + sent);
  EXPECT_LE(*balance, kInitialBalance + attempted);
}

}  // namespace
}  // namespace ts::bridge
