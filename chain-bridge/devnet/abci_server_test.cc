// The ABCI face over a real socket, driven by a small client of the test's own that speaks
// CometBFT v0.38's socket protocol (varint-length-prefixed tendermint.abci.Request / Response):
// CometBFT's binaries are not available on these machines. What CometBFT does with a chain
// (InitChain, CheckTx, PrepareProposal, ProcessProposal, FinalizeBlock, Commit, Info, Query), on
// its four connections at once, and what an attacker gets (a huge length, a malformed varint,
// junk, a wrong height, one connection too many, a stalled request).
#include "chain-bridge/devnet/abci_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "chain-bridge/devnet/abci_wire.h"
#include "chain-bridge/devnet/devnet_test_util.h"
#include "chain-bridge/module/app.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "cosmos/bank/v1beta1/query.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::bridge::devnet {
namespace {

namespace abci = ::tendermint::abci;
using namespace devnet_test;  // NOLINT: the devnet's test keys and genesis
using ::testing::HasSubstr;

constexpr int64_t kReadTimeoutMs = 10000;

// One ABCI connection, as CometBFT's socket client holds it: requests are written in order, and
// a Flush asks for everything answered so far.
class AbciClient {
 public:
  // "host:port" or "unix:///path"; nullptr if the connection is refused.
  static std::unique_ptr<AbciClient> Connect(const std::string& address) {
    int fd = -1;
    if (address.rfind("unix://", 0) == 0) {
      const std::string path = address.substr(7);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      memcpy(addr.sun_path, path.data(), path.size());
      fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(fd);
        return nullptr;
      }
    } else {
      const size_t colon = address.rfind(':');
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      if (getaddrinfo(address.substr(0, colon).c_str(), address.substr(colon + 1).c_str(), &hints,
                      &found) != 0) {
        return nullptr;
      }
      fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const int rc = connect(fd, found->ai_addr, found->ai_addrlen);
      freeaddrinfo(found);
      if (rc != 0) {
        close(fd);
        return nullptr;
      }
    }
    return std::unique_ptr<AbciClient>(new AbciClient(fd));
  }

  ~AbciClient() { close(fd_); }

  bool SendRaw(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  bool Send(const abci::Request& request) {
    std::string bytes;
    AppendDelimited(request, &bytes);
    return SendRaw(bytes);
  }

  // The next response; nullopt on a close, an error or kReadTimeoutMs without one.
  std::optional<abci::Response> Read() {
    for (;;) {
      absl::StatusOr<LengthPrefix> prefix = ParseLengthPrefix(in_);
      if (!prefix.ok()) return std::nullopt;
      if (prefix->complete && in_.size() >= prefix->prefix_bytes + prefix->length) {
        abci::Response response;
        if (!response.ParseFromArray(in_.data() + prefix->prefix_bytes,
                                     static_cast<int>(prefix->length))) {
          return std::nullopt;
        }
        in_.erase(0, prefix->prefix_bytes + prefix->length);
        return response;
      }
      if (!ReadSome()) return std::nullopt;
    }
  }

  // Sends `request` and a Flush; returns the answer to the request after checking that the
  // Flush is answered after it.
  std::optional<abci::Response> Call(const abci::Request& request) {
    abci::Request flush;
    flush.mutable_flush();
    if (!Send(request) || !Send(flush)) return std::nullopt;
    std::optional<abci::Response> response = Read();
    std::optional<abci::Response> flushed = Read();
    if (response.has_value() && !response->has_exception()) {
      EXPECT_TRUE(flushed.has_value() && flushed->has_flush());
    }
    return response;
  }

  // True once the server has closed the connection (within kReadTimeoutMs), after any bytes
  // still on their way.
  bool ClosedByServer() {
    while (ReadSome()) {
    }
    return closed_;
  }

 private:
  explicit AbciClient(int fd) : fd_(fd) {}

  bool ReadSome() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(kReadTimeoutMs)) <= 0) return false;
    char buf[65536];
    ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_;
  std::string in_;
  bool closed_ = false;
};

abci::Request Echo(const std::string& message) {
  abci::Request request;
  request.mutable_echo()->set_message(message);
  return request;
}

abci::Request Info() {
  abci::Request request;
  request.mutable_info()->set_version("0.38.0");
  return request;
}

