// The artifact operator API between two hosts in one process, each with its own RocksDB, store
// directory, transfer server and operator server on 127.0.0.1, sharing a static shard directory:
// publish on A through A's operator API, fetch on B through B's, the exported bytes equal the
// source; resume after a client that went away; requests refused naming the field.
#include "sidecar/artifacts/operator_service.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/status.h"
#include "sidecar/artifacts/manifest.h"
#include "sidecar/artifacts/store.h"
#include "sidecar/artifacts/transfer.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/peer/shard_directory.h"
#include "state/db.h"
#include "tests/util/loopback_server.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kChain[] = "operator-test-1";
constexpr uint64_t kShard = 7;
constexpr uint64_t kOtherShard = 8;  // A and B are not members
constexpr uint32_t kChunk = kMinChunkSize;

common::Clock* Clock() { return &common::SystemClock(); }

common::PrivateKey KeyOf(char byte) {
  auto key = common::PrivateKey::FromBytes(std::string(32, byte));
  TS_CHECK(key.ok());
  return *key;
}

std::string AddressOf(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

std::string ReadWhole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteWhole(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// Slows every GetChunks call of the transfer service it wraps, so a fetch can be interrupted
// half-way on a fast loopback.
class SlowTransfer final : public pb::ArtifactTransfer::Service {
 public:
  explicit SlowTransfer(pb::ArtifactTransfer::Service* inner) : inner_(inner) {}
  void set_delay_ms(int ms) { delay_ms_.store(ms); }

  grpc::Status GetManifest(grpc::ServerContext* context, const pb::GetManifestRequest* request,
                           pb::GetManifestResponse* response) override {
    return inner_->GetManifest(context, request, response);
  }
  grpc::Status GetChunks(grpc::ServerContext* context, const pb::GetChunksRequest* request,
                         grpc::ServerWriter<pb::ChunkData>* writer) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_.load()));
    return inner_->GetChunks(context, request, writer);
  }
  grpc::Status ListArtifacts(grpc::ServerContext* context, const pb::ListArtifactsRequest* request,
                             pb::ListArtifactsResponse* response) override {
    return inner_->ListArtifacts(context, request, response);
  }

 private:
  pb::ArtifactTransfer::Service* const inner_;
  std::atomic<int> delay_ms_{0};
};

// One host: its database, store registry, transfer server (peers) and operator server (CLI).
class TestHost {
 public:
  TestHost(const fs::path& root, common::PrivateKey key, ShardDirectory* directory,
           ArtifactOperatorOptions operator_options = {})
      : key_(std::move(key)), address_(AddressOf(key_)) {
    fs::create_directories(root);
    state::DbOptions db_options;
    db_options.tables = {std::string(kTableArtifacts)};
    auto db = state::Db::Open((root / "db").string(), db_options);
    TS_CHECK(db.ok());
    db_ = *std::move(db);
    ShardStoreRegistryOptions options;
    options.artifacts_dir = (root / "artifacts").string();
    options.self_address = address_;
    options.chain_id = kChain;
    registry_ = std::make_unique<ShardStoreRegistry>(db_.get(), directory, Clock(), options);
    verifier_ = std::make_unique<PeerRequestVerifier>(address_, kChain, Clock());
    transfer_ =
        std::make_unique<ArtifactTransferService>(registry_.get(), directory, verifier_.get());
    slow_ = std::make_unique<SlowTransfer>(transfer_.get());
    operator_ = std::make_unique<ArtifactOperatorService>(registry_.get(), directory, key_, Clock(),
                                                          operator_options);
    transfer_server_ = test_util::StartLoopbackServer({slow_.get()}, kMaxTransferRequestBytes);
    operator_server_ = test_util::StartLoopbackServer({operator_.get()});
    stub_ = pb::ArtifactOperator::NewStub(
        grpc::CreateChannel(operator_server_.endpoint, grpc::InsecureChannelCredentials()));
  }
  ~TestHost() {
    operator_server_.server->Shutdown(std::chrono::system_clock::now());
    transfer_server_.server->Shutdown(std::chrono::system_clock::now());
  }

  const std::string& address() const { return address_; }
  const std::string& endpoint() const { return transfer_server_.endpoint; }
  pb::ArtifactOperator::Stub& stub() { return *stub_; }
  SlowTransfer& transfer() { return *slow_; }

