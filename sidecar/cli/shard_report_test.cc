// `shard report`: its human and JSON forms and its exit code from hand-built messages (a host
// that ran and was paid, one that could not be reached, one without a run), and the command
// against a real gRPC server playing a host and an unreachable chain.
#include "sidecar/cli/shard_report.h"

#include <sstream>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "gmock/gmock.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gonka/trainshard/v1/training.grpc.pb.h"
#include "gtest/gtest.h"
#include "sidecar/cli/cli.h"
#include "tests/util/loopback_server.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kOne[] = "gonka1hostone";
std::string AbHex() {
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += "ab";
  return hex;
}
constexpr char kTwo[] = "gonka1hosttwo";

pb::RoundSummary Round(uint64_t n, std::vector<std::string> members, double inner, double exchange,
                       double certify, double publish) {
  pb::RoundSummary r;
  r.set_round(n);
  for (auto& m : members) r.add_members(std::move(m));
  r.set_inner_seconds(inner);
  r.set_exchange_seconds(exchange);
  r.set_certify_seconds(certify);
  r.set_publish_seconds(publish);
  return r;
}

pb::ShardRunStatus DoneRun() {
  pb::ShardRunStatus run;
  run.set_shard_id(7);
  run.set_state("done");
  run.set_certified_round(3);
  run.set_rounds_total(3);
  run.set_worker_device("cuda (NVIDIA H100)");
  run.set_replays(4);
  run.set_replays_passed(3);
  run.set_marks(1);
  run.set_replay_seconds(6.5);
  run.set_wall_seconds(100.25);
  *run.add_rounds() = Round(1, {kOne, kTwo}, 10, 2, 1, 0.5);
  // Certified without this host (it caught up on it): not counted.
  *run.add_rounds() = Round(2, {kTwo}, 99, 99, 99, 99);
  *run.add_rounds() = Round(3, {kOne, kTwo}, 12, 4, 3, 1.5);
  for (int i = 1; i <= 7; ++i)
    run.add_transitions("12:00:0" + std::to_string(i) + " event " + std::to_string(i));
  return run;
}

ShardReport SettledReport() {
  ShardReport report;
  report.shard_id = 7;
  pb::Shard shard;
  shard.set_id(7);
  shard.set_status(pb::SHARD_STATUS_SETTLED);
  shard.add_reservations()->set_host(kOne);
  shard.add_reservations()->set_host(kTwo);
  report.shard = shard;
  pb::SettlementRecord record;
  record.set_height(412);
  record.set_signed_weight(240);
  record.set_submitter(kOne);
  record.add_signatures()->set_host(kOne);
  record.add_signatures()->set_host(kTwo);
  pb::Settlement& s = *record.mutable_settlement();
  s.set_shard_id(7);
  s.set_rounds_completed(3);
  s.set_rounds_planned(3);
  s.set_refund("100");
  s.set_final_checkpoint_root(std::string(32, '\xab'));
  pb::HostPayout& paid = *s.add_payouts();
  paid.set_host(kOne);
  paid.set_amount("150000");
  paid.set_rounds_contributed(2);
  paid.set_tokens(65536);
  paid.set_verified(2);
  paid.set_rejected(0);
  paid.set_marks(1);
  paid.set_score(-1250);
  report.settlement = record;

  HostReport one;
  one.target = "unix:/srv/h1/operator.sock";
  one.address = kOne;
  one.run = DoneRun();
  one.run->set_error("worker restarted twice");
  report.hosts.push_back(one);

  HostReport gone;
  gone.target = "unix:/srv/h2/operator.sock";
  gone.reached = absl::UnavailableError("connection refused");
  report.hosts.push_back(gone);

  HostReport idle;
  idle.target = "unix:/srv/h3/operator.sock";
  idle.address = "gonka1hostthree";
  idle.run_error = absl::NotFoundError("no run of shard 7");
  report.hosts.push_back(idle);
  return report;
}

TEST(ShardReportTest, TimingsCountOnlyTheRoundsTheHostContributedTo) {
  HostTimings t = SumTimings(DoneRun(), kOne);
  EXPECT_EQ(t.rounds, 2u);
  EXPECT_DOUBLE_EQ(t.inner_s, 22);
  EXPECT_DOUBLE_EQ(t.exchange_s, 6);
  EXPECT_DOUBLE_EQ(t.certify_s, 4);
  EXPECT_DOUBLE_EQ(t.publish_s, 2);
  // Without an address every listed round counts.
  EXPECT_EQ(SumTimings(DoneRun(), "").rounds, 3u);
}