abci::Request InitChain(const std::string& chain_id) {
  abci::Request request;
  request.mutable_init_chain()->set_chain_id(chain_id);
  request.mutable_init_chain()->set_initial_height(1);
  request.mutable_init_chain()->mutable_time()->set_seconds(1'700'000'000);
  return request;
}

abci::Request CheckTx(const std::string& tx) {
  abci::Request request;
  request.mutable_check_tx()->set_tx(tx);
  return request;
}

abci::Request FinalizeBlock(int64_t height, const std::vector<std::string>& txs) {
  abci::Request request;
  abci::RequestFinalizeBlock* block = request.mutable_finalize_block();
  block->set_height(height);
  block->mutable_time()->set_seconds(1'700'000'000 + height);
  block->set_proposer_address(std::string(20, '\x01'));
  block->set_hash(std::string(32, '\x02'));
  for (const std::string& tx : txs) block->add_txs(tx);
  return request;
}

abci::Request Commit() {
  abci::Request request;
  request.mutable_commit();
  return request;
}

class AbciServerTest : public ::testing::Test {
 protected:
  void SetUp() override { genesis_ = TestGenesis(3); }

  // Options for a test: a free loopback port.
  static AbciServerOptions TestOptions() {
    AbciServerOptions options;
    options.listen_address = "127.0.0.1:0";
    return options;
  }

  void StartServer(const AbciServerOptions& options = TestOptions()) {
    auto server = AbciServer::Start(genesis_, options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<AbciClient> Connect() {
    auto client = AbciClient::Connect(server_->listen_address());
    EXPECT_NE(client, nullptr);
    return client;
  }

  // A bank send of `amount` from account 0 to account 1, signed for `sequence`.
  std::string SignedSend(uint64_t amount, uint64_t sequence) {
    auto reference = App::InitChain(genesis_);
    EXPECT_TRUE(reference.ok());
    auto account = (*reference)->Account(Addr(0));
    EXPECT_TRUE(account.ok());
    return BuildSignedTx(Key(0), kChainId, account->first, sequence, {Send(0, 1, amount)},
                         TxFee{kGasLimit, 0});
  }

  // The server's answer must be a ResponseException holding `fragment`, and the connection
  // must then be closed.
  static void ExpectException(AbciClient* client, const std::string& fragment) {
    std::optional<abci::Response> response = client->Read();
    ASSERT_TRUE(response.has_value()) << "no response before " << fragment;
    ASSERT_TRUE(response->has_exception()) << response->DebugString();
    EXPECT_THAT(response->exception().error(), HasSubstr(fragment));
    EXPECT_TRUE(client->ClosedByServer());
  }

  // The server still serves: a fresh connection gets its Info.
  void ExpectServing() {
    auto client = Connect();
    ASSERT_NE(client, nullptr);
    std::optional<abci::Response> info = client->Call(Info());
    ASSERT_TRUE(info.has_value());
    EXPECT_TRUE(info->has_info()) << info->DebugString();
  }

  pb::Genesis genesis_;
  std::unique_ptr<AbciServer> server_;
};

TEST(AbciWireTest, LengthPrefixRoundTripsAndRefusesMalformedVarints) {
  for (uint64_t length : {0ull, 1ull, 127ull, 128ull, 300ull, 1ull << 40, ~0ull}) {
    std::string bytes;
    AppendLengthPrefix(length, &bytes);
    auto prefix = ParseLengthPrefix(bytes);
    ASSERT_TRUE(prefix.ok()) << prefix.status();
    EXPECT_TRUE(prefix->complete);
    EXPECT_EQ(prefix->length, length);
    EXPECT_EQ(prefix->prefix_bytes, bytes.size());
    // Every proper prefix of it is incomplete, not an error.
    auto partial = ParseLengthPrefix(std::string_view(bytes).substr(0, bytes.size() - 1));
    ASSERT_TRUE(partial.ok());
    EXPECT_FALSE(partial->complete);
  }
  std::string bytes;
  AppendLengthPrefix(300, &bytes);
  EXPECT_EQ(bytes, "\xac\x02");  // as Go's binary.PutUvarint writes 300
  EXPECT_FALSE(ParseLengthPrefix(std::string(10, '\x80') + "\x01").ok());  // 11 bytes
  EXPECT_FALSE(ParseLengthPrefix(std::string(9, '\xff') + "\x02").ok());   // past 64 bits
  EXPECT_FALSE(ParseLengthPrefix(std::string("\x80\x00", 2)).ok());        // padded zero
}

// The bytes CometBFT v0.38 puts on the wire: the varint length, then the Request or Response
// with its oneof number (echo 1, flush 2 / 3, finalize_block 20 / 21, exception 1).
TEST(AbciWireTest, BytesAreCometBfts) {
  abci::Request echo;
  echo.mutable_echo()->set_message("hi");
  std::string bytes;
  AppendDelimited(echo, &bytes);
  EXPECT_EQ(bytes, std::string("\x06\x0a\x04\x0a\x02hi", 7));
  abci::Response flushed;
  flushed.mutable_flush();
  bytes.clear();
  AppendDelimited(flushed, &bytes);
  EXPECT_EQ(bytes, std::string("\x02\x1a\x00", 3));
  abci::Request finalize;
  finalize.mutable_finalize_block()->set_height(1);
  bytes.clear();
  AppendDelimited(finalize, &bytes);
  // Field 20, length-delimited: tag (20 << 3) | 2 = 162, a two-byte varint; then height (5).
  EXPECT_EQ(bytes, std::string("\x05\xa2\x01\x02\x28\x01", 6));
  abci::Response finalized;
  finalized.mutable_finalize_block()->set_app_hash("h");
  bytes.clear();
  AppendDelimited(finalized, &bytes);
  // Field 21: tag 170; then app_hash (5) = "h".
  EXPECT_EQ(bytes, std::string("\x06\xaa\x01\x03\x2a\x01h", 7));
  abci::Response exception;
  exception.mutable_exception()->set_error("x");
  bytes.clear();
  AppendDelimited(exception, &bytes);
  EXPECT_EQ(bytes, std::string("\x05\x0a\x03\x0a\x01x", 6));
}

TEST_F(AbciServerTest, EchoAndFlushAnswerInOrder) {
  StartServer();
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  // Pipelined: three echoes, then one Flush answered after all three.
  for (const char* message : {"one", "two", "three"}) ASSERT_TRUE(client->Send(Echo(message)));
  abci::Request flush;
  flush.mutable_flush();
  ASSERT_TRUE(client->Send(flush));
  for (const char* message : {"one", "two", "three"}) {
    std::optional<abci::Response> response = client->Read();
    ASSERT_TRUE(response.has_value());
    ASSERT_TRUE(response->has_echo()) << response->DebugString();
    EXPECT_EQ(response->echo().message(), message);
  }
  std::optional<abci::Response> flushed = client->Read();
  ASSERT_TRUE(flushed.has_value());
  EXPECT_TRUE(flushed->has_flush());
}

TEST_F(AbciServerTest, InfoOnAFreshServer) {
  StartServer();
  auto client = Connect();
  std::optional<abci::Response> response = client->Call(Info());
  ASSERT_TRUE(response.has_value());
  ASSERT_TRUE(response->has_info()) << response->DebugString();
  EXPECT_EQ(response->info().last_block_height(), 0);
  EXPECT_EQ(response->info().last_block_app_hash(), "");
  EXPECT_EQ(response->info().data(), "trainshard");
  EXPECT_EQ(response->info().version(), AbciAppOptions().version);
}

// CometBFT's path through a block, on its own connections: the same txs applied to an App
// directly give the same app hash.
TEST_F(AbciServerTest, ABlockThroughTheAbciFaceMatchesTheAppDirectly) {
  StartServer();
  auto consensus = Connect();
  auto mempool = Connect();
  auto query = Connect();

  std::optional<abci::Response> init = consensus->Call(InitChain(kChainId));
  ASSERT_TRUE(init.has_value());
  ASSERT_TRUE(init->has_init_chain()) << init->DebugString();
  auto direct = App::InitChain(genesis_);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(init->init_chain().app_hash(), (*direct)->app_hash());

  const std::vector<std::string> txs = {SignedSend(1000, 0), SignedSend(2000, 1)};
  for (const std::string& tx : txs) {
    std::optional<abci::Response> checked = mempool->Call(CheckTx(tx));
    ASSERT_TRUE(checked.has_value());
    ASSERT_TRUE(checked->has_check_tx()) << checked->DebugString();
    EXPECT_EQ(checked->check_tx().code(), 0u) << checked->check_tx().log();
    EXPECT_GT(checked->check_tx().gas_used(), 0);
    EXPECT_EQ(checked->check_tx().gas_wanted(), static_cast<int64_t>(kGasLimit));
  }

  // PrepareProposal: all fit; with room for one only the first stays (a prefix), and a tx
  // that does not decode is left out.
  abci::Request prepare;
  prepare.mutable_prepare_proposal()->set_height(1);
  prepare.mutable_prepare_proposal()->set_max_tx_bytes(1 << 20);
  for (const std::string& tx : txs) prepare.mutable_prepare_proposal()->add_txs(tx);
  std::optional<abci::Response> prepared = consensus->Call(prepare);
  ASSERT_TRUE(prepared.has_value() && prepared->has_prepare_proposal());
  EXPECT_THAT(prepared->prepare_proposal().txs(), ::testing::ElementsAreArray(txs));
  prepare.mutable_prepare_proposal()->set_max_tx_bytes(static_cast<int64_t>(txs[0].size()) + 1);
  prepared = consensus->Call(prepare);
  ASSERT_TRUE(prepared.has_value() && prepared->has_prepare_proposal());
  EXPECT_THAT(prepared->prepare_proposal().txs(), ::testing::ElementsAre(txs[0]));
  prepare.mutable_prepare_proposal()->set_max_tx_bytes(1 << 20);
  prepare.mutable_prepare_proposal()->add_txs("not a tx");
  prepared = consensus->Call(prepare);
  ASSERT_TRUE(prepared.has_value() && prepared->has_prepare_proposal());
  EXPECT_THAT(prepared->prepare_proposal().txs(), ::testing::ElementsAreArray(txs));

  abci::Request process;
  process.mutable_process_proposal()->set_height(1);
  for (const std::string& tx : txs) process.mutable_process_proposal()->add_txs(tx);
  std::optional<abci::Response> processed = consensus->Call(process);
  ASSERT_TRUE(processed.has_value() && processed->has_process_proposal());
  EXPECT_EQ(processed->process_proposal().status(), abci::ResponseProcessProposal::ACCEPT);
  process.mutable_process_proposal()->add_txs("not a tx");
  processed = consensus->Call(process);
  ASSERT_TRUE(processed.has_value() && processed->has_process_proposal());
  EXPECT_EQ(processed->process_proposal().status(), abci::ResponseProcessProposal::REJECT);

  std::optional<abci::Response> finalized = consensus->Call(FinalizeBlock(1, txs));
  ASSERT_TRUE(finalized.has_value());
  ASSERT_TRUE(finalized->has_finalize_block()) << finalized->DebugString();
  const abci::ResponseFinalizeBlock& block = finalized->finalize_block();
  ASSERT_EQ(block.tx_results_size(), 2);
  for (const abci::ExecTxResult& result : block.tx_results()) {
    EXPECT_EQ(result.code(), 0u) << result.log();
    EXPECT_GT(result.gas_used(), 0);
    EXPECT_FALSE(result.events().empty());
  }
  EXPECT_EQ(block.app_hash().size(), 32u);

  // Before Commit, Info still reports height 0.
  std::optional<abci::Response> info = query->Call(Info());
  ASSERT_TRUE(info.has_value() && info->has_info());
  EXPECT_EQ(info->info().last_block_height(), 0);

  std::optional<abci::Response> committed = consensus->Call(Commit());
  ASSERT_TRUE(committed.has_value());
  ASSERT_TRUE(committed->has_commit()) << committed->DebugString();
  EXPECT_EQ(committed->commit().retain_height(), 0);

  info = query->Call(Info());
  ASSERT_TRUE(info.has_value() && info->has_info());
  EXPECT_EQ(info->info().last_block_height(), 1);
  EXPECT_EQ(info->info().last_block_app_hash(), block.app_hash());
  EXPECT_EQ(server_->committed_height(), 1);

  // The same block on the App itself.
  tendermint::types::Header header;
  header.set_chain_id(kChainId);
  header.set_height(1);
  auto outcome = (*direct)->FinalizeBlock(header, txs);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  (*direct)->Commit();
  EXPECT_EQ(outcome->results.app_hash(), block.app_hash());
  ASSERT_EQ(outcome->results.tx_results_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(outcome->results.tx_results(i).gas_used(), block.tx_results(i).gas_used());
    EXPECT_EQ(outcome->results.tx_results(i).events_size(), block.tx_results(i).events_size());
  }
  EXPECT_EQ(outcome->results.end_block_events_size(), block.events_size());

  // Query runs the devnet's gRPC query services by path, at the latest height.
  cosmos::bank::v1beta1::QueryBalanceRequest balance_request;
  balance_request.set_address(Addr(1));
  balance_request.set_denom("ngonka");
  abci::Request balance;
  balance.mutable_query()->set_path("/cosmos.bank.v1beta1.Query/Balance");
  balance.mutable_query()->set_data(balance_request.SerializeAsString());
  std::optional<abci::Response> answered = query->Call(balance);
  ASSERT_TRUE(answered.has_value() && answered->has_query());
  EXPECT_EQ(answered->query().code(), 0u) << answered->query().log();
  EXPECT_EQ(answered->query().height(), 1);
  cosmos::bank::v1beta1::QueryBalanceResponse balance_response;
  ASSERT_TRUE(balance_response.ParseFromString(answered->query().value()));
  EXPECT_EQ(balance_response.balance().amount(), std::to_string(kInitialBalance + 3000));
  EXPECT_EQ(balance_response.balance().amount(), std::to_string((*direct)->Balance(Addr(1))));

  abci::Request unknown;
  unknown.mutable_query()->set_path("/store/bank/key");
  answered = query->Call(unknown);
  ASSERT_TRUE(answered.has_value() && answered->has_query());
  EXPECT_EQ(answered->query().codespace(), kSdkCodespace);
  EXPECT_EQ(answered->query().code(), static_cast<uint32_t>(SdkCode::kUnknownRequest));

  // The mempool's next tx (sequence 2) is checked against the committed state.
  std::optional<abci::Response> next = mempool->Call(CheckTx(SignedSend(1, 2)));
  ASSERT_TRUE(next.has_value() && next->has_check_tx());
  EXPECT_EQ(next->check_tx().code(), 0u) << next->check_tx().log();
  std::optional<abci::Response> replayed = mempool->Call(CheckTx(txs[0]));
  ASSERT_TRUE(replayed.has_value() && replayed->has_check_tx());
  EXPECT_NE(replayed->check_tx().code(), 0u);
}

TEST_F(AbciServerTest, InitChainForAnotherChainIsAnException) {
  StartServer();
  auto client = Connect();
  ASSERT_TRUE(client->Send(InitChain("another-chain-7")));
  ExpectException(client.get(), "another-chain-7");
  ExpectServing();
}

TEST_F(AbciServerTest, FinalizeBlockAtTheWrongHeightIsAnExceptionNamingBothHeights) {
  StartServer();
  auto consensus = Connect();
  std::optional<abci::Response> init = consensus->Call(InitChain(kChainId));
  ASSERT_TRUE(init.has_value() && init->has_init_chain());
  ASSERT_TRUE(consensus->Send(FinalizeBlock(5, {})));
  ExpectException(consensus.get(), "height 5 is not the next height");
  // Still at height 0: height 1 goes through on a new connection.
  auto again = Connect();
  std::optional<abci::Response> finalized = again->Call(FinalizeBlock(1, {}));
  ASSERT_TRUE(finalized.has_value());
  EXPECT_TRUE(finalized->has_finalize_block()) << finalized->DebugString();
  // The same block again before Commit (CometBFT restarted in between) gets the same answer;
  // another block at that height is an exception.
  std::optional<abci::Response> replayed = again->Call(FinalizeBlock(1, {}));
  ASSERT_TRUE(replayed.has_value() && replayed->has_finalize_block());
  EXPECT_EQ(replayed->finalize_block().app_hash(), finalized->finalize_block().app_hash());
  auto other = Connect();
  abci::Request forked = FinalizeBlock(1, {});
  forked.mutable_finalize_block()->set_hash(std::string(32, '\x03'));
  ASSERT_TRUE(other->Send(forked));
  ExpectException(other.get(), "was finalized and is not committed yet");
  std::optional<abci::Response> committed = again->Call(Commit());
  ASSERT_TRUE(committed.has_value() && committed->has_commit());
  ASSERT_TRUE(again->Send(FinalizeBlock(1, {})));
  std::optional<abci::Response> response = again->Read();
  ASSERT_TRUE(response.has_value() && response->has_exception());
  EXPECT_THAT(response->exception().error(), HasSubstr("at height 1 and expects 2"));
}

TEST_F(AbciServerTest, FourConnectionsAtOnce) {
  StartServer();
  std::vector<std::unique_ptr<AbciClient>> clients;
  for (int i = 0; i < 4; ++i) clients.push_back(Connect());
  auto consensus = Connect();
  std::optional<abci::Response> init = consensus->Call(InitChain(kChainId));
  ASSERT_TRUE(init.has_value() && init->has_init_chain());
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 50; ++round) {
        std::optional<abci::Response> echo =
            clients[static_cast<size_t>(i)]->Call(Echo(absl::StrCat(i, "/", round)));
        std::optional<abci::Response> info = clients[static_cast<size_t>(i)]->Call(Info());
        if (echo.has_value() && echo->echo().message() == absl::StrCat(i, "/", round) &&
            info.has_value() && info->has_info()) {
          ++answered;
        }
      }
    });
  }
  // Blocks go on meanwhile on the consensus connection.
  for (int64_t height = 1; height <= 5; ++height) {
    std::optional<abci::Response> finalized = consensus->Call(FinalizeBlock(height, {}));
    ASSERT_TRUE(finalized.has_value() && finalized->has_finalize_block());
    std::optional<abci::Response> committed = consensus->Call(Commit());
    ASSERT_TRUE(committed.has_value() && committed->has_commit());
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(answered.load(), 200);
  EXPECT_EQ(server_->committed_height(), 5);
  EXPECT_EQ(server_->connections(), 5);
}

TEST_F(AbciServerTest, AHugeLengthIsRefusedBeforeAnythingIsRead) {
  StartServer();
  auto attacker = Connect();
  std::string bytes;
  AppendLengthPrefix(1ull << 40, &bytes);
  ASSERT_TRUE(attacker->SendRaw(bytes));
  ExpectException(attacker.get(), "exceed the cap");
  ExpectServing();
}

// A long block is read in pieces and served; one byte over the cap is refused.
TEST_F(AbciServerTest, ALongBlockIsServedUpToTheCap) {
  AbciServerOptions options = TestOptions();
  options.max_message_bytes = 16 << 20;
  StartServer(options);
  auto consensus = Connect();
  std::optional<abci::Response> init = consensus->Call(InitChain(kChainId));
  ASSERT_TRUE(init.has_value() && init->has_init_chain());
  // Ten txs of 900 KiB that do not decode: each is a failed tx, the block is fine.
  const std::vector<std::string> txs(10, std::string(900 << 10, '\x42'));
  std::optional<abci::Response> finalized = consensus->Call(FinalizeBlock(1, txs));
  ASSERT_TRUE(finalized.has_value());
  ASSERT_TRUE(finalized->has_finalize_block()) << finalized->DebugString().substr(0, 200);
  ASSERT_EQ(finalized->finalize_block().tx_results_size(), 10);
  for (const abci::ExecTxResult& result : finalized->finalize_block().tx_results()) {
    EXPECT_NE(result.code(), 0u);
  }
  auto attacker = Connect();
  abci::Request echo = Echo(std::string(options.max_message_bytes, 'x'));
  std::string bytes;
  AppendDelimited(echo, &bytes);
  ASSERT_GT(bytes.size(), options.max_message_bytes);
  ASSERT_TRUE(attacker->SendRaw(bytes.substr(0, 16)));
  ExpectException(attacker.get(), "exceed the cap of 16777216");
  std::optional<abci::Response> committed = consensus->Call(Commit());
  ASSERT_TRUE(committed.has_value() && committed->has_commit());
}

TEST_F(AbciServerTest, AnElevenByteVarintIsRefused) {
  StartServer();
  auto attacker = Connect();
  ASSERT_TRUE(attacker->SendRaw(std::string(10, '\x80') + "\x01"));
  ExpectException(attacker.get(), "length prefix");
  ExpectServing();
}

TEST_F(AbciServerTest, ARequestThatDoesNotParseIsRefused) {
  StartServer();
  auto attacker = Connect();
  // Field 1 as a length-delimited value that claims more bytes than there are.
  std::string bytes;
  AppendLengthPrefix(3, &bytes);
  bytes += std::string("\x0a\x7f\x00", 3);
  ASSERT_TRUE(attacker->SendRaw(bytes));
  ExpectException(attacker.get(), "do not parse");
  // An empty request parses but names no method.
  auto empty = Connect();
  ASSERT_TRUE(empty->SendRaw(std::string(1, '\0')));
  ExpectException(empty.get(), "no value");
  ExpectServing();
}

TEST_F(AbciServerTest, OneConnectionTooManyIsRefusedAndTheOthersStillServe) {
  StartServer();
  std::vector<std::unique_ptr<AbciClient>> clients;
  for (int i = 0; i < kAbciMaxConnections; ++i) {
    clients.push_back(Connect());
    // Each is served before the next is opened, so the server has counted it.
    std::optional<abci::Response> echo = clients.back()->Call(Echo("hi"));
    ASSERT_TRUE(echo.has_value() && echo->has_echo());
  }
  EXPECT_EQ(server_->connections(), kAbciMaxConnections);
  auto extra = Connect();
  ASSERT_NE(extra, nullptr);
  ExpectException(extra.get(), "connections are open already");
  for (auto& client : clients) {
    std::optional<abci::Response> info = client->Call(Info());
    ASSERT_TRUE(info.has_value() && info->has_info());
  }
  // A closed connection frees its place.
  clients.pop_back();
  for (int i = 0; i < 200 && server_->connections() >= kAbciMaxConnections; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ExpectServing();
}

TEST_F(AbciServerTest, AStalledRequestHoldsOnlyItsOwnConnection) {
  AbciServerOptions options = TestOptions();
  options.message_timeout_ms = 2000;
  StartServer(options);
  auto consensus = Connect();
  std::optional<abci::Response> init = consensus->Call(InitChain(kChainId));
  ASSERT_TRUE(init.has_value() && init->has_init_chain());
  // Announces 1,000 bytes and sends 10.
  auto slow = Connect();
  std::string bytes;
  AppendLengthPrefix(1000, &bytes);
  bytes += std::string(10, '\x0a');
  ASSERT_TRUE(slow->SendRaw(bytes));
  // Meanwhile blocks are finalized and committed at once.
  const auto start = std::chrono::steady_clock::now();
  std::optional<abci::Response> finalized = consensus->Call(FinalizeBlock(1, {}));
  ASSERT_TRUE(finalized.has_value() && finalized->has_finalize_block());
  std::optional<abci::Response> committed = consensus->Call(Commit());
  ASSERT_TRUE(committed.has_value() && committed->has_commit());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
  // Then the stalled request times out, and only its connection is closed.
  ExpectException(slow.get(), "incomplete after 2000 ms");
  std::optional<abci::Response> info = consensus->Call(Info());
  ASSERT_TRUE(info.has_value() && info->has_info());
  EXPECT_EQ(info->info().last_block_height(), 1);
}

TEST_F(AbciServerTest, ServesAUnixSocket) {
  TempDir dir;
  AbciServerOptions options = TestOptions();
  options.listen_address = absl::StrCat("unix://", dir.path(), "/abci.sock");
  StartServer(options);
  EXPECT_EQ(server_->listen_address(), options.listen_address);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::optional<abci::Response> echo = client->Call(Echo("over a unix socket"));
  ASSERT_TRUE(echo.has_value() && echo->has_echo());
  EXPECT_EQ(echo->echo().message(), "over a unix socket");
  client.reset();
  server_->Shutdown();
  // The socket file is removed, and a new server may take the path.
  StartServer(options);
  EXPECT_NE(Connect(), nullptr);
}

TEST_F(AbciServerTest, RefusesBadOptions) {
  AbciServerOptions options = TestOptions();
  options.listen_address = "unix://relative.sock";
  EXPECT_EQ(AbciServer::Start(genesis_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.listen_address = "127.0.0.1";
  EXPECT_EQ(AbciServer::Start(genesis_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.listen_address = "127.0.0.1:0";
  options.max_connections = 0;
  EXPECT_EQ(AbciServer::Start(genesis_, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  pb::Genesis bad = genesis_;
  bad.clear_chain_id();
  EXPECT_EQ(AbciServer::Start(bad, TestOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::bridge::devnet