 private:
  common::PrivateKey key_;
  std::string address_;
  std::unique_ptr<state::Db> db_;
  std::unique_ptr<ShardStoreRegistry> registry_;
  std::unique_ptr<PeerRequestVerifier> verifier_;
  std::unique_ptr<ArtifactTransferService> transfer_;
  std::unique_ptr<SlowTransfer> slow_;
  std::unique_ptr<ArtifactOperatorService> operator_;
  test_util::LoopbackServer transfer_server_;
  test_util::LoopbackServer operator_server_;
  std::unique_ptr<pb::ArtifactOperator::Stub> stub_;
};

// What a streaming call returned: every message and the final status.
struct StreamResult {
  grpc::Status status;
  std::vector<pb::ArtifactProgress> messages;
  const pb::ArtifactProgress& last() const { return messages.back(); }
};

template <typename Call>
StreamResult ReadStream(Call call, int deadline_s = 60) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
  auto reader = call(&context);
  StreamResult result;
  pb::ArtifactProgress message;
  while (reader->Read(&message)) result.messages.push_back(message);
  result.status = reader->Finish();
  return result;
}

class ArtifactOperatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ts-artifact-operator-XXXXXX";
    TS_CHECK(::mkdtemp(tmpl) != nullptr);
    root_ = tmpl;
    ArtifactOperatorOptions options;
    // One chunk per call and one stream per peer: a slowed peer makes a fetch last long enough
    // to interrupt.
    options.fetcher.chunks_per_request = 1;
    options.fetcher.streams_per_peer = 1;
    options.fetcher.streams_target = 1;
    a_ = std::make_unique<TestHost>(root_ / "a", KeyOf('\x0a'), &directory_);
    b_ = std::make_unique<TestHost>(root_ / "b", KeyOf('\x0b'), &directory_, options);
    ShardView view;
    view.shard_id = kShard;
    view.status = pb::SHARD_STATUS_RUNNING;
    view.members = {{a_->address(), a_->endpoint(), 100},
                    {b_->address(), b_->endpoint(), 80},
                    {outsider_member_, "127.0.0.1:1", 10}};
    view.quota_bytes_max = 64u << 20;
    view.quota_files_max = 10000;
    directory_.Set(view);
    ShardView other;
    other.shard_id = kOtherShard;
    other.status = pb::SHARD_STATUS_RUNNING;
    other.members = {{AddressOf(KeyOf('\x0c')), "127.0.0.1:1", 1}};
    other.quota_bytes_max = 1u << 20;
    other.quota_files_max = 100;
    directory_.Set(other);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // A source tree: nested files, an empty one, sizes that are not multiples of the chunk size.
  std::map<std::string, std::string> MakeSource(const fs::path& dir, size_t scale = 1) {
    std::mt19937_64 rng(42);
    auto random = [&](size_t n) {
      std::string s(n, '\0');
      for (char& c : s) c = static_cast<char>(rng());
      return s;
    };
    std::map<std::string, std::string> files = {
        {"model.bin", random(scale * 10 * kChunk + 123)},
        {"optimizer/state.bin", random(scale * 3 * kChunk)},
        {"config.json", "{\"layers\": 2}\n"},
        {"empty", ""},
    };
    for (const auto& [name, bytes] : files) WriteWhole(dir / name, bytes);
    return files;
  }

  StreamResult Publish(TestHost& host, const pb::PublishArtifactRequest& request) {
    return ReadStream([&](grpc::ClientContext* c) { return host.stub().Publish(c, request); });
  }
  StreamResult Fetch(TestHost& host, const pb::FetchArtifactRequest& request) {
    return ReadStream([&](grpc::ClientContext* c) { return host.stub().Fetch(c, request); });
  }
  grpc::Status List(TestHost& host, uint64_t shard, bool incomplete,
                    pb::ListArtifactsResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::ListLocalArtifactsRequest request;
    request.set_shard_id(shard);
    request.set_include_incomplete(incomplete);
    return host.stub().List(&context, request, response);
  }

  std::string PublishSource(const std::map<std::string, std::string>& files) {
    pb::PublishArtifactRequest request;
    request.set_shard_id(kShard);
    request.set_source_dir((root_ / "src").string());
    request.set_round(3);
    request.set_kind("checkpoint");
    request.set_chunk_size(kChunk);
    StreamResult published = Publish(*a_, request);
    EXPECT_TRUE(published.status.ok()) << published.status.error_message();
    if (!published.status.ok()) return "";
    EXPECT_TRUE(published.last().done());
    return published.last().artifact_id();
  }

  fs::path root_;
  std::string outsider_member_ = AddressOf(KeyOf('\x0d'));
  StaticShardDirectory directory_;
  std::unique_ptr<TestHost> a_;
  std::unique_ptr<TestHost> b_;
};

