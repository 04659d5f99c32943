// End to end: the `trainshard` binary against a real devnet it starts itself (`devnet start` in a
// child process, stopped with SIGTERM), through a whole shard: keys, genesis, transfers, weights,
// a proposal and its votes, reservations through sidecar stand-ins (real gRPC servers on
// 127.0.0.1 that sign with real keys), assembly, a refused and an accepted settlement, events,
// blocks, and a replay of the stored chain. Also `artifact publish` and `artifact fetch` against
// a stand-in that streams progress: what the binary writes on stdout and on stderr.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/key_file.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/deterministic.h"
#include "tests/util/loopback_server.h"

#ifndef TS_TRAINSHARD_BINARY
#error "TS_TRAINSHARD_BINARY must name the trainshard executable"
#endif

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;
using Json = nlohmann::json;

struct ToolResult {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Describe(const std::vector<std::string>& args, const ToolResult& r) {
  std::string line = "trainshard";
  for (const auto& a : args) line += " " + a;
  return line + "\nexit " + std::to_string(r.code) + "\nstdout: " + r.out + "\nstderr: " + r.err;
}

std::vector<char*> Argv(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(TS_TRAINSHARD_BINARY));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  return argv;
}

// Runs the binary to completion, capturing stdout and stderr.
ToolResult RunTool(const std::vector<std::string>& args) {
  int out_pipe[2];
  int err_pipe[2];
  TS_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0);
  std::vector<char*> argv = Argv(args);
  pid_t pid = ::fork();
  TS_CHECK(pid >= 0);
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ToolResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (::poll(fds, 2, 120000) <= 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// Runs with --json, expects exit 0, returns the parsed document.
Json JsonTool(std::vector<std::string> args) {
  args.push_back("--json");
  ToolResult r = RunTool(args);
  EXPECT_EQ(r.code, 0) << Describe(args, r);
  Json doc = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << "not one JSON document: " << Describe(args, r);
  return doc;
}

bool WaitFor(const std::function<bool()>& predicate, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return predicate();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// A stand-in for a host sidecar: reserves with its own signed statement and signs any
// settlement draft, with the same key as the real sidecar would.
class MemberSidecar final : public pb::HostOperator::Service {
 public:
  // A `tampering` one signs a draft other than the one it was asked to sign.
  MemberSidecar(common::PrivateKey key, const std::string& chain, bool tampering = false)
      : key_(std::move(key)), chain_(bridge::NewGrpcChainClient(chain)), tampering_(tampering) {
    server_ = test_util::StartLoopbackServer({this});
  }
  ~MemberSidecar() override { server_.server->Shutdown(); }

  std::string address() const { return server_.endpoint; }
  std::string account() const { return common::AddressFromPublicKey(key_.public_key()); }

  grpc::Status Reserve(grpc::ServerContext*, const pb::ReserveRequest* request,
                       pb::ReserveResponse* response) override {
    auto status = chain_->Status();
    if (!status.ok()) return ToGrpc(status.status());
    pb::Reservation r;
    r.set_shard_id(request->shard_id());
    r.set_host(account());
    r.set_endpoint("127.0.0.1:7" + std::to_string(server_.port % 1000));
    r.set_tls_cert_sha256(common::Sha256("certificate of " + account()));
    r.set_valid_until_height(status->latest_height + 100);
    auto signature = common::SignStatement(key_, "reservation", status->chain_id, r.shard_id(),
                                           DeterministicBytes(r));
    if (!signature.ok()) return ToGrpc(signature.status());
    r.set_signature(*signature);
    pb::MsgReserveTrainshard msg;
    *msg.mutable_reservation() = r;
    auto tx = chain_->SignAndBroadcast(key_, {bridge::PackMsg(msg)}, /*wait=*/true);
    if (!tx.ok()) return ToGrpc(tx.status());
    if (tx->code() != 0) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, tx->raw_log());
    response->set_txhash(tx->txhash());
    return grpc::Status::OK;
  }

  grpc::Status SignSettlement(grpc::ServerContext*, const pb::SignSettlementRequest* request,
                              pb::SignSettlementResponse* response) override {
    pb::Settlement draft = request->draft();
    if (tampering_) draft.set_refund("0");
    auto signature = common::SignStatement(key_, "settlement", draft.chain_id(), draft.shard_id(),
                                           DeterministicBytes(draft));
    if (!signature.ok()) return ToGrpc(signature.status());
    response->mutable_signature()->set_host(account());
    response->mutable_signature()->set_signature(*signature);
    return grpc::Status::OK;
  }

  grpc::Status SubmitSettlement(grpc::ServerContext*, const pb::SubmitSettlementRequest* request,
                                pb::SubmitSettlementResponse* response) override {
    pb::MsgSettleTrainshard msg;
    msg.set_submitter(account());
    *msg.mutable_settlement() = request->settlement();
    *msg.mutable_signatures() = request->signatures();
    auto tx = chain_->SignAndBroadcast(key_, {bridge::PackMsg(msg)}, /*wait=*/true);
    if (!tx.ok()) return ToGrpc(tx.status());
    response->set_txhash(tx->txhash());
    response->set_code(tx->code());
    response->set_raw_log(tx->raw_log());
    return grpc::Status::OK;
  }

 private:
  common::PrivateKey key_;
  std::unique_ptr<bridge::ChainClient> chain_;
  bool tampering_;
  test_util::LoopbackServer server_;
};

class DevnetProcess {
 public:
  DevnetProcess(const std::string& home, const std::string& log) {
    std::vector<std::string> args = {"devnet",       "start",       "--home",
                                     home,           "--listen",    "127.0.0.1:0",
                                     "--rpc-listen", "127.0.0.1:0", "--block-interval-ms",
                                     "100"};
    std::vector<char*> argv = Argv(args);
    pid_ = ::fork();
    TS_CHECK(pid_ >= 0);
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~DevnetProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool alive() { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }
  // SIGTERM, then the exit status (or -1 if it had to be killed).
  int Terminate() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    bool exited = WaitFor([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, 15000);
    if (!exited) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
};

class CliEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "ts-cli-e2e-XXXXXX").string();
    TS_CHECK(::mkdtemp(pattern.data()) != nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(root_);
  }

  // keys new; returns the address.
  std::string NewKey(const std::string& name) {
    std::string path = root_ + "/" + name + ".key";
    Json doc = JsonTool({"keys", "new", "--out", path});
    keys_[name] = path;
    return doc.value("address", "");
  }
  std::vector<std::string> OnChain(std::vector<std::string> args) {
    args.insert(args.end(), {"--chain", chain_});
    return args;
  }
  std::vector<std::string> Signed(const std::string& key, std::vector<std::string> args) {
    args.insert(args.end(), {"--chain", chain_, "--key", keys_.at(key)});
    return args;
  }

  std::string root_;
  std::string chain_;
  std::map<std::string, std::string> keys_;
};

TEST_F(CliEndToEndTest, WholeShardThroughTheCli) {
  std::map<std::string, std::string> addr;
  for (const char* name : {"authority", "creator", "host1", "host2", "host3", "outsider"}) {
    addr[name] = NewKey(name);
    ASSERT_EQ(addr[name].rfind("gonka1", 0), 0u) << name;
  }

  // Genesis.
  std::string home = root_ + "/devnet";
  std::vector<std::string> init = {
      "devnet",          "init",      "--home",          home,
      "--chain-id",      "cli-e2e-1", "--poc-authority", addr["authority"],
      "--voting-period", "100",       "--epoch-length",  "1000000"};
  for (const char* name : {"authority", "creator", "host1", "host2", "host3"}) {
    init.insert(init.end(), {"--account", addr[name] + "=1000000000"});
  }
  for (auto [name, weight] : {std::pair{"host1", "100"}, {"host2", "80"}, {"host3", "60"}}) {
    init.insert(init.end(), {"--weight", addr[name] + "=" + weight});
  }
  Json initialized = JsonTool(init);
  EXPECT_EQ(initialized["chain_id"], "cli-e2e-1");
  ASSERT_TRUE(std::filesystem::exists(home + "/genesis.json"));
  ToolResult again = RunTool(init);
  EXPECT_EQ(again.code, 2) << Describe(init, again);
  EXPECT_THAT(again.err, HasSubstr("genesis.json"));

  // The node, in its own process.
  DevnetProcess devnet(home, root_ + "/devnet.log");
  ASSERT_TRUE(
      WaitFor([&] { return !ReadAll(home + "/node.addr").empty() || !devnet.alive(); }, 30000));
  ASSERT_TRUE(devnet.alive()) << ReadAll(root_ + "/devnet.log");
  chain_ = ReadAll(home + "/node.addr");
  while (!chain_.empty() && std::isspace(static_cast<unsigned char>(chain_.back()))) {
    chain_.pop_back();
  }
  // The node writes node.addr as it binds; its log line follows once it has started.
  EXPECT_TRUE(WaitFor(
      [&] { return ReadAll(root_ + "/devnet.log").find(chain_) != std::string::npos; }, 10000))
      << ReadAll(root_ + "/devnet.log");

  Json status = JsonTool(OnChain({"chain", "status"}));
  EXPECT_EQ(status["chain_id"], "cli-e2e-1");
  EXPECT_EQ(status["total_supply"], "5000000000");
  EXPECT_EQ(status["app_hash"].get<std::string>().size(), 64u) << "app hash in hex";
  EXPECT_TRUE(status["latest_height"].is_string());
  Json params = JsonTool(OnChain({"chain", "params"}));
  EXPECT_EQ(params["params"]["poc_authority"], addr["authority"]);
  EXPECT_EQ(params["params"]["quorum_ppm"], 334000);
  EXPECT_EQ(params["params"]["max_weights_per_submission"], 10000);
  EXPECT_EQ(params["params"]["voting_period_blocks"], "100");

  // Transfers: one accepted, one refused (exit 1, the TxResponse still on stdout).
  Json sent = JsonTool(
      Signed("creator", {"bank", "send", "--to", addr["outsider"], "--amount", "2500", "--wait"}));
  EXPECT_EQ(sent["code"], 0);
  EXPECT_NE(sent["height"], "0");
  Json balance = JsonTool(OnChain({"bank", "balance", "--address", addr["outsider"]}));
  EXPECT_EQ(balance, Json({{"address", addr["outsider"]}, {"amount", "2500"}}));
  std::vector<std::string> overdraw =
      Signed("outsider", {"bank", "send", "--to", addr["creator"], "--amount", "999999", "--json"});
  ToolResult refused = RunTool(overdraw);
  EXPECT_EQ(refused.code, 1) << Describe(overdraw, refused);
  EXPECT_THAT(refused.err, HasSubstr("error: code="));
  Json refused_doc = Json::parse(refused.out, nullptr, false);
  ASSERT_FALSE(refused_doc.is_discarded()) << refused.out;
  EXPECT_NE(refused_doc["code"], 0);

  // PoC weights: the authority may, another account may not.
  std::vector<std::string> weights = {"weights",
                                      "submit",
                                      "--epoch",
                                      "1",
                                      "--wait",
                                      "--weight",
                                      addr["host1"] + "=110",
                                      "--weight",
                                      addr["host2"] + "=90"};
  Json submitted = JsonTool(Signed("authority", weights));
  EXPECT_EQ(submitted["code"], 0);
  Json epoch1 = JsonTool(OnChain({"weights", "show", "--epoch", "1"}));
  EXPECT_EQ(epoch1["total_weight"], "200");
  ASSERT_EQ(epoch1["weights"].size(), 2u);
  Json current = JsonTool(OnChain({"weights", "show"}));
  EXPECT_EQ(current["epoch"], "0");
  EXPECT_EQ(current["total_weight"], "240");
  std::vector<std::string> unauthorised = Signed("creator", weights);
  ToolResult denied = RunTool(unauthorised);
  EXPECT_EQ(denied.code, 1) << Describe(unauthorised, denied);
  EXPECT_THAT(denied.err, HasSubstr("code=7"));

  // A shard proposal, votes, opening.
  std::string spec = root_ + "/spec.json";
  std::ofstream(spec) << R"({
    "run_spec_hash": "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=",
    "hardware_profile": "cpu-small", "min_nodes": 2, "max_nodes": 3,
    "min_host_weight": "10", "max_duration_blocks": "3000",
    "escrow": {"denom": "ngonka", "amount": "300000"},
    "artifact_quota": {"bytes_max": "1073741824", "files_max": "10000"},
    "reward_policy": {"kind": "KIND_VERIFIED_WORK", "max_host_share_bps": 5000},
    "reservation_window_blocks": "1000"})";
  Json proposed = JsonTool(Signed("creator", {"proposal", "submit", "--spec", spec, "--deposit",
                                              "1000", "--title", "e2e shard", "--wait"}));
  EXPECT_EQ(proposed["code"], 0);
  std::string proposal_id = proposed.value("proposal_id", "");
  std::string shard_id = proposed.value("shard_id", "");
  ASSERT_FALSE(proposal_id.empty()) << proposed;
  ASSERT_FALSE(shard_id.empty()) << proposed;
  EXPECT_EQ(JsonTool(OnChain({"shard", "status", "--id", shard_id}))["status"],
            "SHARD_STATUS_PROPOSED");
  // The voting period (100 blocks of 100 ms) leaves room for slow (sanitizer) builds to vote.
  for (const char* voter : {"host1", "host2", "host3"}) {
    Json vote = JsonTool(
        Signed(voter, {"proposal", "vote", "--id", proposal_id, "--option", "yes", "--wait"}));
    EXPECT_EQ(vote["code"], 0) << voter;
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        return JsonTool(OnChain({"shard", "status", "--id", shard_id}))["status"] ==
               "SHARD_STATUS_OPEN";
      },
      60000));
  Json proposal = JsonTool(OnChain({"proposal", "show", "--id", proposal_id}));
  EXPECT_EQ(proposal["status"], "PROPOSAL_STATUS_PASSED");
  EXPECT_EQ(proposal["title"], "e2e shard");
  std::vector<std::string> show_human = OnChain({"proposal", "show", "--id", proposal_id});
  ToolResult human = RunTool(show_human);
  EXPECT_EQ(human.code, 0) << Describe(show_human, human);
  EXPECT_THAT(human.out, HasSubstr("passed"));
  Json open = JsonTool(OnChain({"shard", "list", "--status", "open"}));
  ASSERT_EQ(open["shards"].size(), 1u) << open;
  EXPECT_EQ(open["shards"][0]["id"], shard_id);
  EXPECT_EQ(open["shards"][0]["escrow_held"], "300000");

  // Two hosts reserve through their sidecars; the creator assembles.
  auto key_of = [&](const std::string& name) {
    return common::ReadKeyFile(keys_.at(name)).value();
  };
  MemberSidecar member1(key_of("host1"), chain_);
  MemberSidecar member2(key_of("host2"), chain_);
  for (MemberSidecar* member : {&member1, &member2}) {
    Json reserved = JsonTool({"shard", "reserve", "--id", shard_id, "--host", member->address()});
    EXPECT_EQ(reserved["txhash"].get<std::string>().size(), 64u) << reserved;
  }
  Json shard = JsonTool(OnChain({"shard", "status", "--id", shard_id}));
  ASSERT_EQ(shard["reservations"].size(), 2u) << shard;
  EXPECT_EQ(shard["total_weight"], "180");
  Json assembled = JsonTool(Signed("creator", {"shard", "assemble", "--id", shard_id, "--wait"}));
  EXPECT_EQ(assembled["code"], 0);
  EXPECT_EQ(JsonTool(OnChain({"shard", "status", "--id", shard_id}))["status"],
            "SHARD_STATUS_RUNNING");

  // host2 alone holds 80 of 180: the chain refuses, the unreachable host is listed as refused.
  std::string final_root(64, 'a');
  // Work 5 and 4 rounds: 300000 × 5/9 capped at the 50 % host share, 150000; 133333.
  std::vector<std::string> payouts = {"--work", addr["host1"] + "=5", "--work",
                                      addr["host2"] + "=4"};
  std::vector<std::string> weak = {
      "shard",           "settle",       "--id",
      shard_id,          "--hosts",      member2.address() + ",127.0.0.1:1",
      "--final-root",    final_root,     "--submit-via",
      member2.address(), "--timeout-ms", "10000",
      "--chain",         chain_,         "--json"};
  weak.insert(weak.end(), payouts.begin(), payouts.end());
  ToolResult weak_result = RunTool(weak);
  EXPECT_EQ(weak_result.code, 1) << Describe(weak, weak_result);
  EXPECT_THAT(weak_result.err, HasSubstr("2/3"));
  Json weak_doc = Json::parse(weak_result.out, nullptr, false);
  ASSERT_FALSE(weak_doc.is_discarded()) << weak_result.out;
  EXPECT_EQ(weak_doc["signatures"], 1);
  EXPECT_EQ(weak_doc["code"], 9);
  ASSERT_EQ(weak_doc["refused"].size(), 1u);
  EXPECT_EQ(weak_doc["refused"][0]["host"], "127.0.0.1:1");

  // Both members sign: the settlement lands, submitted with the creator's key.
  uint64_t host1_before =
      std::stoull(JsonTool(OnChain({"bank", "balance", "--address", addr["host1"]}))["amount"]
                      .get<std::string>());
  uint64_t creator_before =
      std::stoull(JsonTool(OnChain({"bank", "balance", "--address", addr["creator"]}))["amount"]
                      .get<std::string>());
  // A sidecar of host1 that signs another draft, and host3 (no member) are left out.
  MemberSidecar tampering(key_of("host1"), chain_, /*tampering=*/true);
  MemberSidecar outsider(key_of("host3"), chain_);
  std::string hosts = tampering.address() + "," + member1.address() + "," + member2.address() +
                      "," + outsider.address();
  std::vector<std::string> settle = {"shard",
                                     "settle",
                                     "--id",
                                     shard_id,
                                     "--hosts",
                                     hosts,
                                     "--final-root",
                                     final_root,
                                     "--eval-metric",
                                     "eval_loss",
                                     "--eval-value-micro",
                                     "2500000",
                                     "--rounds",
                                     "12"};
  settle.insert(settle.end(), payouts.begin(), payouts.end());
  Json settled = JsonTool(Signed("creator", settle));
  EXPECT_EQ(settled["code"], 0) << settled;
  EXPECT_EQ(settled["signatures"], 2);
  ASSERT_EQ(settled["refused"].size(), 2u) << settled;
  EXPECT_EQ(settled["refused"][0]["host"], tampering.address());
  EXPECT_THAT(settled["refused"][0]["error"].get<std::string>(), HasSubstr("does not verify"));
  EXPECT_EQ(settled["refused"][1]["host"], outsider.address());
  EXPECT_THAT(settled["refused"][1]["error"].get<std::string>(), HasSubstr("not a member"));
  EXPECT_EQ(JsonTool(OnChain({"shard", "status", "--id", shard_id}))["status"],
            "SHARD_STATUS_SETTLED");
  Json record = JsonTool(OnChain({"shard", "settlement", "--id", shard_id}));
  EXPECT_EQ(record["signed_weight"], "180");
  EXPECT_EQ(record["submitter"], addr["creator"]);
  EXPECT_EQ(record["settlement"]["refund"], "16667") << "escrow 300000 minus payouts 283333";
  EXPECT_EQ(record["settlement"]["rounds_completed"], "12");
  EXPECT_EQ(record["settlement"]["evaluation"]["value_micro"], "2500000");
  EXPECT_EQ(JsonTool(OnChain({"bank", "balance", "--address", addr["host1"]}))["amount"],
            std::to_string(host1_before + 150000));
  EXPECT_EQ(JsonTool(OnChain({"bank", "balance", "--address", addr["creator"]}))["amount"],
            std::to_string(creator_before + 16667));
  // Settling twice is refused by the chain.
  std::vector<std::string> twice = Signed("creator", settle);
  ToolResult twice_result = RunTool(twice);
  EXPECT_EQ(twice_result.code, 1) << Describe(twice, twice_result);
  EXPECT_THAT(twice_result.err, HasSubstr("already settled"));

  // Events and blocks.
  Json latest = JsonTool(OnChain({"chain", "status"}));
  int64_t height = std::stoll(latest["latest_height"].get<std::string>());
  Json events =
      JsonTool(OnChain({"chain", "events", "--from", "1", "--to", std::to_string(height)}));
  int64_t settled_height = 0;
  int64_t previous_height = 0;
  uint32_t next_index = 0;
  for (const auto& e : events["events"]) {
    int64_t h = std::stoll(e["height"].get<std::string>());
    if (h != previous_height) next_index = 0;
    EXPECT_EQ(e["index"], next_index) << e;
    previous_height = h;
    ++next_index;
    if (e["type"] == "trainshard.shard_settled" && e["attributes"]["shard_id"] == shard_id) {
      settled_height = h;
      EXPECT_EQ(e["attributes"]["signed_weight"], "180");
    }
  }
  ASSERT_GT(settled_height, 0) << "no trainshard.shard_settled event";
  ASSERT_TRUE(WaitFor(
      [&] {
        return std::stoll(
                   JsonTool(OnChain({"chain", "status"}))["latest_height"].get<std::string>()) >
               settled_height;
      },
      10000));
  Json block = JsonTool(OnChain({"chain", "block", "--height", std::to_string(settled_height)}));
  Json next = JsonTool(OnChain({"chain", "block", "--height", std::to_string(settled_height + 1)}));
  EXPECT_GE(block["txs"], 1);
  EXPECT_EQ(block["app_hash_after"].get<std::string>().size(), 64u);
  EXPECT_EQ(block["app_hash_after"], next["app_hash_before"]);

  // SIGTERM stops the node cleanly; replay reproduces every stored block.
  EXPECT_EQ(devnet.Terminate(), 0) << ReadAll(root_ + "/devnet.log");
  Json replay = JsonTool({"devnet", "replay", "--home", home});
  EXPECT_EQ(replay["ok"], true) << replay;
  EXPECT_GE(replay["blocks"].get<int64_t>(), height);
  EXPECT_TRUE(replay["mismatch_height"].is_null());
  std::vector<std::string> replay_human = {"devnet", "replay", "--home", home};
  ToolResult replayed = RunTool(replay_human);
  EXPECT_EQ(replayed.code, 0) << Describe(replay_human, replayed);
  EXPECT_THAT(replayed.out, HasSubstr("OK"));
  // Unreachable now: exit 3.
  std::vector<std::string> gone = OnChain({"chain", "status", "--timeout-ms", "2000"});
  EXPECT_EQ(RunTool(gone).code, 3);
}

