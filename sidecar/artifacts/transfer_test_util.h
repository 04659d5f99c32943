// The artifact transfer tests' shared servers, hosts and fixture (transfer_test.cc,
// transfer_service_attack_test.cc, transfer_stream_test.cc); for tests only.
#ifndef TS_SIDECAR_ARTIFACTS_TRANSFER_TEST_UTIL_H_
#define TS_SIDECAR_ARTIFACTS_TRANSFER_TEST_UTIL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/secp256k1.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/chunk_stream.h"
#include "sidecar/artifacts/transfer.h"
#include "state/db.h"
#include "tests/util/loopback_server.h"
#include "tests/util/temp_dir.h"

namespace ts::sidecar::transfer_testing {

namespace fs = std::filesystem;

inline constexpr char kChain[] = "transfer-test-1";
inline constexpr uint64_t kShard = 1;
inline constexpr uint32_t kChunk = kMinChunkSize;  // 4 KiB: many chunks from small files

inline common::Clock* Clock() { return &common::SystemClock(); }

inline common::PrivateKey KeyOf(char byte) {
  auto key = common::PrivateKey::FromBytes(std::string(32, byte));
  TS_CHECK(key.ok());
  return *key;
}

inline std::string AddressOf(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

inline std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

inline void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TS_CHECK(out.good());
}

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every regular file under `dir`, by relative name.
inline std::map<std::string, std::string> Tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      out[fs::relative(entry.path(), dir).string()] = ReadFile(entry.path());
    }
  }
  return out;
}

// The files of a test artifact: several files over many 4 KiB chunks, an empty file, and two
// identical files (chunks shared within the artifact).
inline void MakeSource(const fs::path& dir, uint64_t seed) {
  std::mt19937_64 rng(seed);
  WriteFile(dir / "model" / "weights.bin", RandomBytes(rng, 300 * 1024 + 17));
  WriteFile(dir / "config.json", R"({"layers": 2})");
  WriteFile(dir / "data" / "part-0", RandomBytes(rng, 150 * 1024));
  WriteFile(dir / "EMPTY", "");
  const std::string same = RandomBytes(rng, 3 * kChunk);
  WriteFile(dir / "dup" / "a", same);
  WriteFile(dir / "dup" / "b", same);
}

class OneStore final : public StoreRegistry {
 public:
  explicit OneStore(ArtifactStore* store) : store_(store) {}
  absl::StatusOr<ArtifactStore*> StoreFor(uint64_t shard_id) override {
    if (shard_id != store_->shard_id()) {
      return absl::NotFoundError(absl::StrCat("no store for shard ", shard_id));
    }
    return store_;
  }

 private:
  ArtifactStore* store_;
};

using Server = test_util::LoopbackServer;

// `service` on a loopback port, taking requests up to the transfer service's cap.
inline Server StartServer(grpc::Service* service) {
  return test_util::StartLoopbackServer({service}, kMaxTransferRequestBytes);
}

// A shard host: its key, RocksDB, artifact store, and (when serving) the real transfer
// service on a loopback port.
struct Host {
  Host(const fs::path& root, std::string name, char key_byte, StoreQuota quota)
      : key(KeyOf(key_byte)), address(AddressOf(key)), dir(root / name) {
    fs::create_directories(dir);
    state::DbOptions options;
    options.tables = {std::string(kTableArtifacts)};
    auto opened = state::Db::Open((dir / "db").string(), options);
    TS_CHECK(opened.ok());
    db = *std::move(opened);
    auto s =
        ArtifactStore::Open((dir / "store").string(), db.get(), kChain, kShard, quota, Clock());
    TS_CHECK(s.ok());
    store = *std::move(s);
    registry = std::make_unique<OneStore>(store.get());
  }
  ~Host() { Stop(); }

  // Serves the transfer service and, unless `stream` is false, the chunk stream beside it (as
  // trainshardd does by default).
  void Serve(ShardDirectory* directory, TransferServiceOptions options = {}, bool stream = true,
             ChunkStreamServerOptions stream_options = {}) {
    verifier = std::make_unique<PeerRequestVerifier>(address, kChain, Clock());
    if (stream) {
      auto started = ChunkStreamServer::Start("127.0.0.1", Clock(), stream_options);
      TS_CHECK(started.ok());
      chunk_stream = *std::move(started);
      options.chunk_stream_port = chunk_stream->port();
    }
    service = std::make_unique<ArtifactTransferService>(registry.get(), directory, verifier.get(),
                                                        options);
    if (chunk_stream) chunk_stream->Open(service.get());
    server = StartServer(service.get());
  }
  void Stop() {
    if (chunk_stream) {
      chunk_stream->Shutdown();
      chunk_stream.reset();
    }
    if (server.server) {
      server.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
      server.server->Wait();
      server.server.reset();
    }
  }
  FetchPeer AsPeer() const { return FetchPeer{address, server.endpoint}; }