TEST(ShardReportTest, HumanFormShowsRunsTimingsPayoutsAndTheUnreachable) {
  std::ostringstream out;
  PrintShardReport(out, SettledReport());
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("shard:      7\n"));
  EXPECT_THAT(text, HasSubstr("status:     settled\n"));
  EXPECT_THAT(text, HasSubstr("settlement: height 412, rounds 3/3, refund 100 ngonka, 2 "
                              "signatures (weight 240)\n"));
  EXPECT_THAT(text, HasSubstr("final_root: " + AbHex()));
  EXPECT_THAT(text, HasSubstr("hosts:      3 asked, 1 could not be reached\n"));

  // The runs table, padded to its widest cells.
  EXPECT_THAT(text,
              HasSubstr("HOST                        ADDRESS          STATE        CERTIFIED  "
                        "CONTRIBUTED  DEVICE              REPLAYS_PASSED  MARKS\n"
                        "unix:/srv/h1/operator.sock  gonka1hostone    done         3/3        "
                        "2            cuda (NVIDIA H100)  3/4             1\n"
                        "unix:/srv/h2/operator.sock  -                unreachable  -          "
                        "-            -                   -               -\n"
                        "unix:/srv/h3/operator.sock  gonka1hostthree  no run       -          "
                        "-            -                   -               -\n"));
  // Timings: totals and per-round means over the two rounds it contributed to.
  EXPECT_THAT(text, HasSubstr("timings in seconds: total over the rounds contributed (mean per "
                              "round)\n"));
  EXPECT_THAT(text, HasSubstr("HOST                        ROUNDS  INNER_S       EXCHANGE_S  "
                              "CERTIFY_S   PUBLISH_S   REPLAY_S  WALL_S\n"
                              "unix:/srv/h1/operator.sock  2       22.0 (11.00)  6.0 (3.00)  "
                              "4.0 (2.00)  2.0 (1.00)  6.5       100.2\n"));
  // What the settlement paid, and a host it did not pay.
  EXPECT_THAT(text, HasSubstr("paid (ngonka) by the settlement on chain\n"));
  EXPECT_THAT(text, HasSubstr("unix:/srv/h1/operator.sock  gonka1hostone    150000     2       "
                              "65536   2         0         1      -1250"));
  EXPECT_THAT(text, HasSubstr("unix:/srv/h3/operator.sock  gonka1hostthree  no payout"));
  EXPECT_THAT(text, Not(HasSubstr("unix:/srv/h2/operator.sock  gonka1")));
  // Errors, the latest transitions, and why each other host has nothing.
  EXPECT_THAT(text, HasSubstr("unix:/srv/h1/operator.sock: error: worker restarted twice\n"));
  EXPECT_THAT(text, HasSubstr("unix:/srv/h1/operator.sock: 7 transitions, the latest 5:\n"
                              "  12:00:03 event 3\n"));
  EXPECT_THAT(text, Not(HasSubstr("event 2\n")));
  EXPECT_THAT(text, HasSubstr("  12:00:07 event 7\n"));
  EXPECT_THAT(text, HasSubstr("unix:/srv/h2/operator.sock: cannot reach: UNAVAILABLE: connection "
                              "refused\n"));
  EXPECT_THAT(text, HasSubstr("unix:/srv/h3/operator.sock: no run of shard 7: NOT_FOUND: no run "
                              "of shard 7\n"));
}

