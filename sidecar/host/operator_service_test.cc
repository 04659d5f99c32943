#include "sidecar/host/operator_service.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/signing.h"
#include "common/status.h"
#include "sidecar/host/fake_chain_client.h"

namespace ts::sidecar {
namespace {

using testing::FakeChainClient;
using ::testing::HasSubstr;
using testing::MakeEvent;

constexpr char kChainId[] = "fake-chain-1";

common::PrivateKey KeyOf(char byte) {
  auto key = common::PrivateKey::FromBytes(std::string(32, byte));
  TS_CHECK(key.ok());
  return *key;
}

tendermint::abci::Event Opened(uint64_t id) {
  return MakeEvent("trainshard.shard_opened", {{"shard_id", std::to_string(id)},
                                               {"creator", "gonka1creator"},
                                               {"hardware_profile", "cpu-small"},
                                               {"min_nodes", "1"},
                                               {"max_nodes", "2"},
                                               {"min_host_weight", "1"},
                                               {"escrow", "1000"},
                                               {"reservation_deadline_height", "1000"},
                                               {"deadline_height", "5000"}});
}

tendermint::abci::Event Added(uint64_t id, const std::string& host, uint32_t members) {
  return MakeEvent("trainshard.reservation_added", {{"shard_id", std::to_string(id)},
                                                    {"host", host},
                                                    {"frozen_weight", "50"},
                                                    {"endpoint", "127.0.0.1:7000"},
                                                    {"members", std::to_string(members)}});
}

// The host's certified records as a test sets them: the draft they imply, or an error.
class FakeRecords final : public SettlementRecords {
 public:
  absl::StatusOr<pb::Settlement> CertifiedDraft(uint64_t shard_id, uint64_t, absl::Time) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (!draft_.ok() || draft_->shard_id() == shard_id) return draft_;
    return absl::FailedPreconditionError("no training records for this shard");
  }
  void Set(absl::StatusOr<pb::Settlement> draft) {
    absl::MutexLock lock(&mu_);
    draft_ = std::move(draft);
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  absl::StatusOr<pb::Settlement> draft_ ABSL_GUARDED_BY(mu_) =
      absl::FailedPreconditionError("no training records for this shard");
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

class OperatorServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-operator-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    address_ = common::AddressFromPublicKey(key_.public_key());
    other_ = common::AddressFromPublicKey(KeyOf(0x22).public_key());
    chain_.SetAccount(address_, 3, 0);
    chain_.SetWeight(address_, 50);
    HostCoreOptions options;
    options.shard_endpoint = "127.0.0.1:7001";
    options.policy.auto_reserve = false;
    options.disk_full_fault = disk_full_;
    auto core = HostCore::Open(dir_ + "/state", key_, options, &chain_, &common::SystemClock());
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
    daemon_ = std::make_unique<HostDaemon>(core_.get(), /*poll_interval_ms=*/10);
    daemon_->Start();
    OperatorServerOptions server_options;
    server_options.socket_path = dir_ + "/host.sock";
    server_options.query_listen = "127.0.0.1:0";
    server_options.version = "test-version";
    server_options.records = &records_;
    server_options.run_starts = [] {
      pb::RunStartStatus r;
      r.set_shard_id(4);
      r.set_attempts(2);
      r.set_last_error("UNAVAILABLE: shard process not up");
      return std::vector<pb::RunStartStatus>{r};
    };
    auto server = StartOperatorServer(core_.get(), daemon_.get(), server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = grpc::CreateChannel(server_.address, grpc::InsecureChannelCredentials());
    operator_ = pb::HostOperator::NewStub(channel);
    query_ = pb::SettlementQuery::NewStub(channel);
    public_channel_ =
        grpc::CreateChannel(server_.query_address, grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    server_.Shutdown(std::chrono::system_clock::now());
    daemon_->Stop();
    daemon_.reset();
    core_.reset();
    std::system(("rm -rf " + dir_).c_str());
  }

  std::unique_ptr<grpc::ClientContext> Context(int timeout_ms = 5000) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    return context;
  }

  pb::HostStatusResponse Status() {
    pb::HostStatusResponse response;
    grpc::Status s = operator_->Status(Context().get(), pb::HostStatusRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  void WaitForCursor(int64_t height) {
    for (int i = 0; i < 500 && Status().cursor_height() < height; ++i) usleep(10000);
    ASSERT_EQ(Status().cursor_height(), height);
  }

  // Shard 1 RUNNING with this host and `other_` as members, escrow 1000.
  void RunningShard() {
    chain_.AddEvent(1, Opened(1));
    chain_.AddEvent(1, Added(1, address_, 1));
    chain_.AddEvent(1, Added(1, other_, 2));
    chain_.AddEvent(1, MakeEvent("trainshard.shard_running",
                                 {{"shard_id", "1"}, {"members", "2"}, {"total_weight", "100"}}));
    WaitForCursor(1);
  }

  pb::Settlement Draft() {
    pb::Settlement d;
    d.set_chain_id(kChainId);
    d.set_shard_id(1);
    d.set_final_checkpoint_root(std::string(32, '\x01'));
    auto* p = d.add_payouts();
    p->set_host(address_);
    p->set_amount("600");
    p = d.add_payouts();
    p->set_host(other_);
    p->set_amount("400");
    d.set_refund("0");
    return d;
  }

  std::string dir_;
  common::PrivateKey key_ = KeyOf(0x11);
  std::string address_;
  std::string other_;
  FakeChainClient chain_{kChainId};
  FakeRecords records_;
  std::shared_ptr<grpc::Channel> public_channel_;
  std::shared_ptr<state::DiskFullFault> disk_full_ = std::make_shared<state::DiskFullFault>();
  std::unique_ptr<HostCore> core_;
  std::unique_ptr<HostDaemon> daemon_;
  OperatorServer server_;
  std::unique_ptr<pb::HostOperator::Stub> operator_;
  std::unique_ptr<pb::SettlementQuery::Stub> query_;
};

// While the records' disk is full the follower stands still, and Status says why and since
// when; once space is back it catches up by itself and the errors clear.
TEST_F(OperatorServiceTest, StatusSaysWhyTheFollowerStandsStillOnAFullDisk) {
  chain_.AddEvent(1, MakeEvent("bank.transfer", {{"amount", "1"}}));
  WaitForCursor(1);
  pb::HostStatusResponse healthy = Status();
  EXPECT_EQ(healthy.records_path(), dir_ + "/state");
  EXPECT_EQ(healthy.records_error(), "");
  EXPECT_EQ(healthy.follower_error(), "");
  EXPECT_EQ(healthy.follower_error_since_unix_ms(), 0);

  const int64_t filled_ms = absl::ToUnixMillis(absl::Now());
  disk_full_->Set(true);
  chain_.SetLatestHeight(10);
  for (int i = 0; i < 500 && Status().follower_error().empty(); ++i) usleep(10000);
  pb::HostStatusResponse down = Status();
  EXPECT_EQ(down.cursor_height(), 1);
  EXPECT_EQ(down.chain_height(), 10);
  EXPECT_THAT(down.follower_error(), HasSubstr("No space left on device"));
  EXPECT_GE(down.follower_error_since_unix_ms(), filled_ms);
  EXPECT_THAT(down.records_error(), HasSubstr("No space left on device"));
  EXPECT_THAT(down.records_error(), HasSubstr(dir_ + "/state"));
  EXPECT_GE(down.records_error_since_unix_ms(), filled_ms);
  EXPECT_EQ(down.records_recoveries(), 0u);

  disk_full_->Set(false);
  WaitForCursor(10);
  pb::HostStatusResponse up = Status();
  EXPECT_EQ(up.follower_error(), "");
  EXPECT_EQ(up.follower_error_since_unix_ms(), 0);
  EXPECT_EQ(up.records_error(), "");
  EXPECT_EQ(up.records_error_since_unix_ms(), 0);
  EXPECT_EQ(up.records_recoveries(), 1u);
}

TEST_F(OperatorServiceTest, StatusListEventsAndShards) {
  for (int64_t h = 1; h <= 5; ++h) {
    chain_.AddEvent(h, MakeEvent("bank.transfer", {{"amount", std::to_string(h)}}));
  }
  chain_.AddEvent(5, Opened(9));
  WaitForCursor(5);
  pb::HostStatusResponse status = Status();
  EXPECT_EQ(status.address(), address_);
  EXPECT_EQ(status.chain_id(), kChainId);
  EXPECT_EQ(status.events_processed(), 6u);
  EXPECT_EQ(status.version(), "test-version");
  EXPECT_EQ(status.pending_txs(), 0u);
  ASSERT_EQ(status.run_starts_size(), 1);  // what the run starter says, as it says it
  EXPECT_EQ(status.run_starts(0).shard_id(), 4u);
  EXPECT_FALSE(status.run_starts(0).started());
  EXPECT_EQ(status.run_starts(0).last_error(), "UNAVAILABLE: shard process not up");

  pb::ListEventsRequest request;
  request.set_from_height(3);
  request.set_limit(2);
  pb::ListEventsResponse events;
  ASSERT_TRUE(operator_->ListEvents(Context().get(), request, &events).ok());
  ASSERT_EQ(events.events_size(), 2);
  EXPECT_EQ(events.events(0).height(), 3);
  EXPECT_EQ(events.events(1).height(), 4);
  request.set_from_height(0);
  for (uint32_t limit : {0u, 5000u}) {
    request.set_limit(limit);
    events.Clear();
    ASSERT_TRUE(operator_->ListEvents(Context().get(), request, &events).ok());
    EXPECT_EQ(events.events_size(), 6) << limit;
  }
  EXPECT_THAT(events.events(5).action(), HasSubstr("skip:auto_reserve is off"));
  request.set_from_height(-1);
  grpc::Status bad = operator_->ListEvents(Context().get(), request, &events);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  pb::ListShardsResponse shards;
  ASSERT_TRUE(operator_->ListShards(Context().get(), pb::ListShardsRequest(), &shards).ok());
  ASSERT_EQ(shards.shards_size(), 1);
  EXPECT_EQ(shards.shards(0).shard_id(), 9u);
  EXPECT_EQ(shards.shards(0).status(), pb::SHARD_STATUS_OPEN);
}

TEST_F(OperatorServiceTest, ReserveMapsErrorsAndReturnsTheTxHash) {
  chain_.AddEvent(1, Opened(1));
  WaitForCursor(1);
  pb::ReserveRequest request;
  pb::ReserveResponse response;
  request.set_shard_id(42);
  EXPECT_EQ(operator_->Reserve(Context().get(), request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  request.set_shard_id(0);
  EXPECT_EQ(operator_->Reserve(Context().get(), request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  request.set_shard_id(1);
  grpc::Status ok = operator_->Reserve(Context().get(), request, &response);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(response.txhash().size(), 64u);
  EXPECT_EQ(chain_.mempool_hashes(), std::vector<std::string>{response.txhash()});
  grpc::Status again = operator_->Reserve(Context().get(), request, &response);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(OperatorServiceTest, SignSettlementThenGetSettlement) {
  RunningShard();
  pb::GetSettlementRequest get;
  get.set_shard_id(1);
  pb::GetSettlementResponse got;
  EXPECT_EQ(query_->GetSettlement(Context().get(), get, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);

  pb::SignSettlementRequest request;
  pb::SignSettlementResponse response;
  EXPECT_EQ(operator_->SignSettlement(Context().get(), request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  records_.Set(Draft());
  *request.mutable_draft() = Draft();
  grpc::Status s = operator_->SignSettlement(Context().get(), request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.signature().host(), address_);
  EXPECT_EQ(*common::RecoverStatementSigner("settlement", kChainId, 1, DeterministicBytes(Draft()),
                                            response.signature().signature()),
            address_);

  ASSERT_TRUE(query_->GetSettlement(Context().get(), get, &got).ok());
  EXPECT_EQ(DeterministicBytes(got.settlement()), DeterministicBytes(Draft()));
  EXPECT_EQ(got.signature().signature(), response.signature().signature());

  // Even if the records came to imply another draft, a host signs one settlement per shard.
  request.mutable_draft()->set_refund("1");
  request.mutable_draft()->mutable_payouts(0)->set_amount("599");
  records_.Set(request.draft());
  grpc::Status refused = operator_->SignSettlement(Context().get(), request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("different settlement"));
}

TEST_F(OperatorServiceTest, OnlyTheDraftTheCertifiedRecordsImplyIsSigned) {
  RunningShard();
  pb::SignSettlementRequest request;
  pb::SignSettlementResponse response;
  *request.mutable_draft() = Draft();
  // No records for the shard: nothing is signed, nothing is stored.
  grpc::Status none = operator_->SignSettlement(Context().get(), request, &response);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(none.error_message(), HasSubstr("no training records"));

  // Records that imply another root: the bogus draft is refused naming the difference, and
  // the host can still sign the honest one afterwards (the refusal took nothing).
  pb::Settlement honest = Draft();
  honest.set_final_checkpoint_root(std::string(32, '\x07'));
  records_.Set(honest);
  grpc::Status bogus = operator_->SignSettlement(Context().get(), request, &response);
  EXPECT_EQ(bogus.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(bogus.error_message(), HasSubstr("certified records"));
  EXPECT_THAT(bogus.error_message(), HasSubstr("final_checkpoint_root"));
  // Payouts moved between members are just as different.
  pb::Settlement shifted = honest;
  shifted.mutable_payouts(0)->set_amount("700");
  shifted.mutable_payouts(1)->set_amount("300");
  *request.mutable_draft() = shifted;
  grpc::Status moved = operator_->SignSettlement(Context().get(), request, &response);
  EXPECT_EQ(moved.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(moved.error_message(), HasSubstr("payouts"));

  *request.mutable_draft() = honest;
  grpc::Status ok = operator_->SignSettlement(Context().get(), request, &response);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(*common::RecoverStatementSigner("settlement", kChainId, 1, DeterministicBytes(honest),
                                            response.signature().signature()),
            address_);

  // Records that cannot be read now: refused with their error, not signed.
  records_.Set(absl::UnavailableError("the shard process is starting"));
  EXPECT_EQ(operator_->SignSettlement(Context().get(), request, &response).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(OperatorServiceTest, TheOperatorApiIsOnAnOwnerOnlySocketAndTheTcpListenerOnlyQueries) {
  struct stat st = {};
  ASSERT_EQ(::lstat((dir_ + "/host.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(server_.address, "unix:" + dir_ + "/host.sock");
  // On TCP: SettlementQuery answers, the operator API does not exist.
  auto public_operator = pb::HostOperator::NewStub(public_channel_);
  pb::HostStatusResponse status;
  grpc::Status refused = public_operator->Status(Context().get(), pb::HostStatusRequest(), &status);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED) << refused.error_message();
  pb::SignSettlementRequest sign;
  *sign.mutable_draft() = Draft();
  pb::SignSettlementResponse signed_draft;
  EXPECT_EQ(public_operator->SignSettlement(Context().get(), sign, &signed_draft).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(records_.calls(), 0);
  auto public_query = pb::SettlementQuery::NewStub(public_channel_);
  pb::GetSettlementRequest get;
  get.set_shard_id(1);
  pb::GetSettlementResponse got;
  EXPECT_EQ(public_query->GetSettlement(Context().get(), get, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(OperatorServiceTest, SubmitSettlementSignsAsThisHost) {
  pb::SubmitSettlementRequest request;
  pb::SubmitSettlementResponse response;
  EXPECT_EQ(operator_->SubmitSettlement(Context().get(), request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  *request.mutable_settlement() = Draft();
  auto* sig = request.add_signatures();
  sig->set_host(address_);
  sig->set_signature(std::string(65, '\x02'));
  grpc::Status s = operator_->SubmitSettlement(Context().get(), request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.txhash(), "SETTLE");
  EXPECT_EQ(response.code(), 0u);
  auto settles = chain_.settles();
  ASSERT_EQ(settles.size(), 1u);
  EXPECT_EQ(settles[0].submitter(), address_);
  EXPECT_EQ(settles[0].signatures_size(), 1);
  EXPECT_EQ(settles[0].settlement().shard_id(), 1u);
}

TEST_F(OperatorServiceTest, OversizeRequestIsRefusedBeforeTheHandler) {
  pb::SignSettlementRequest request;
  *request.mutable_draft() = Draft();
  request.mutable_draft()->mutable_evaluation()->set_metric(std::string(2 << 20, 'm'));
  pb::SignSettlementResponse response;
  grpc::Status s = operator_->SignSettlement(Context().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  pb::GetSettlementResponse got;
  pb::GetSettlementRequest get;
  get.set_shard_id(1);
  EXPECT_EQ(query_->GetSettlement(Context().get(), get, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(HostDaemonTest, DeadlinesAndABoundedQueue) {
  char dir_template[] = "/tmp/ts-daemon-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string dir = dir_template;
  FakeChainClient chain(kChainId);
  HostCoreOptions options;
  options.shard_endpoint = "127.0.0.1:7001";
  auto core = HostCore::Open(dir + "/state", KeyOf(0x11), options, &chain, &common::SystemClock());
  ASSERT_TRUE(core.ok());
  {
    HostDaemon daemon(core->get(), /*poll_interval_ms=*/10, /*max_queued_commands=*/1);
    daemon.Start();
    std::atomic<bool> release{false};
    std::atomic<int> ran{0};
    // Occupies the owner thread until released.
    std::thread blocker([&] {
      EXPECT_TRUE(daemon
                      .Run(
                          [&](HostCore&) {
                            while (!release) usleep(1000);
                            ++ran;
                          },
                          absl::Now() + absl::Seconds(10))
                      .ok());
    });
    usleep(100000);  // the owner thread is now inside the blocker
    // One queued command fills the queue; the next is refused at once.
    std::thread queued([&] {
      EXPECT_EQ(
          daemon.Run([&](HostCore&) { ran += 100; }, absl::Now() + absl::Milliseconds(200)).code(),
          absl::StatusCode::kDeadlineExceeded);
    });
    usleep(50000);
    EXPECT_EQ(daemon.Run([&](HostCore&) {}, absl::Now() + absl::Seconds(1)).code(),
              absl::StatusCode::kResourceExhausted);
    queued.join();
    release = true;
    blocker.join();
    // Commands that timed out before starting never run.
    EXPECT_TRUE(daemon.Run([&](HostCore&) { ran += 1000; }, absl::Now() + absl::Seconds(5)).ok());
    EXPECT_EQ(ran, 1001);
    daemon.Stop();
    EXPECT_EQ(daemon.Run([&](HostCore&) {}, absl::Now() + absl::Seconds(1)).code(),
              absl::StatusCode::kUnavailable);
  }
  core->reset();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ts::sidecar