  common::PrivateKey key;
  std::string address;
  fs::path dir;
  std::unique_ptr<state::Db> db;
  std::unique_ptr<ArtifactStore> store;
  std::unique_ptr<OneStore> registry;
  std::unique_ptr<PeerRequestVerifier> verifier;
  std::unique_ptr<ArtifactTransferService> service;
  Server server;
  std::unique_ptr<ChunkStreamServer> chunk_stream;
};

// A peer that misbehaves in one chosen way, serving from a real store, without checking who
// asks (the fetcher's side is what its tests exercise).
class ScriptedPeer final : public pb::ArtifactTransfer::Service {
 public:
  enum class Mode {
    kHonest,
    kWrongManifest,     // the manifest of another artifact
    kOversizeManifest,  // above the channel's manifest cap
    kJunkManifest,      // 5 MiB of garbage: passes the channel, fails the checks
    kReverse,           // chunks in reverse order
    kUnrequested,       // a chunk of the artifact that was not asked for
    kExtra,             // every chunk asked for, then one more
    kOversizeChunk,     // one message above the channel's chunk cap
    kDataLoss,          // refuses with DATA_LOSS
    kShort,             // one chunk per call, then ends the stream with OK
  };
  ScriptedPeer(ArtifactStore* store, Mode mode) : store_(store), mode_(mode) {}

  void set_delay_ms(int64_t ms) { delay_ms_ = ms; }
  void set_other_artifact(std::string id) { other_id_ = std::move(id); }
  int chunks_served() const { return chunks_served_.load(); }
  int calls() const { return calls_.load(); }

  grpc::Status GetManifest(grpc::ServerContext*, const pb::GetManifestRequest* request,
                           pb::GetManifestResponse* response) override {
    std::string id = request->artifact_id();
    if (mode_ == Mode::kOversizeManifest || mode_ == Mode::kJunkManifest) {
      const size_t size =
          mode_ == Mode::kOversizeManifest ? kMaxManifestBytes + (256 << 10) : 5u << 20;
      response->mutable_manifest()->set_body(std::string(size, 'x'));
      response->mutable_manifest()->set_signature(std::string(65, 's'));
      return grpc::Status::OK;
    }
    if (mode_ == Mode::kWrongManifest) id = other_id_;
    auto manifest = store_->GetManifest(id, /*complete_only=*/true);
    if (!manifest.ok()) return ToGrpcStatus(manifest.status());
    *response->mutable_manifest() = manifest->manifest;
    return grpc::Status::OK;
  }

  grpc::Status GetChunks(grpc::ServerContext* context, const pb::GetChunksRequest* request,
                         grpc::ServerWriter<pb::ChunkData>* writer) override {
    ++calls_;
    if (mode_ == Mode::kDataLoss) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "chunk file damaged");
    }
    std::vector<std::string> hashes(request->chunks().begin(), request->chunks().end());
    if (mode_ == Mode::kReverse) std::reverse(hashes.begin(), hashes.end());
    if (mode_ == Mode::kUnrequested) {
      auto manifest = store_->GetManifest(request->artifact_id(), true);
      if (!manifest.ok()) return ToGrpcStatus(manifest.status());
      for (const auto& file : manifest->body.files()) {
        for (const std::string& h : file.chunks()) {
          if (std::find(hashes.begin(), hashes.end(), h) == hashes.end()) {
            hashes.insert(hashes.begin(), h);
            break;
          }
        }
        if (hashes.size() > static_cast<size_t>(request->chunks_size())) break;
      }
    }
    if (mode_ == Mode::kExtra) hashes.push_back(hashes.front());
    if (mode_ == Mode::kShort) hashes.resize(1);
    for (const std::string& hash : hashes) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
      pb::ChunkData chunk;
      chunk.set_hash(hash);
      if (mode_ == Mode::kOversizeChunk) {
        chunk.set_data(std::string(5u << 20, 'x'));
      } else {
        auto data = store_->ReadChunk(hash);
        if (!data.ok()) return ToGrpcStatus(data.status());
        chunk.set_data(*std::move(data));
      }
      if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
      ++chunks_served_;
    }
    return grpc::Status::OK;
  }

 private:
  ArtifactStore* store_;
  const Mode mode_;
  int64_t delay_ms_ = 0;
  std::string other_id_;
  std::atomic<int> chunks_served_{0};
  std::atomic<int> calls_{0};
};

class TransferTest : public ::testing::Test {
 protected:
  static constexpr StoreQuota kQuota{64u << 20, 100000};