// A stand-in for a host's artifact operator API that streams progress as the sidecar does: a
// first message, updates, and the final one (done = true).
class ProgressSidecar final : public pb::ArtifactOperator::Service {
 public:
  ProgressSidecar() { server_ = test_util::StartLoopbackServer({this}); }
  ~ProgressSidecar() override { server_.server->Shutdown(); }
  std::string address() const { return server_.endpoint; }

  grpc::Status Publish(grpc::ServerContext*, const pb::PublishArtifactRequest*,
                       grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    return Stream("hashing", writer, std::string(32, '\x5a'));
  }
  grpc::Status Fetch(grpc::ServerContext*, const pb::FetchArtifactRequest* request,
                     grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    pb::ArtifactProgress first;
    first.set_phase("manifest");
    writer->Write(first);
    return Stream("fetching", writer, request->artifact_id());
  }

 private:
  static constexpr uint64_t kTotal = 8 << 20;

  // Four updates 300 ms apart, then the final message.
  static grpc::Status Stream(const std::string& phase,
                             grpc::ServerWriter<pb::ArtifactProgress>* writer,
                             const std::string& id) {
    pb::ArtifactProgress p;
    p.set_phase(phase);
    p.set_bytes_total(kTotal);
    for (uint64_t i = 0; i <= 4; ++i) {
      p.set_bytes_done(kTotal * i / 4);
      writer->Write(p);
      if (i < 4) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    p.set_phase("done");
    p.set_done(true);
    p.set_artifact_id(id);
    p.set_chunks_total(8);
    p.set_chunks_done(8);
    writer->Write(p);
    return grpc::Status::OK;
  }

  test_util::LoopbackServer server_;
};

// Progress goes to stderr (JSON lines with --json, plain lines when stderr is a pipe), and stdout
// holds the same one result document as without it.
TEST(CliProgressEndToEndTest, PublishAndFetchShowProgressOnStderrOnly) {
  ProgressSidecar host;
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string id(64, 'c');
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"artifact", "publish", "--host", host.address(), "--shard", "1",
                                 "--dir", dir, "--json"},
        std::vector<std::string>{"artifact", "fetch", "--host", host.address(), "--shard", "1",
                                 "--id", id, "--json"}}) {
    const std::string operation = args[1];
    ToolResult r = RunTool(args);
    ASSERT_EQ(r.code, 0) << Describe(args, r);
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << Describe(args, r);
    Json result = Json::parse(r.out);
    EXPECT_EQ(result["done"], true);
    EXPECT_EQ(result["bytes_total"], std::to_string(8 << 20));
    std::string published_id;
    for (int i = 0; i < 32; ++i) published_id += "5a";
    EXPECT_EQ(result["artifact_id"], operation == "fetch" ? id : published_id);
    std::vector<Json> lines;
    std::istringstream err(r.err);
    for (std::string line; std::getline(err, line);) {
      Json parsed = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(parsed.is_discarded()) << "not a JSON line: " << line;
      lines.push_back(parsed);
    }
    ASSERT_GE(lines.size(), 3u) << Describe(args, r);
    for (const Json& line : lines) EXPECT_EQ(line["operation"], operation) << line;
    EXPECT_EQ(lines.front()["done"], false);
    EXPECT_EQ(lines.back()["done"], true);
    EXPECT_EQ(lines.back()["bytes_done"], 8 << 20);
    EXPECT_GT(lines.back()["rate_bytes_per_s"].get<uint64_t>(), 0u);
    // An update after the first second carries a rate and an ETA.
    bool rated = false;
    for (const Json& line : lines) {
      rated = rated || (!line["done"].get<bool>() && line["rate_bytes_per_s"].get<uint64_t>() > 0 &&
                        line["eta_s"].is_number());
    }
    EXPECT_TRUE(rated) << r.err;
  }

  std::vector<std::string> plain = {"artifact", "publish", "--host", host.address(),
                                    "--shard",  "1",       "--dir",  dir};
  ToolResult r = RunTool(plain);
  ASSERT_EQ(r.code, 0) << Describe(plain, r);
  EXPECT_THAT(r.out, HasSubstr("artifact_id:"));
  EXPECT_THAT(r.err, HasSubstr("publish: hashing 0% 0 B / 8.0 MiB"));
  EXPECT_THAT(r.err, HasSubstr("publish: done, 8.0 MiB in "));
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no redrawn line on a pipe";
}

}  // namespace
}  // namespace ts::sidecar