TEST_F(ArtifactOperatorTest, PublishOnAFetchOnBExportsTheSameBytes) {
  std::map<std::string, std::string> files = MakeSource(root_ / "src");
  pb::PublishArtifactRequest publish;
  publish.set_shard_id(kShard);
  publish.set_source_dir((root_ / "src").string());
  publish.set_round(3);
  publish.set_kind("checkpoint");
  publish.set_chunk_size(kChunk);
  StreamResult published = Publish(*a_, publish);
  ASSERT_TRUE(published.status.ok()) << published.status.error_message();
  ASSERT_GE(published.messages.size(), 2u) << "a first message, then the final one";
  EXPECT_FALSE(published.messages.front().done());
  const pb::ArtifactProgress& done = published.last();
  EXPECT_TRUE(done.done());
  EXPECT_EQ(done.phase(), "done");
  ASSERT_EQ(done.artifact_id().size(), 32u);
  uint64_t total = 0;
  for (const auto& [name, bytes] : files) total += bytes.size();
  EXPECT_EQ(done.bytes_total(), total);
  EXPECT_EQ(done.chunks_total(), 10u + 1 + 3 + 1);

  pb::ListArtifactsResponse on_a;
  ASSERT_TRUE(List(*a_, kShard, false, &on_a).ok());
  ASSERT_EQ(on_a.artifacts_size(), 1);
  EXPECT_EQ(on_a.artifacts(0).artifact_id(), done.artifact_id());
  EXPECT_TRUE(on_a.artifacts(0).complete());
  EXPECT_EQ(on_a.artifacts(0).round(), 3u);
  EXPECT_EQ(on_a.artifacts(0).publisher(), a_->address());

  // B fetches from the members it is told about (A) and exports.
  pb::FetchArtifactRequest fetch;
  fetch.set_shard_id(kShard);
  fetch.set_artifact_id(done.artifact_id());
  fetch.add_peers(a_->address());
  fetch.set_out_dir((root_ / "out").string());
  StreamResult fetched = Fetch(*b_, fetch);
  ASSERT_TRUE(fetched.status.ok()) << fetched.status.error_message();
  const pb::ArtifactProgress& result = fetched.last();
  EXPECT_TRUE(result.done());
  EXPECT_EQ(result.artifact_id(), done.artifact_id());
  EXPECT_EQ(result.chunks_present(), 0u);
  EXPECT_EQ(result.chunks_fetched(), done.chunks_total());
  EXPECT_EQ(result.bytes_by_peer().at(a_->address()), result.bytes_fetched());
  EXPECT_TRUE(result.peer_faults().empty());
  for (const auto& [name, bytes] : files) {
    EXPECT_EQ(ReadWhole(root_ / "out" / name), bytes) << name;
  }
  size_t exported = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root_ / "out")) {
    exported += entry.is_regular_file() ? 1 : 0;
  }
  EXPECT_EQ(exported, files.size());

  pb::ListArtifactsResponse on_b;
  ASSERT_TRUE(List(*b_, kShard, false, &on_b).ok());
  ASSERT_EQ(on_b.artifacts_size(), 1);
  EXPECT_TRUE(on_b.artifacts(0).complete());

  grpc::ClientContext verify_context;
  pb::VerifyArtifactsRequest verify;
  verify.set_shard_id(kShard);
  pb::VerifyArtifactsResponse report;
  ASSERT_TRUE(b_->stub().Verify(&verify_context, verify, &report).ok());
  EXPECT_EQ(report.artifacts_checked(), 1u);
  EXPECT_EQ(report.chunks_ok(), done.chunks_total());
  EXPECT_TRUE(report.modified().empty());
  EXPECT_TRUE(report.missing().empty());

  // Fetching again moves nothing; with no peers named, every other member is asked, the
  // unreachable one included, which must not matter when nothing is missing.
  pb::FetchArtifactRequest again;
  again.set_shard_id(kShard);
  again.set_artifact_id(done.artifact_id());
  again.add_peers(a_->address());
  StreamResult refetched = Fetch(*b_, again);
  ASSERT_TRUE(refetched.status.ok()) << refetched.status.error_message();
  EXPECT_EQ(refetched.last().chunks_fetched(), 0u);
  EXPECT_EQ(refetched.last().chunks_present(), done.chunks_total());

  // Dropping the artifact on B frees its chunks.
  grpc::ClientContext gc_context;
  pb::GcArtifactsRequest gc;
  gc.set_shard_id(kShard);
  gc.add_drop_artifacts(done.artifact_id());
  pb::GcArtifactsResponse collected;
  ASSERT_TRUE(b_->stub().Gc(&gc_context, gc, &collected).ok());
  EXPECT_EQ(collected.artifacts_dropped(), 1u);
  EXPECT_GT(collected.chunks_removed(), 0u);
  EXPECT_GT(collected.bytes_freed(), 0u);
  pb::ListArtifactsResponse after_gc;
  ASSERT_TRUE(List(*b_, kShard, true, &after_gc).ok());
  EXPECT_EQ(after_gc.artifacts_size(), 0);
}

