// The host and artifact commands of the trainshard CLI, run in-process against real gRPC servers
// on 127.0.0.1 that play a host sidecar: event paging, status, settlement and refusals, and
// artifact publish, fetch, list, verify and gc with their progress and exit codes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/hex.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sidecar/cli/cli_test_util.h"
#include "sidecar/cli/context.h"
#include "tests/util/loopback_server.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using cli_testing::Cli;
using cli_testing::CliResult;
using cli_testing::Describe;
using cli_testing::FreshAddress;
using cli_testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

// ---------------------------------------------------------------------------------------------
// Host commands against a real gRPC server playing a host sidecar.

class FakeSidecar final : public pb::HostOperator::Service, public pb::SettlementQuery::Service {
 public:
  // `events_per_height` events at each of heights 1..`heights`; pages hold at most `page_cap`.
  FakeSidecar(int heights, int events_per_height, uint32_t page_cap = 1000) : page_cap_(page_cap) {
    for (int h = 1; h <= heights; ++h) {
      for (int i = 0; i < events_per_height; ++i) {
        pb::FollowedEvent e;
        e.set_height(h);
        e.set_index(static_cast<uint32_t>(i));
        e.mutable_event()->set_type("trainshard.reservation_added");
        auto* attribute = e.mutable_event()->add_attributes();
        attribute->set_key("n");
        attribute->set_value(std::to_string(h * 1000 + i));
        e.set_action(i % 2 == 0 ? "record" : "ignore:not ours");
        events_.push_back(e);
      }
    }
    server_ = test_util::StartLoopbackServer({static_cast<pb::HostOperator::Service*>(this),
                                              static_cast<pb::SettlementQuery::Service*>(this)});
  }
  ~FakeSidecar() override { server_.server->Shutdown(); }

  std::string address() const { return server_.endpoint; }
  int list_calls() {
    absl::MutexLock lock(&mu_);
    return list_calls_;
  }