  void SetUp() override {
    publisher_ = AddHost("a", 0x0a);
    MakeSource(tmp_.path() / "source", /*seed=*/1);
    PublishOptions options;
    options.source_dir = (tmp_.path() / "source").string();
    options.chunk_size = kChunk;
    auto published = publisher_->store->Publish(options, publisher_->key, nullptr);
    ASSERT_TRUE(published.ok()) << published.status();
    id_ = published->id;
    // Distinct chunks: the publisher's store holds this artifact only.
    total_chunks_ = static_cast<uint32_t>(publisher_->store->Usage().files);
    ASSERT_LT(total_chunks_, published->total_chunks);  // the two identical files share chunks
    ASSERT_GT(total_chunks_, 100u);
    publisher_->Serve(&directory_);
    UpdateDirectory();
  }

  Host* AddHost(const std::string& name, char key_byte, bool member = true,
                StoreQuota quota = kQuota) {
    hosts_.push_back(std::make_unique<Host>(tmp_.path(), name, key_byte, quota));
    if (member) {
      members_.push_back(hosts_.back().get());
      UpdateDirectory();
    }
    return hosts_.back().get();
  }

  void UpdateDirectory() {
    ShardView view;
    view.shard_id = kShard;
    view.status = pb::SHARD_STATUS_RUNNING;
    for (const Host* host : members_) {
      view.members.push_back(ShardMember{host->address, host->server.endpoint, 10});
    }
    view.creator = creator_;
    view.readers = readers_;
    directory_.Set(view);
  }

  FetchContext ContextFor(Host* host) {
    FetchContext context;
    context.key = &host->key;
    context.self_address = host->address;
    context.store = host->store.get();
    context.directory = &directory_;
    context.clock = Clock();
    return context;
  }

  FetchRequest RequestFor(std::vector<FetchPeer> peers, std::string id = "") {
    FetchRequest request;
    request.shard_id = kShard;
    request.artifact_id = id.empty() ? id_ : id;
    request.peers = std::move(peers);
    return request;
  }

  // The fetched artifact exported equals the source, and the fetcher's store verifies clean.
  void ExpectIdentical(Host* host, const std::string& out_name) {
    const fs::path out = tmp_.path() / out_name;
    absl::Status exported = host->store->Export(id_, out.string(), nullptr);
    ASSERT_TRUE(exported.ok()) << exported;
    EXPECT_EQ(Tree(out), Tree(tmp_.path() / "source"));
    auto verify = host->store->Verify();
    ASSERT_TRUE(verify.ok()) << verify.status();
    EXPECT_EQ(verify->modified_size(), 0);
    EXPECT_EQ(verify->missing_size(), 0);
    EXPECT_EQ(verify->incomplete_size(), 0);
  }

  bool HasComplete(Host* host) {
    auto list = host->store->List(/*include_incomplete=*/false);
    TS_CHECK(list.ok());
    for (const auto& summary : *list) {
      if (summary.artifact_id() == id_) return true;
    }
    return false;
  }

  // A host with a complete copy, fetched from the publisher, serving it.
  Host* AddCopy(const std::string& name, char key_byte) {
    Host* host = AddHost(name, key_byte);
    auto fetched = FetchArtifact(ContextFor(host), RequestFor({publisher_->AsPeer()}));
    TS_CHECK(fetched.ok());
    host->Serve(&directory_);
    UpdateDirectory();
    return host;
  }

  // An artifact publisher_ also holds, other than id_, of `kind`.
  std::string PublishOther(const std::string& kind = "checkpoint") {
    std::mt19937_64 rng(99);
    WriteFile(tmp_.path() / "other" / "x.bin", RandomBytes(rng, 5 * kChunk));
    PublishOptions options;
    options.source_dir = (tmp_.path() / "other").string();
    options.chunk_size = kChunk;
    options.kind = kind;
    auto published = publisher_->store->Publish(options, publisher_->key, nullptr);
    TS_CHECK(published.ok());
    return published->id;
  }

  // Signs `request` for `method` as the key's host (audience: the publisher unless given).
  template <typename Request>
  void Sign(Request* request, const common::PrivateKey& key, std::string_view method,
            std::string audience = "", int64_t issued_ms = 0, int64_t lifetime_ms = 30000) {
    if (audience.empty()) audience = publisher_->address;
    if (issued_ms == 0) issued_ms = Clock()->NowUnixMs();
    request->clear_auth();
    auto auth = SignPeerRequest(key, kChain, request->shard_id(), method, audience, *request,
                                issued_ms, lifetime_ms);
    TS_CHECK(auth.ok());
    *request->mutable_auth() = *auth;
  }

  test_util::TempDir tmp_{"ts_transfer_"};
  StaticShardDirectory directory_;
  std::vector<std::unique_ptr<Host>> hosts_;
  std::vector<Host*> members_;
  std::string creator_;               // the shard's creator in the directory's view
  std::vector<std::string> readers_;  // and its readers
  Host* publisher_ = nullptr;
  std::string id_;
  uint32_t total_chunks_ = 0;
};

}  // namespace ts::sidecar::transfer_testing

#endif  // TS_SIDECAR_ARTIFACTS_TRANSFER_TEST_UTIL_H_