TEST_F(ArtifactOperatorTest, ExportWritesAStoredArtifactAndRefusesBadRequests) {
  std::map<std::string, std::string> files = MakeSource(root_ / "src");
  const std::string id = PublishSource(files);
  ASSERT_EQ(id.size(), 32u);
  auto export_to = [&](uint64_t shard, const std::string& artifact, const fs::path& out,
                       pb::ArtifactProgress* progress) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::ExportArtifactRequest request;
    request.set_shard_id(shard);
    request.set_artifact_id(artifact);
    request.set_out_dir(out.string());
    return a_->stub().Export(&context, request, progress);
  };
  pb::ArtifactProgress progress;
  grpc::Status status = export_to(kShard, id, root_ / "exported", &progress);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(progress.done());
  EXPECT_EQ(progress.artifact_id(), id);
  for (const auto& [name, bytes] : files) {
    EXPECT_EQ(ReadWhole(root_ / "exported" / name), bytes) << name;
  }

  // Not over what is there, not a relative path, not a short id, not an artifact not held.
  status = export_to(kShard, id, root_ / "exported", &progress);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("exists and is not empty"));
  status = export_to(kShard, id, "relative/out", &progress);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("out_dir"));
  status = export_to(kShard, id.substr(0, 31), root_ / "other", &progress);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("artifact_id"));
  status = export_to(kShard, std::string(32, '\x5a'), root_ / "other", &progress);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_FALSE(fs::exists(root_ / "other" / "model.bin"));
}