  grpc::Status Status(grpc::ServerContext*, const pb::HostStatusRequest*,
                      pb::HostStatusResponse* response) override {
    response->set_address("gonka1fake");
    response->set_cursor_height(77);
    response->set_follower_error("writing batch to /d/state: No space left on device");
    response->set_follower_error_since_unix_ms(1'700'000'000'000);
    response->set_records_path("/d/state");
    response->set_records_error("No space left on device");
    response->set_records_error_since_unix_ms(1'700'000'000'000);
    response->set_events_processed(events_.size());
    return grpc::Status::OK;
  }
  // Pages never split a height here only by accident: they cut at `limit` events.
  grpc::Status ListEvents(grpc::ServerContext*, const pb::ListEventsRequest* request,
                          pb::ListEventsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      ++list_calls_;
    }
    for (const auto& e : events_) {
      if (e.height() < request->from_height()) continue;
      if (static_cast<uint32_t>(response->events_size()) >= std::min(request->limit(), page_cap_)) {
        break;
      }
      *response->add_events() = e;
    }
    return grpc::Status::OK;
  }
  grpc::Status Reserve(grpc::ServerContext*, const pb::ReserveRequest* request,
                       pb::ReserveResponse*) override {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "shard " + std::to_string(request->shard_id()) + " is not open");
  }
  grpc::Status GetSettlement(grpc::ServerContext*, const pb::GetSettlementRequest* request,
                             pb::GetSettlementResponse* response) override {
    if (request->shard_id() != 4) return grpc::Status(grpc::StatusCode::NOT_FOUND, "none");
    response->mutable_settlement()->set_shard_id(4);
    response->mutable_settlement()->set_refund("12");
    response->mutable_signature()->set_host("gonka1fake");
    response->mutable_signature()->set_signature(std::string(65, '\x02'));
    return grpc::Status::OK;
  }

 private:
  std::vector<pb::FollowedEvent> events_;
  uint32_t page_cap_;
  test_util::LoopbackServer server_;
  absl::Mutex mu_;
  int list_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(HostCommandsTest, EventsPagesThroughEverythingOnce) {
  // 3 events per height and 500 per page: pages end in the middle of a height.
  FakeSidecar sidecar(/*heights=*/400, /*events_per_height=*/3);
  CliResult r = Cli({"host", "events", "--host", sidecar.address(), "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json doc = nlohmann::json::parse(r.out);
  const auto& events = doc.at("events");
  ASSERT_EQ(events.size(), 1200u);
  for (size_t k = 0; k < events.size(); ++k) {
    int64_t height = static_cast<int64_t>(k / 3) + 1;
    uint32_t index = static_cast<uint32_t>(k % 3);
    ASSERT_EQ(events[k]["height"], std::to_string(height)) << k;
    ASSERT_EQ(events[k]["index"], index) << k;
    ASSERT_EQ(events[k]["attributes"]["n"], std::to_string(height * 1000 + index));
    ASSERT_EQ(events[k]["action"], index % 2 == 0 ? "record" : "ignore:not ours");
    ASSERT_EQ(events[k]["type"], "trainshard.reservation_added");
  }
  EXPECT_GE(sidecar.list_calls(), 3);
  EXPECT_LE(sidecar.list_calls(), 4);

  CliResult from = Cli({"host", "events", "--host", sidecar.address(), "--from", "399"});
  ASSERT_EQ(from.code, 0) << Describe(from);
  EXPECT_EQ(std::count(from.out.begin(), from.out.end(), '\n'), 6);
}

TEST(HostCommandsTest, EventsWorkWithASidecarThatCapsPagesLower) {
  FakeSidecar sidecar(/*heights=*/100, /*events_per_height=*/7, /*page_cap=*/64);
  CliResult r = Cli({"host", "events", "--host", sidecar.address(), "--from", "1", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json doc = nlohmann::json::parse(r.out);
  const auto& events = doc.at("events");
  ASSERT_EQ(events.size(), 700u);
  EXPECT_EQ(events.back()["height"], "100");
  EXPECT_EQ(events.back()["index"], 6);
  EXPECT_EQ(r.err, "");
}

TEST(HostCommandsTest, AHeightLargerThanAPageDoesNotLoopForever) {
  FakeSidecar sidecar(/*heights=*/2, /*events_per_height=*/700);
  CliResult r = Cli({"host", "events", "--host", sidecar.address(), "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("more than 500 events"));
  EXPECT_LE(sidecar.list_calls(), 6);
}

TEST(HostCommandsTest, StatusSettlementAndRefusals) {
  FakeSidecar sidecar(1, 1);
  CliResult status = Cli({"host", "status", "--host", sidecar.address(), "--json"});
  ASSERT_EQ(status.code, 0) << Describe(status);
  nlohmann::json doc = nlohmann::json::parse(status.out);
  EXPECT_EQ(doc["address"], "gonka1fake");
  EXPECT_EQ(doc["cursor_height"], "77");
  EXPECT_EQ(doc["pending_txs"], 0);

  EXPECT_EQ(doc["records_error"], "No space left on device");
  EXPECT_EQ(doc["follower_error_since_unix_ms"], "1700000000000");

  CliResult human = Cli({"host", "status", "--host", sidecar.address()});
  ASSERT_EQ(human.code, 0);
  EXPECT_THAT(human.out, HasSubstr("cursor_height:"));
  EXPECT_THAT(human.out,
              HasSubstr("stopped since 2023-11-14T22:13:20Z: writing batch to /d/state: No space"));
  EXPECT_THAT(human.out, HasSubstr("refusing writes since 2023-11-14T22:13:20Z"));
  EXPECT_THAT(human.out, HasSubstr("/d/state"));

  CliResult settlement = Cli({"host", "settlement", "--host", sidecar.address(), "--id", "4"});
  ASSERT_EQ(settlement.code, 0) << Describe(settlement);
  std::string signature_hex;
  for (int i = 0; i < 65; ++i) signature_hex += "02";
  EXPECT_THAT(settlement.out, HasSubstr(signature_hex));
  CliResult missing = Cli({"host", "settlement", "--host", sidecar.address(), "--id", "5"});
  EXPECT_EQ(missing.code, kExitRefused) << Describe(missing);
  EXPECT_THAT(missing.err, HasSubstr("NOT_FOUND"));

  CliResult reserve = Cli({"shard", "reserve", "--id", "9", "--host", sidecar.address()});
  EXPECT_EQ(reserve.code, kExitRefused) << Describe(reserve);
  EXPECT_THAT(reserve.err, HasSubstr("shard 9 is not open"));
  EXPECT_THAT(reserve.err, HasSubstr(sidecar.address()));
}

TEST(HostCommandsTest, UnreachableSidecarExitsThree) {
  CliResult r = Cli({"host", "shards", "--host", "127.0.0.1:1", "--timeout-ms", "2000"});
  EXPECT_EQ(r.code, kExitUnreachable) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("cannot reach"));
}

// ---------------------------------------------------------------------------------------------
// Artifact commands against a real gRPC server playing a host sidecar's artifact operator API.

class FakeArtifactHost final : public pb::ArtifactOperator::Service {
 public:
  static constexpr char kIdByte = '\xab';
  static constexpr char kFailingIdByte = '\xee';

  FakeArtifactHost() { server_ = test_util::StartLoopbackServer({this}); }
  ~FakeArtifactHost() override { server_.server->Shutdown(); }

  std::string address() const { return server_.endpoint; }
  pb::PublishArtifactRequest last_publish() {
    absl::MutexLock lock(&mu_);
    return publish_;
  }
  pb::FetchArtifactRequest last_fetch() {
    absl::MutexLock lock(&mu_);
    return fetch_;
  }
  pb::ListLocalArtifactsRequest last_list() {
    absl::MutexLock lock(&mu_);
    return list_;
  }
  pb::GcArtifactsRequest last_gc() {
    absl::MutexLock lock(&mu_);
    return gc_;
  }

  grpc::Status Publish(grpc::ServerContext*, const pb::PublishArtifactRequest* request,
                       grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      publish_ = *request;
    }
    pb::ArtifactProgress p;
    p.set_phase("hashing");
    p.set_bytes_total(3 << 20);
    for (int i = 1; i <= 3; ++i) {
      p.set_bytes_done(static_cast<uint64_t>(i) << 20);
      writer->Write(p);
    }
    // A host that falls silent: the client gives up after --timeout-ms without a message.
    if (request->kind() == "silent") std::this_thread::sleep_for(std::chrono::seconds(3));
    p.set_phase("done");
    p.set_done(true);
    p.set_artifact_id(std::string(32, kIdByte));
    p.set_chunks_total(3);
    p.set_chunks_done(3);
    p.set_chunks_present(1);
    writer->Write(p);
    return grpc::Status::OK;
  }
  grpc::Status Fetch(grpc::ServerContext*, const pb::FetchArtifactRequest* request,
                     grpc::ServerWriter<pb::ArtifactProgress>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      fetch_ = *request;
    }
    pb::ArtifactProgress p;
    p.set_phase("manifest");
    writer->Write(p);
    if (request->artifact_id() == std::string(32, kFailingIdByte)) {
      return grpc::Status(grpc::StatusCode::ABORTED,
                          "fetch incomplete (run it again to resume): no usable peer left: "
                          "gonka1peerone: unavailable: connection refused; gonka1peertwo: chunk "
                          "3f2a failed verification");
    }
    p.set_phase("done");
    p.set_done(true);
    p.set_artifact_id(request->artifact_id());
    p.set_bytes_total(5000);
    p.set_bytes_done(5000);
    p.set_bytes_fetched(4000);
    p.set_chunks_total(5);
    p.set_chunks_present(1);
    p.set_chunks_fetched(4);
    (*p.mutable_bytes_by_peer())["gonka1peerone"] = 4000;
    auto* fault = p.add_peer_faults();
    fault->set_peer("gonka1peertwo");
    fault->set_reason("chunk 3f2a failed verification");
    fault->set_corrupt(true);
    writer->Write(p);
    return grpc::Status::OK;
  }
  grpc::Status List(grpc::ServerContext*, const pb::ListLocalArtifactsRequest* request,
                    pb::ListArtifactsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      list_ = *request;
    }
    auto* a = response->add_artifacts();
    a->set_artifact_id(std::string(32, kIdByte));
    a->set_shard_id(request->shard_id());
    a->set_round(4);
    a->set_kind("checkpoint");
    a->set_publisher("gonka1publisher");
    a->set_parent(std::string(32, '\x01'));
    a->set_total_bytes(5000);
    a->set_files(2);
    a->set_chunks(5);
    a->set_complete(true);
    if (request->include_incomplete()) {
      auto* b = response->add_artifacts();
      b->set_artifact_id(std::string(32, '\x02'));
      b->set_complete(false);
    }
    return grpc::Status::OK;
  }
  grpc::Status Verify(grpc::ServerContext*, const pb::VerifyArtifactsRequest* request,
                      pb::VerifyArtifactsResponse* response) override {
    response->set_artifacts_checked(2);
    response->set_chunks_ok(9);
    if (request->shard_id() == 2) {
      response->add_modified(std::string(64, 'c'));
      response->add_missing(std::string(64, 'd'));
    }
    response->add_unreferenced(std::string(64, 'e'));
    response->set_unreferenced_bytes(4096);
    return grpc::Status::OK;
  }
  grpc::Status Gc(grpc::ServerContext*, const pb::GcArtifactsRequest* request,
                  pb::GcArtifactsResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      gc_ = *request;
    }
    response->set_artifacts_dropped(static_cast<uint32_t>(request->drop_artifacts_size()));
    response->set_chunks_removed(7);
    response->set_bytes_freed(7000);
    return grpc::Status::OK;
  }

 private:
  test_util::LoopbackServer server_;
  absl::Mutex mu_;
  pb::PublishArtifactRequest publish_ ABSL_GUARDED_BY(mu_);
  pb::FetchArtifactRequest fetch_ ABSL_GUARDED_BY(mu_);
  pb::ListLocalArtifactsRequest list_ ABSL_GUARDED_BY(mu_);
  pb::GcArtifactsRequest gc_ ABSL_GUARDED_BY(mu_);
};

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(ArtifactCommandsTest, PublishSendsTheDirectorysOwnPathAndPrintsHexJson) {
  FakeArtifactHost host;
  TempDir dir;
  std::filesystem::create_directories(dir.File("ckpt/sub"));
  std::filesystem::create_directory_symlink(dir.File("ckpt"), dir.File("link"));
  std::string parent(64, '0');
  parent[63] = 'F';
  CliResult r = Cli({"artifact", "publish", "--host", host.address(), "--shard", "3", "--dir",
                     dir.File("link/sub/.."), "--round", "12", "--parent", parent, "--kind", "eval",
                     "--chunk-size", "65536", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  // Progress as JSON lines on stderr: the first update, then (the host's updates coming faster
  // than one a second) only the final line.
  std::vector<std::string> progress = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
  ASSERT_EQ(progress.size(), 2u) << Describe(r);
  nlohmann::json first = nlohmann::json::parse(progress[0]);
  EXPECT_EQ(first["operation"], "publish");
  EXPECT_EQ(first["phase"], "hashing");
  EXPECT_EQ(first["done"], false);
  EXPECT_EQ(first["bytes_done"], 1 << 20);
  EXPECT_EQ(first["bytes_total"], 3 << 20);
  nlohmann::json last = nlohmann::json::parse(progress[1]);
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["bytes_done"], 3 << 20);
  EXPECT_EQ(last["eta_s"], 0);
  EXPECT_TRUE(last.contains("rate_bytes_per_s"));
  pb::PublishArtifactRequest sent = host.last_publish();
  EXPECT_EQ(sent.shard_id(), 3u);
  EXPECT_EQ(sent.source_dir(), std::filesystem::canonical(dir.File("ckpt")).string());
  EXPECT_EQ(sent.round(), 12u);
  EXPECT_EQ(common::HexEncode(sent.parent()), std::string(63, '0') + "f");
  EXPECT_EQ(sent.kind(), "eval");
  EXPECT_EQ(sent.chunk_size(), 65536u);

  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["artifact_id"], Repeat("ab", 32));
  EXPECT_EQ(doc["done"], true);
  EXPECT_EQ(doc["phase"], "done");
  EXPECT_EQ(doc["bytes_total"], std::to_string(3 << 20));
  EXPECT_EQ(doc["chunks_present"], 1);
  EXPECT_TRUE(doc.contains("peer_faults"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one JSON document";

  CliResult human = Cli(
      {"artifact", "publish", "--host", host.address(), "--shard", "3", "--dir", dir.File("ckpt")});
  ASSERT_EQ(human.code, 0) << Describe(human);
  EXPECT_THAT(human.out, HasSubstr("artifact_id:"));
  EXPECT_THAT(human.out, HasSubstr(Repeat("ab", 32)));
  EXPECT_THAT(human.err, HasSubstr("publish: hashing 33% 1.0 MiB / 3.0 MiB"))
      << "plain lines when stderr is not a terminal";
  EXPECT_THAT(human.err, HasSubstr("publish: done, 3.0 MiB in "));
  EXPECT_EQ(host.last_publish().kind(), "") << "the host's default kind";
  EXPECT_EQ(host.last_publish().chunk_size(), 0u) << "the host's default chunk size";
}

TEST(ArtifactCommandsTest, FetchPassesPeersAndAnAbsoluteOutAndReportsPeers) {
  FakeArtifactHost host;
  std::string peer_one = FreshAddress();
  std::string peer_two = FreshAddress();
  CliResult r =
      Cli({"artifact", "fetch", "--host", host.address(), "--shard", "3", "--id", Repeat("cd", 32),
           "--peer", peer_one, "--peer", peer_two, "--out", "relative/out", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  pb::FetchArtifactRequest sent = host.last_fetch();
  EXPECT_EQ(sent.shard_id(), 3u);
  EXPECT_EQ(sent.artifact_id(), std::string(32, '\xcd'));
  ASSERT_EQ(sent.peers_size(), 2);
  EXPECT_EQ(sent.peers(0), peer_one);
  EXPECT_EQ(sent.peers(1), peer_two);
  EXPECT_EQ(sent.out_dir(), (std::filesystem::current_path() / "relative/out").string());
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["artifact_id"], Repeat("cd", 32));
  EXPECT_EQ(doc["bytes_by_peer"]["gonka1peerone"], "4000");
  EXPECT_EQ(doc["peer_faults"][0]["peer"], "gonka1peertwo");
  EXPECT_EQ(doc["peer_faults"][0]["corrupt"], true);
  EXPECT_EQ(doc["chunks_fetched"], 4);

  CliResult human = Cli(
      {"artifact", "fetch", "--host", host.address(), "--shard", "3", "--id", Repeat("cd", 32)});
  ASSERT_EQ(human.code, 0) << Describe(human);
  EXPECT_EQ(host.last_fetch().peers_size(), 0) << "no --peer: the host asks every member";
  EXPECT_EQ(host.last_fetch().out_dir(), "");
  EXPECT_THAT(human.out, HasSubstr("bytes_fetched:"));
  EXPECT_THAT(human.out, HasSubstr("gonka1peerone"));
  EXPECT_THAT(human.err, HasSubstr("warning: peer gonka1peertwo (corrupt)"));
  EXPECT_THAT(human.err, HasSubstr("fetch: manifest\n"));
  EXPECT_THAT(human.err, HasSubstr("fetch: done, 4.9 KiB in "));
}

TEST(ArtifactCommandsTest, AFailedFetchNamesEveryDroppedPeerAndExitsOne) {
  FakeArtifactHost host;
  CliResult r = Cli({"artifact", "fetch", "--host", host.address(), "--shard", "3", "--id",
                     Repeat("ee", 32), "--json"});
  EXPECT_EQ(r.code, kExitRefused) << Describe(r);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("ABORTED"));
  EXPECT_THAT(r.err, HasSubstr("gonka1peerone: unavailable"));
  EXPECT_THAT(r.err, HasSubstr("gonka1peertwo: chunk 3f2a failed verification"));
  EXPECT_THAT(r.err, Not(HasSubstr("cannot reach")));
}

TEST(ArtifactCommandsTest, ListPrintsHexIdsAndParents) {
  FakeArtifactHost host;
  CliResult r = Cli({"artifact", "list", "--host", host.address(), "--shard", "5", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_FALSE(host.last_list().include_incomplete());
  nlohmann::json doc = nlohmann::json::parse(r.out);
  ASSERT_EQ(doc["artifacts"].size(), 1u);
  EXPECT_EQ(doc["artifacts"][0]["artifact_id"], Repeat("ab", 32));
  EXPECT_EQ(doc["artifacts"][0]["parent"], Repeat("01", 32));
  EXPECT_EQ(doc["artifacts"][0]["round"], "4");
  EXPECT_EQ(doc["artifacts"][0]["complete"], true);

  CliResult all = Cli({"artifact", "list", "--host", host.address(), "--shard", "5", "--all"});
  ASSERT_EQ(all.code, 0) << Describe(all);
  EXPECT_TRUE(host.last_list().include_incomplete());
  EXPECT_THAT(all.out, HasSubstr("incomplete"));
  EXPECT_THAT(all.out, HasSubstr(Repeat("02", 32)));
}

TEST(ArtifactCommandsTest, VerifyExitsOneOnDamageAndPrintsTheReport) {
  FakeArtifactHost host;
  CliResult clean = Cli({"artifact", "verify", "--host", host.address(), "--shard", "1", "--json"});
  ASSERT_EQ(clean.code, 0) << Describe(clean);
  nlohmann::json doc = nlohmann::json::parse(clean.out);
  EXPECT_EQ(doc["chunks_ok"], 9);
  EXPECT_EQ(doc["unreferenced"][0], std::string(64, 'e'));
  EXPECT_EQ(doc["unreferenced_bytes"], "4096");
  EXPECT_TRUE(doc["modified"].empty());
  // Unreferenced chunks are not damage (exit 0), but the store is not called clean.
  CliResult text = Cli({"artifact", "verify", "--host", host.address(), "--shard", "1"});
  ASSERT_EQ(text.code, 0) << Describe(text);
  EXPECT_THAT(text.out, HasSubstr("unreferenced_bytes:"));
  EXPECT_THAT(text.out, HasSubstr("1 unreferenced chunks holding 4096 bytes"));
  EXPECT_THAT(text.out, ::testing::Not(HasSubstr("clean")));

  CliResult damaged =
      Cli({"artifact", "verify", "--host", host.address(), "--shard", "2", "--json"});
  EXPECT_EQ(damaged.code, kExitRefused) << Describe(damaged);
  nlohmann::json report = nlohmann::json::parse(damaged.out);
  EXPECT_EQ(report["modified"][0], std::string(64, 'c'));
  EXPECT_EQ(report["missing"][0], std::string(64, 'd'));
  EXPECT_THAT(damaged.err, HasSubstr("damaged"));
}

TEST(ArtifactCommandsTest, GcPassesDropsAndPrintsCounts) {
  FakeArtifactHost host;
  CliResult r =
      Cli({"artifact", "gc", "--host", host.address(), "--shard", "1", "--drop-incomplete",
           "--drop", Repeat("ab", 32), "--drop", Repeat("CD", 32), "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  pb::GcArtifactsRequest sent = host.last_gc();
  EXPECT_TRUE(sent.drop_incomplete());
  ASSERT_EQ(sent.drop_artifacts_size(), 2);
  EXPECT_EQ(sent.drop_artifacts(1), std::string(32, '\xcd'));
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["artifacts_dropped"], 2);
  EXPECT_EQ(doc["bytes_freed"], "7000");
}

TEST(ArtifactCommandsTest, ASilentHostIsGivenUpOnAfterTimeoutMs) {
  FakeArtifactHost host;
  TempDir dir;
  CliResult r = Cli({"artifact", "publish", "--host", host.address(), "--shard", "1", "--dir",
                     dir.path(), "--kind", "silent", "--timeout-ms", "500"});
  EXPECT_EQ(r.code, kExitUnreachable) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no progress for 500 ms"));
}

TEST(ArtifactCommandsTest, UnreachableHostExitsThree) {
  TempDir dir;
  CliResult r = Cli({"artifact", "publish", "--host", "127.0.0.1:1", "--shard", "1", "--dir",
                     dir.path(), "--timeout-ms", "2000"});
  EXPECT_EQ(r.code, kExitUnreachable) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("cannot reach"));
  CliResult list = Cli({"artifact", "list", "--host", "127.0.0.1:1", "--shard", "1"});
  EXPECT_EQ(list.code, kExitUnreachable) << Describe(list);
}

}  // namespace
}  // namespace ts::sidecar