TEST(ShardReportTest, JsonFormNamesUnitsAndKeepsTheUnreachable) {
  nlohmann::ordered_json doc = ShardReportJson(SettledReport());
  EXPECT_EQ(doc["shard_id"], 7);
  EXPECT_EQ(doc["status"], "settled");
  EXPECT_EQ(doc["chain_error"], "");
  EXPECT_EQ(doc["settlement"]["height"], 412);
  EXPECT_EQ(doc["settlement"]["rounds_completed"], 3);
  EXPECT_EQ(doc["settlement"]["refund"], "100");
  EXPECT_EQ(doc["settlement"]["final_checkpoint_root"], AbHex());
  EXPECT_EQ(doc["settlement"]["signatures"], 2);
  EXPECT_EQ(doc["unreachable"], 1);
  ASSERT_EQ(doc["hosts"].size(), 3u);

  const auto& one = doc["hosts"][0];
  EXPECT_EQ(one["host"], "unix:/srv/h1/operator.sock");
  EXPECT_EQ(one["state"], "done");
  EXPECT_EQ(one["reachable"], true);
  EXPECT_EQ(one["address"], kOne);
  EXPECT_EQ(one["run"]["error"], "worker restarted twice");
  EXPECT_EQ(one["run"]["certified_round"], 3);
  EXPECT_EQ(one["run"]["rounds_total"], 3);
  EXPECT_EQ(one["run"]["rounds_contributed"], 2);
  EXPECT_EQ(one["run"]["worker_device"], "cuda (NVIDIA H100)");
  EXPECT_EQ(one["run"]["replays"], 4);
  EXPECT_EQ(one["run"]["replays_passed"], 3);
  EXPECT_EQ(one["run"]["marks"], 1);
  EXPECT_DOUBLE_EQ(one["run"]["timings"]["inner_s"].get<double>(), 22);
  EXPECT_DOUBLE_EQ(one["run"]["timings"]["inner_s_mean"].get<double>(), 11);
  EXPECT_DOUBLE_EQ(one["run"]["timings"]["exchange_s_mean"].get<double>(), 3);
  EXPECT_DOUBLE_EQ(one["run"]["timings"]["certify_s"].get<double>(), 4);
  EXPECT_DOUBLE_EQ(one["run"]["timings"]["publish_s_mean"].get<double>(), 1);
  EXPECT_DOUBLE_EQ(one["run"]["timings"]["replay_s"].get<double>(), 6.5);
  EXPECT_DOUBLE_EQ(one["run"]["timings"]["wall_s"].get<double>(), 100.25);
  EXPECT_EQ(one["run"]["transitions"].size(), 7u) << "--json keeps every transition";
  // The payout as protobuf JSON, as `shard settlement --json` prints it.
  EXPECT_EQ(one["payout"]["amount"], "150000");
  EXPECT_EQ(one["payout"]["rounds_contributed"], "2");
  EXPECT_EQ(one["payout"]["tokens"], "65536");
  EXPECT_EQ(one["payout"]["verified"], 2);
  EXPECT_EQ(one["payout"]["rejected"], 0);
  EXPECT_EQ(one["payout"]["marks"], 1);
  EXPECT_EQ(one["payout"]["score"], "-1250");

  const auto& gone = doc["hosts"][1];
  EXPECT_EQ(gone["state"], "unreachable");
  EXPECT_EQ(gone["reachable"], false);
  EXPECT_EQ(gone["error"], "UNAVAILABLE: connection refused");
  EXPECT_TRUE(gone["run"].is_null());
  EXPECT_TRUE(gone["payout"].is_null());

  const auto& idle = doc["hosts"][2];
  EXPECT_EQ(idle["state"], "no run");
  EXPECT_EQ(idle["reachable"], true);
  EXPECT_EQ(idle["error"], "NOT_FOUND: no run of shard 7");
  EXPECT_TRUE(idle["payout"].is_null());
}