TEST_F(ArtifactOperatorTest, AFetchWhoseClientGoesAwayStopsAndResumesLater) {
  std::map<std::string, std::string> files = MakeSource(root_ / "src", /*scale=*/4);
  std::string id = PublishSource(files);
  ASSERT_EQ(id.size(), 32u);
  a_->transfer().set_delay_ms(30);

  pb::FetchArtifactRequest fetch;
  fetch.set_shard_id(kShard);
  fetch.set_artifact_id(id);
  fetch.add_peers(a_->address());
  {
    grpc::ClientContext context;
    auto reader = b_->stub().Fetch(&context, fetch);
    pb::ArtifactProgress message;
    bool some_fetched = false;
    while (!some_fetched && reader->Read(&message)) {
      some_fetched = message.phase() == "fetching" && message.chunks_fetched() > 0;
    }
    ASSERT_TRUE(some_fetched);
    context.TryCancel();
    while (reader->Read(&message)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The handler notices, the fetch stops between chunks and leaves an incomplete artifact.
  pb::ListArtifactsResponse listed;
  bool incomplete = false;
  for (int i = 0; i < 100 && !incomplete; ++i) {
    listed.Clear();
    ASSERT_TRUE(List(*b_, kShard, true, &listed).ok());
    incomplete = listed.artifacts_size() == 1 && !listed.artifacts(0).complete();
    if (!incomplete) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(incomplete) << listed.DebugString();
  pb::ListArtifactsResponse complete_only;
  ASSERT_TRUE(List(*b_, kShard, false, &complete_only).ok());
  EXPECT_EQ(complete_only.artifacts_size(), 0) << "an incomplete artifact is never listed";

  // Once the first handler is gone (the operation slot is free), a new fetch resumes.
  a_->transfer().set_delay_ms(0);
  StreamResult resumed;
  for (int i = 0; i < 100; ++i) {
    resumed = Fetch(*b_, fetch);
    if (resumed.status.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
        resumed.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(resumed.status.ok()) << resumed.status.error_message();
  EXPECT_GT(resumed.last().chunks_present(), 0u);
  EXPECT_EQ(resumed.last().chunks_present() + resumed.last().chunks_fetched(),
            resumed.last().chunks_total());
  pb::FetchArtifactRequest exported = fetch;
  exported.set_out_dir((root_ / "out").string());
  ASSERT_TRUE(Fetch(*b_, exported).status.ok());
  for (const auto& [name, bytes] : files) {
    EXPECT_EQ(ReadWhole(root_ / "out" / name), bytes) << name;
  }
}

TEST_F(ArtifactOperatorTest, UnreachablePeersAbortNamingEachPeer) {
  std::string id(32, '\x42');
  pb::FetchArtifactRequest fetch;
  fetch.set_shard_id(kShard);
  fetch.set_artifact_id(id);
  fetch.add_peers(outsider_member_);  // a member whose endpoint nothing listens on
  StreamResult result = Fetch(*b_, fetch);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::ABORTED) << result.status.error_message();
  EXPECT_THAT(result.status.error_message(), HasSubstr(outsider_member_));
}

struct BadRequest {
  std::string name;
  std::function<grpc::Status(TestHost&)> call;
  grpc::StatusCode code;
  std::string message;
};

TEST_F(ArtifactOperatorTest, BadRequestsAreRefusedNamingTheField) {
  fs::create_directories(root_ / "full");
  WriteWhole(root_ / "full" / "x", "x");
  auto publish = [this](std::function<void(pb::PublishArtifactRequest&)> edit) {
    return [this, edit](TestHost& host) {
      pb::PublishArtifactRequest request;
      request.set_shard_id(kShard);
      request.set_source_dir((root_ / "full").string());
      edit(request);
      return Publish(host, request).status;
    };
  };
  auto fetch = [this](std::function<void(pb::FetchArtifactRequest&)> edit) {
    return [this, edit](TestHost& host) {
      pb::FetchArtifactRequest request;
      request.set_shard_id(kShard);
      request.set_artifact_id(std::string(32, 'i'));
      edit(request);
      return Fetch(host, request).status;
    };
  };
  const std::string a = a_->address();
  const std::string b = b_->address();
  const std::vector<BadRequest> cases = {
      {"publish shard 0", publish([](auto& r) { r.set_shard_id(0); }),
       grpc::StatusCode::INVALID_ARGUMENT, "shard_id: 0"},
      {"publish relative dir", publish([](auto& r) { r.set_source_dir("rel"); }),
       grpc::StatusCode::INVALID_ARGUMENT, "source_dir: \"rel\" is not absolute"},
      {"publish parent", publish([](auto& r) { r.set_parent(std::string(31, 'p')); }),
       grpc::StatusCode::INVALID_ARGUMENT, "parent: 31 bytes, want 32"},
      {"publish kind", publish([](auto& r) { r.set_kind("Check Point"); }),
       grpc::StatusCode::INVALID_ARGUMENT, "kind: \"Check Point\""},
      {"publish chunk size", publish([](auto& r) { r.set_chunk_size(100); }),
       grpc::StatusCode::INVALID_ARGUMENT, "chunk_size: 100"},
      {"publish other shard", publish([](auto& r) { r.set_shard_id(kOtherShard); }),
       grpc::StatusCode::FAILED_PRECONDITION, "is not a member of shard 8"},
      {"publish unknown shard", publish([](auto& r) { r.set_shard_id(99); }),
       grpc::StatusCode::NOT_FOUND, "99"},
      {"fetch id", fetch([](auto& r) { r.set_artifact_id(std::string(31, 'i')); }),
       grpc::StatusCode::INVALID_ARGUMENT, "artifact_id: 31 bytes, want 32"},
      {"fetch peer not an address", fetch([](auto& r) { r.add_peers("nope"); }),
       grpc::StatusCode::INVALID_ARGUMENT, "peers[0]"},
      {"fetch from itself", fetch([b](auto& r) { r.add_peers(b); }),
       grpc::StatusCode::INVALID_ARGUMENT, "is this host"},
      {"fetch peer twice", fetch([a](auto& r) {
         r.add_peers(a);
         r.add_peers(a);
       }),
       grpc::StatusCode::INVALID_ARGUMENT, "peers[1]: " + a + " is given twice"},
      {"fetch non-member peer", fetch([](auto& r) { r.add_peers(AddressOf(KeyOf('\x0e'))); }),
       grpc::StatusCode::FAILED_PRECONDITION, "peers[0]: " + AddressOf(KeyOf('\x0e'))},
      {"fetch relative out", fetch([](auto& r) { r.set_out_dir("out"); }),
       grpc::StatusCode::INVALID_ARGUMENT, "out_dir: \"out\" is not absolute"},
      {"fetch into a full dir",
       fetch([this](auto& r) { r.set_out_dir((root_ / "full").string()); }),
       grpc::StatusCode::FAILED_PRECONDITION, "exists and is not empty"},
      {"gc drop",
       [](TestHost& host) {
         grpc::ClientContext context;
         pb::GcArtifactsRequest request;
         request.set_shard_id(kShard);
         request.add_drop_artifacts(std::string(32, 'd'));
         request.add_drop_artifacts("short");
         pb::GcArtifactsResponse response;
         return host.stub().Gc(&context, request, &response);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "drop_artifacts[1]: 5 bytes, want 32"},
      {"list shard 0",
       [this](TestHost& host) {
         pb::ListArtifactsResponse response;
         return List(host, 0, false, &response);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "shard_id: 0"},
      {"list other shard",
       [this](TestHost& host) {
         pb::ListArtifactsResponse response;
         return List(host, kOtherShard, false, &response);
       },
       grpc::StatusCode::FAILED_PRECONDITION, "not a member of shard 8"},
  };
  for (const BadRequest& c : cases) {
    grpc::Status status = c.call(*b_);
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.name;
  }
  // Nothing was written for any of them: no artifact, and the full directory is untouched.
  pb::ListArtifactsResponse listed;
  ASSERT_TRUE(List(*b_, kShard, true, &listed).ok());
  EXPECT_EQ(listed.artifacts_size(), 0);
  EXPECT_EQ(ReadWhole(root_ / "full" / "x"), "x");
}

TEST_F(ArtifactOperatorTest, UnsafeSourceEntriesAreRefused) {
  fs::create_directories(root_ / "src");
  WriteWhole(root_ / "src" / "ok", "fine");
  fs::create_symlink("/etc/passwd", root_ / "src" / "link");
  pb::PublishArtifactRequest request;
  request.set_shard_id(kShard);
  request.set_source_dir((root_ / "src").string());
  StreamResult result = Publish(*a_, request);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << result.status.error_message();
  EXPECT_THAT(result.status.error_message(), HasSubstr("link"));
  pb::ListArtifactsResponse listed;
  ASSERT_TRUE(List(*a_, kShard, true, &listed).ok());
  EXPECT_EQ(listed.artifacts_size(), 0);
}

TEST_F(ArtifactOperatorTest, ConcurrentOperationsAreCapped) {
  ArtifactOperatorOptions options;
  options.max_concurrent_operations = 0;
  TestHost capped(root_ / "capped", KeyOf('\x0a'), &directory_, options);
  fs::create_directories(root_ / "src");
  pb::PublishArtifactRequest request;
  request.set_shard_id(kShard);
  request.set_source_dir((root_ / "src").string());
  StreamResult result = Publish(capped, request);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(result.status.error_message(), HasSubstr("at most 0"));
}

}  // namespace
}  // namespace ts::sidecar