TEST(ShardReportTest, ExitCodeSaysWhetherSomeWereUnreachableOrRefused) {
  ShardReport report = SettledReport();
  EXPECT_EQ(ShardReportExitCode(report), kExitUnreachable);
  report.hosts.erase(report.hosts.begin() + 1);
  EXPECT_EQ(ShardReportExitCode(report), kExitOk) << "a host without a run is no failure";
  report.hosts[1].run_error = absl::PermissionDeniedError("not yours");
  EXPECT_EQ(ShardReportExitCode(report), kExitRefused);
  report.hosts[1].run_error = absl::NotFoundError("none");

  // Not settled yet: no failure, and nothing paid.
  report.settlement.reset();
  report.settlement_error = absl::NotFoundError("no settlement");
  EXPECT_EQ(ShardReportExitCode(report), kExitOk);
  std::ostringstream out;
  PrintShardReport(out, report);
  EXPECT_THAT(out.str(), HasSubstr("settlement: none yet\n"));
  EXPECT_THAT(out.str(), HasSubstr("paid: nothing yet (no settlement on chain)\n"));
  EXPECT_TRUE(ShardReportJson(report)["settlement"].is_null());
  EXPECT_TRUE(ShardReportJson(report)["hosts"][0]["payout"].is_null());

  // The chain out of reach: the hosts are still reported.
  report.shard.reset();
  report.shard_error = absl::UnavailableError("connection refused");
  report.settlement_error = report.shard_error;
  EXPECT_EQ(ShardReportExitCode(report), kExitUnreachable);
  std::ostringstream offline;
  PrintShardReport(offline, report);
  EXPECT_THAT(offline.str(),
              HasSubstr("status: cannot reach the chain: UNAVAILABLE: connection refused\n"));
  EXPECT_THAT(offline.str(), HasSubstr("gonka1hostone    done"));
  EXPECT_TRUE(ShardReportJson(report)["status"].is_null());
  EXPECT_EQ(ShardReportJson(report)["chain_error"], "UNAVAILABLE: connection refused");
}

// A host sidecar's operator API as far as the report asks it: its status and its run.
class FakeRunHost final : public pb::HostOperator::Service, public pb::ShardRunOperator::Service {
 public:
  FakeRunHost() {
    server_ = test_util::StartLoopbackServer({static_cast<pb::HostOperator::Service*>(this),
                                              static_cast<pb::ShardRunOperator::Service*>(this)});
  }
  ~FakeRunHost() override { server_.server->Shutdown(); }
  std::string address() const { return server_.endpoint; }

  grpc::Status Status(grpc::ServerContext*, const pb::HostStatusRequest*,
                      pb::HostStatusResponse* response) override {
    response->set_address(kOne);
    return grpc::Status::OK;
  }
  grpc::Status Status(grpc::ServerContext*, const pb::ShardRunStatusRequest* request,
                      pb::ShardRunStatus* response) override {
    if (request->shard_id() != 7) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no run");
    *response = DoneRun();
    return grpc::Status::OK;
  }

 private:
  test_util::LoopbackServer server_;
};

TEST(ShardReportTest, CommandReportsEveryHostAndExitsThreeWhenOneIsUnreachable) {
  FakeRunHost host;
  std::ostringstream out;
  std::ostringstream err;
  int code = RunCli({"shard", "report", "--id", "7", "--hosts", host.address() + ",127.0.0.1:1",
                     "--chain", "127.0.0.1:1", "--timeout-ms", "2000", "--json"},
                    out, err);
  EXPECT_EQ(code, kExitUnreachable) << out.str() << err.str();
  nlohmann::json doc = nlohmann::json::parse(out.str());
  EXPECT_TRUE(doc["status"].is_null());
  EXPECT_THAT(doc["chain_error"].get<std::string>(), HasSubstr("UNAVAILABLE"));
  ASSERT_EQ(doc["hosts"].size(), 2u);
  EXPECT_EQ(doc["hosts"][0]["address"], kOne);
  EXPECT_EQ(doc["hosts"][0]["state"], "done");
  EXPECT_EQ(doc["hosts"][0]["run"]["rounds_contributed"], 2);
  EXPECT_EQ(doc["hosts"][1]["host"], "127.0.0.1:1");
  EXPECT_EQ(doc["hosts"][1]["state"], "unreachable");
  EXPECT_THAT(err.str(), HasSubstr("could not be reached"));

  std::ostringstream human;
  std::ostringstream human_err;
  code = RunCli({"shard", "report", "--id", "8", "--hosts", host.address(), "--chain",
                 "127.0.0.1:1", "--timeout-ms", "2000"},
                human, human_err);
  EXPECT_EQ(code, kExitUnreachable) << "the chain";
  EXPECT_THAT(human.str(), HasSubstr("no run of shard 8: NOT_FOUND: no run"));

  std::ostringstream bad_out;
  std::ostringstream bad_err;
  EXPECT_EQ(RunCli({"shard", "report", "--id", "7", "--hosts", "a,,b"}, bad_out, bad_err),
            kExitUsage);
  EXPECT_THAT(bad_err.str(), HasSubstr("--hosts"));
}

}  // namespace
}  // namespace ts::sidecar
