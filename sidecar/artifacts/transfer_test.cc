#include "sidecar/artifacts/transfer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/tls_identity.h"
#include "common/crypto/tls_session.h"
#include "common/hex.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/chunk_stream.h"
#include "state/db.h"
#include "tests/util/temp_dir.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kChain[] = "transfer-test-1";
constexpr uint64_t kShard = 1;
constexpr uint32_t kChunk = kMinChunkSize;  // 4 KiB: many chunks from small files

common::Clock* Clock() { return &common::SystemClock(); }

std::string Hex(std::string_view bytes) { return common::HexEncode(bytes); }

common::PrivateKey KeyOf(char byte) {
  auto key = common::PrivateKey::FromBytes(std::string(32, byte));
  TS_CHECK(key.ok());
  return *key;
}

std::string AddressOf(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TS_CHECK(out.good());
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every regular file under `dir`, by relative name.
std::map<std::string, std::string> Tree(const fs::path& dir) {
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
void MakeSource(const fs::path& dir, uint64_t seed) {
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

struct Server {
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;
};

Server StartServer(grpc::Service* service) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxTransferRequestBytes);
  builder.RegisterService(service);
  Server s;
  s.server = builder.BuildAndStart();
  TS_CHECK(s.server != nullptr && port > 0);
  s.endpoint = absl::StrCat("127.0.0.1:", port);
  return s;
}

// An endpoint where nothing listens (a server started and stopped).
// A loopback endpoint that refuses connections: its port stays bound, not listening, until the
// test process exits, so no server started later (port 0) is given it. (A port freed by a stopped
// server was handed to the next one, which then answered at the "dead" endpoint.)
std::string DeadEndpoint() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TS_CHECK(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TS_CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  TS_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));  // fd held on purpose
}

// A plain TCP connection to 127.0.0.1:`port`, from `source` (any address of 127.0.0.0/8: each
// is a source of its own to the chunk stream's bounds) when given. Returns the descriptor.
int ConnectTo(uint16_t port, const std::string& source = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TS_CHECK(fd >= 0);
  if (!source.empty()) {
    struct sockaddr_in from = {};
    from.sin_family = AF_INET;
    TS_CHECK(::inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1);
    TS_CHECK(::bind(fd, reinterpret_cast<struct sockaddr*>(&from), sizeof(from)) == 0);
  }
  struct sockaddr_in to = {};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TS_CHECK(::connect(fd, reinterpret_cast<struct sockaddr*>(&to), sizeof(to)) == 0);
  return fd;
}

// A listener that accepts every connection and resets it at once (SO_LINGER 0): a chunk stream
// port that refuses everyone, as a host's whose stream is unusable from here.
class ResettingListener {
 public:
  ResettingListener() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TS_CHECK(::bind(listen_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
    TS_CHECK(::listen(listen_, 64) == 0);
    socklen_t len = sizeof(addr);
    TS_CHECK(::getsockname(listen_, reinterpret_cast<struct sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        ++accepted_;
        const struct linger reset = {1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
        ::close(fd);
      }
    });
  }
  ~ResettingListener() {
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  int listen_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<int> accepted_{0};
};

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

// ---------------------------------------------------------------------------------------------
// Fetching

TEST_F(TransferTest, FetchFromOnePeer) {
  Host* d = AddHost("d", 0x0d);
  std::vector<pb::ArtifactProgress> progress;
  FetchContext context = ContextFor(d);
  context.progress = [&](const pb::ArtifactProgress& p) { progress.push_back(p); };
  auto result = FetchArtifact(context, RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->done());
  EXPECT_EQ(result->phase(), "done");
  EXPECT_EQ(result->artifact_id(), id_);
  EXPECT_EQ(result->chunks_present(), 0u);
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  EXPECT_EQ(result->chunks_total(), total_chunks_);
  EXPECT_EQ(result->bytes_done(), result->bytes_total());
  EXPECT_EQ(result->bytes_fetched(), result->bytes_total());
  EXPECT_EQ(result->bytes_by_peer().at(publisher_->address), result->bytes_fetched());
  EXPECT_EQ(result->peer_faults_size(), 0);
  ASSERT_GE(progress.size(), 2u);
  EXPECT_EQ(progress.front().phase(), "manifest");
  EXPECT_EQ(progress.back().chunks_done(), total_chunks_);
  for (const auto& p : progress) EXPECT_FALSE(p.done());
  for (size_t i = 1; i < progress.size(); ++i) {
    EXPECT_GE(progress[i].bytes_done(), progress[i - 1].bytes_done());
  }
  EXPECT_TRUE(HasComplete(d));
  ExpectIdentical(d, "out");

  // Again: everything is present, nothing is transferred.
  auto again = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->chunks_present(), total_chunks_);
  EXPECT_EQ(again->chunks_fetched(), 0u);
}

// Counts what the services tell it (sidecar/artifacts/transfer_observer.h).
class CountingObserver final : public TransferObserver {
 public:
  void ChunkServed(const std::string& peer, std::string_view way, uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    served_[peer + "/" + std::string(way)] += bytes;
  }
  void TransferStarted(std::string_view) override {}
  void TransferEnded(std::string_view, double, const pb::ArtifactProgress*) override {}
  uint64_t Served(const std::string& peer, std::string_view way) {
    absl::MutexLock lock(&mu_);
    return served_[peer + "/" + std::string(way)];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, uint64_t> served_ ABSL_GUARDED_BY(mu_);
};

// Every chunk byte a fetch received, the serving host's observer saw leave, named by the
// fetching member, on whichever way it went.
TEST_F(TransferTest, TheServingHostCountsEveryByteByPeerAndWay) {
  for (const bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "chunk stream" : "GetChunks");
    CountingObserver observer;
    Host* server = AddHost(stream ? "s1" : "s2", stream ? 0x21 : 0x22);
    ASSERT_TRUE(FetchArtifact(ContextFor(server), RequestFor({publisher_->AsPeer()})).ok());
    TransferServiceOptions options;
    options.observer = &observer;
    server->Serve(&directory_, options, stream);
    UpdateDirectory();
    Host* reader = AddHost(stream ? "r1" : "r2", stream ? 0x31 : 0x32);
    auto result = FetchArtifact(ContextFor(reader), RequestFor({server->AsPeer()}));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(observer.Served(reader->address, stream ? kServedOverChunkStream : kServedOverGrpc),
              result->bytes_fetched());
    EXPECT_GT(result->bytes_fetched(), 0u);
  }
}

TEST_F(TransferTest, FetchFromThreePeersUsesEach) {
  Host* b = AddCopy("b", 0x0b);
  Host* c = AddCopy("c", 0x0c);
  Host* d = AddHost("d", 0x0d);
  FetcherOptions options;
  options.chunks_per_request = 1;
  auto result = FetchArtifact(
      ContextFor(d), RequestFor({publisher_->AsPeer(), b->AsPeer(), c->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  uint64_t sum = 0;
  for (const Host* h : {static_cast<const Host*>(publisher_), static_cast<const Host*>(b),
                        static_cast<const Host*>(c)}) {
    ASSERT_TRUE(result->bytes_by_peer().contains(h->address));
    EXPECT_GT(result->bytes_by_peer().at(h->address), 0u) << h->address;
    sum += result->bytes_by_peer().at(h->address);
  }
  EXPECT_EQ(sum, result->bytes_fetched());
  EXPECT_EQ(result->peer_faults_size(), 0);
  ExpectIdentical(d, "out");
}

// With batches so large that one peer's streams could claim the whole artifact at once, the
// batches shrink to a share of the queue, so every peer serves part of it.
TEST_F(TransferTest, LargeBatchesShareASmallArtifact) {
  Host* b = AddCopy("b", 0x0b);
  Host* c = AddCopy("c", 0x0c);
  Host* d = AddHost("d", 0x0d);
  FetcherOptions options;
  options.chunks_per_request = 64;
  ASSERT_GE(static_cast<uint32_t>(options.chunks_per_request) *
                static_cast<uint32_t>(options.streams_per_peer),
            total_chunks_);
  auto result = FetchArtifact(
      ContextFor(d), RequestFor({publisher_->AsPeer(), b->AsPeer(), c->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  for (const Host* h : {static_cast<const Host*>(publisher_), static_cast<const Host*>(b),
                        static_cast<const Host*>(c)}) {
    EXPECT_GT(result->bytes_by_peer().at(h->address), 0u) << h->address;
  }
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, TamperedPeerReportedAndAvoided) {
  Host* t = AddCopy("t", 0x0e);
  // Flip a byte in every chunk file of t: each still has the right size, none the right hash.
  int tampered = 0;
  for (const auto& entry : fs::recursive_directory_iterator(t->dir / "store" / "chunks")) {
    if (!entry.is_regular_file()) continue;
    fs::permissions(entry.path(), fs::perms::owner_read | fs::perms::owner_write);
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    char byte = 0;
    f.seekg(0);
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    f.seekp(0);
    f.write(&byte, 1);
    ASSERT_TRUE(f.good());
    ++tampered;
  }
  ASSERT_EQ(tampered, static_cast<int>(total_chunks_));

  Host* d = AddHost("d", 0x0d);
  FetcherOptions options;
  options.chunks_per_request = 1;
  // The tampered peer first, so it is given chunks before the honest one can take them all.
  auto result =
      FetchArtifact(ContextFor(d), RequestFor({t->AsPeer(), publisher_->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->peer_faults_size(), 1);
  EXPECT_EQ(result->peer_faults(0).peer(), t->address);
  EXPECT_TRUE(result->peer_faults(0).corrupt());
  EXPECT_THAT(result->peer_faults(0).reason(), HasSubstr("failed verification"));
  EXPECT_EQ(result->bytes_by_peer().at(t->address), 0u);
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, AllPeersDeadThenResume) {
  Host* d = AddHost("d", 0x0d);
  Host* e = AddHost("e", 0x1e);  // a member that never comes up
  const FetchPeer dead_a{publisher_->address, DeadEndpoint()};
  const FetchPeer dead_e{e->address, DeadEndpoint()};

  // Nothing held yet: no manifest from anyone.
  auto result = FetchArtifact(ContextFor(d), RequestFor({dead_a, dead_e}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(publisher_->address));
  EXPECT_THAT(result.status().message(), HasSubstr(e->address));
  EXPECT_FALSE(HasComplete(d));

  // Part of it from a peer that serves one chunk per call and ends early, then is dropped.
  ScriptedPeer partial(publisher_->store.get(), ScriptedPeer::Mode::kShort);
  Server partial_server = StartServer(&partial);
  FetcherOptions options;
  options.streams_per_peer = 1;
  options.streams_target = 1;
  options.chunks_per_request = 4;
  result =
      FetchArtifact(ContextFor(d),
                    RequestFor({FetchPeer{publisher_->address, partial_server.endpoint}}), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("stream ended after 1 of 4 chunks"));
  const int held = partial.chunks_served();
  EXPECT_EQ(held, 2);  // two calls: the first failure is retried, the second drops it
  EXPECT_FALSE(HasComplete(d));
  partial_server.server->Shutdown();

  // Every peer down: the manifest is held locally, the chunks cannot be had.
  result = FetchArtifact(ContextFor(d), RequestFor({dead_a, dead_e}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("no peer left"));
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(publisher_->address, ": ")));
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(e->address, ": ")));
  EXPECT_FALSE(HasComplete(d));

  // A peer comes back: only the missing chunks are asked for.
  ScriptedPeer counting(publisher_->store.get(), ScriptedPeer::Mode::kHonest);
  Server counting_server = StartServer(&counting);
  result = FetchArtifact(ContextFor(d),
                         RequestFor({FetchPeer{publisher_->address, counting_server.endpoint}}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_present(), static_cast<uint32_t>(held));
  EXPECT_EQ(result->chunks_fetched(), total_chunks_ - held);
  EXPECT_EQ(counting.chunks_served(), static_cast<int>(total_chunks_) - held);
  counting_server.server->Shutdown();
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, CancelThenResume) {
  ScriptedPeer slow(publisher_->store.get(), ScriptedPeer::Mode::kHonest);
  slow.set_delay_ms(5);
  Server slow_server = StartServer(&slow);
  Host* d = AddHost("d", 0x0d);
  std::atomic<uint32_t> seen{0};
  FetchContext context = ContextFor(d);
  context.progress = [&](const pb::ArtifactProgress& p) { seen = p.chunks_fetched(); };
  context.cancelled = [&] { return seen.load() >= 5; };
  FetcherOptions options;
  options.chunks_per_request = 2;
  // Two streams, so the slow peer takes long enough for the cancel to land mid-way.
  options.streams_target = 1;
  auto result = FetchArtifact(
      context, RequestFor({FetchPeer{publisher_->address, slow_server.endpoint}}), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(result.status().message(), HasSubstr("resumable"));
  EXPECT_FALSE(HasComplete(d));
  // Let the server notice the cancelled calls (as many as the fetch had streams) before counting
  // what it sent: wait until the count holds still for 300 ms.
  int first = slow.chunks_served();
  for (int quiet_ms = 0, waited_ms = 0; quiet_ms < 300 && waited_ms < 5000; waited_ms += 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int now = slow.chunks_served();
    quiet_ms = now == first ? quiet_ms + 50 : 0;
    first = now;
  }
  EXPECT_GE(first, 5);
  EXPECT_LT(first, static_cast<int>(total_chunks_));

  slow.set_delay_ms(0);
  auto resumed = FetchArtifact(ContextFor(d),
                               RequestFor({FetchPeer{publisher_->address, slow_server.endpoint}}));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->chunks_present() + resumed->chunks_fetched(), total_chunks_);
  EXPECT_GT(resumed->chunks_present(), 0u);
  // Only what was missing went over the wire again (a chunk in flight at the cancel may have
  // been sent and not stored).
  EXPECT_EQ(static_cast<uint32_t>(slow.chunks_served() - first), resumed->chunks_fetched());
  EXPECT_LE(resumed->chunks_present(), static_cast<uint32_t>(first));
  slow_server.server->Shutdown();
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, PublisherNotAMemberRefused) {
  Host* outsider = AddHost("x", 0x2a, /*member=*/false);
  MakeSource(tmp_.path() / "outsider", /*seed=*/7);
  PublishOptions options;
  options.source_dir = (tmp_.path() / "outsider").string();
  options.chunk_size = kChunk;
  auto published = outsider->store->Publish(options, outsider->key, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  // Served by a member (who does not check what it relays).
  ScriptedPeer relay(outsider->store.get(), ScriptedPeer::Mode::kHonest);
  Server relay_server = StartServer(&relay);
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(
      ContextFor(d),
      RequestFor({FetchPeer{publisher_->address, relay_server.endpoint}}, published->id));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(result.status().message(),
              HasSubstr(absl::StrCat("host ", outsider->address, " is not a member")));
  EXPECT_EQ(relay.calls(), 0);
  auto list = d->store->List(/*include_incomplete=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  relay_server.server->Shutdown();
}

TEST_F(TransferTest, OverQuotaFetchRefused) {
  Host* small = AddHost("s", 0x1f, /*member=*/true, StoreQuota{64 << 10, 1000});
  auto result = FetchArtifact(ContextFor(small), RequestFor({publisher_->AsPeer()}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  auto list = small->store->List(/*include_incomplete=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  EXPECT_EQ(small->store->Usage().files, 0u);
}

TEST_F(TransferTest, BadRequestsRefused) {
  Host* d = AddHost("d", 0x0d);
  auto r = FetchArtifact(ContextFor(d), RequestFor({}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "peers: empty");
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}, "short"));
  EXPECT_EQ(r.status().message(), "artifact_id: 5 bytes, want 32");
  r = FetchArtifact(ContextFor(d), RequestFor({FetchPeer{d->address, "127.0.0.1:1"}}));
  EXPECT_THAT(r.status().message(), HasSubstr("is this host"));
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer(), publisher_->AsPeer()}));
  EXPECT_THAT(r.status().message(), HasSubstr("listed twice"));
  FetchRequest other_shard = RequestFor({publisher_->AsPeer()});
  other_shard.shard_id = 2;
  r = FetchArtifact(ContextFor(d), other_shard);
  EXPECT_EQ(r.status().message(), "shard_id: 2 is not the store's shard 1");
  FetcherOptions options;
  options.chunks_per_request = 257;
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}), options);
  EXPECT_THAT(r.status().message(), HasSubstr("options.chunks_per_request: 257"));
  // The artifact id nobody has.
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}, std::string(32, 'z')));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(publisher_->address));
}

// ---------------------------------------------------------------------------------------------
// Misbehaving peers

class MisbehavingPeerTest : public TransferTest {
 protected:
  // Fetches with `mode` as the only peer; returns the result.
  absl::StatusOr<pb::ArtifactProgress> FetchFrom(ScriptedPeer::Mode mode, Host* fetcher,
                                                 std::string other_id = "") {
    ScriptedPeer peer(publisher_->store.get(), mode);
    peer.set_other_artifact(std::move(other_id));
    Server server = StartServer(&peer);
    FetcherOptions options;
    options.chunks_per_request = 4;
    auto result = FetchArtifact(ContextFor(fetcher),
                                RequestFor({FetchPeer{bad_address_, server.endpoint}}), options);
    server.server->Shutdown();
    return result;
  }

  // Nothing unverified was stored: whatever the fetcher holds verifies.
  void ExpectNothingCorrupt(Host* host) {
    auto verify = host->store->Verify();
    ASSERT_TRUE(verify.ok()) << verify.status();
    EXPECT_EQ(verify->modified_size(), 0);
    EXPECT_FALSE(HasComplete(host));
  }

  // After the bad peer, the publisher completes the fetch.
  void ExpectHonestCompletes(Host* host) {
    auto result = FetchArtifact(ContextFor(host), RequestFor({publisher_->AsPeer()}));
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectIdentical(host, "out");
  }

  const std::string bad_address_ = AddressOf(KeyOf(0x3b));
};

TEST_F(MisbehavingPeerTest, WrongManifest) {
  const std::string other = PublishOther();
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kWrongManifest, d, other);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
  EXPECT_THAT(result.status().message(), HasSubstr("bad manifest"));
  auto list = d->store->List(/*include_incomplete=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());

  // With an honest peer beside it, the fetch goes on and the bad one is reported.
  ScriptedPeer bad(publisher_->store.get(), ScriptedPeer::Mode::kWrongManifest);
  bad.set_other_artifact(other);
  Server server = StartServer(&bad);
  auto both = FetchArtifact(
      ContextFor(d), RequestFor({FetchPeer{bad_address_, server.endpoint}, publisher_->AsPeer()}));
  server.server->Shutdown();
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->peer_faults_size(), 1);
  EXPECT_EQ(both->peer_faults(0).peer(), bad_address_);
  EXPECT_TRUE(both->peer_faults(0).corrupt());
  EXPECT_EQ(bad.calls(), 0);  // dropped: never asked for chunks
  ExpectIdentical(d, "out");
}

TEST_F(MisbehavingPeerTest, OversizeManifestRefusedByTheChannel) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kOversizeManifest, d);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
  EXPECT_THAT(result.status().message(), HasSubstr("RESOURCE_EXHAUSTED"));
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, LargeJunkManifestReachesTheChecks) {
  // Above the chunk cap, below the manifest cap: the channel lets it through and the manifest
  // checks refuse it.
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kJunkManifest, d);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("bad manifest"));
  EXPECT_THAT(result.status().message(), Not(HasSubstr("larger than max")));
}

TEST_F(MisbehavingPeerTest, ChunksOutOfOrder) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kReverse, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(bad_address_, " (corrupt)")));
  EXPECT_THAT(result.status().message(), HasSubstr("out of order or not requested"));
  ExpectNothingCorrupt(d);
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, UnrequestedChunk) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kUnrequested, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(bad_address_, " (corrupt)")));
  EXPECT_THAT(result.status().message(), HasSubstr("out of order or not requested"));
  ExpectNothingCorrupt(d);
  auto verify = d->store->Verify();
  ASSERT_TRUE(verify.ok());
  EXPECT_EQ(d->store->Usage().files, 0u);  // the unrequested chunk was not stored
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, ExtraChunk) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kExtra, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("sent more than the 4 chunks asked for"));
  ExpectNothingCorrupt(d);
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, OversizeChunkRefusedByTheChannel) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kOversizeChunk, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
  EXPECT_THAT(result.status().message(), HasSubstr("resource exhausted"));
  EXPECT_EQ(d->store->Usage().files, 0u);
  ExpectNothingCorrupt(d);
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, DataLossStatusMarksCorrupt) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kDataLoss, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(bad_address_, " (corrupt)")));
  EXPECT_THAT(result.status().message(), HasSubstr("chunk file damaged"));
  ExpectHonestCompletes(d);
}

// ---------------------------------------------------------------------------------------------
// Attacks on the real service

class ServiceAttackTest : public TransferTest {
 protected:
  void SetUp() override {
    TransferTest::SetUp();
    if (HasFatalFailure()) return;
    member_ = AddHost("m", 0x4d);
    UpdateDirectory();
    stub_ = pb::ArtifactTransfer::NewStub(
        grpc::CreateChannel(publisher_->server.endpoint, grpc::InsecureChannelCredentials()));
    auto manifest = publisher_->store->GetManifest(id_, true);
    ASSERT_TRUE(manifest.ok());
    for (const auto& file : manifest->body.files()) {
      for (const auto& h : file.chunks()) chunks_.push_back(h);
    }
  }

  pb::GetManifestRequest ManifestRequest(uint64_t shard = kShard) {
    pb::GetManifestRequest request;
    request.set_shard_id(shard);
    request.set_artifact_id(id_);
    return request;
  }

  pb::GetChunksRequest ChunksRequest(size_t n) {
    pb::GetChunksRequest request;
    request.set_shard_id(kShard);
    request.set_artifact_id(id_);
    for (size_t i = 0; i < n; ++i) request.add_chunks(chunks_[i]);
    return request;
  }

  grpc::Status CallManifest(const pb::GetManifestRequest& request,
                            pb::GetManifestResponse* response = nullptr) {
    pb::GetManifestResponse unused;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->GetManifest(&context, request, response ? response : &unused);
  }

  grpc::Status CallChunks(const pb::GetChunksRequest& request,
                          std::vector<pb::ChunkData>* out = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub_->GetChunks(&context, request);
    pb::ChunkData chunk;
    while (reader->Read(&chunk)) {
      if (out) out->push_back(chunk);
    }
    return reader->Finish();
  }

  Host* member_ = nullptr;
  std::unique_ptr<pb::ArtifactTransfer::Stub> stub_;
  std::vector<std::string> chunks_;
};

TEST_F(ServiceAttackTest, SignedMemberRequestsServed) {
  pb::GetManifestRequest request = ManifestRequest();
  Sign(&request, member_->key, kMethodGetManifest);
  pb::GetManifestResponse response;
  grpc::Status status = CallManifest(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  auto verified = VerifyManifest(response.manifest(), kChain, kShard, id_);
  EXPECT_TRUE(verified.ok()) << verified.status();

  pb::GetChunksRequest chunks = ChunksRequest(3);
  Sign(&chunks, member_->key, kMethodGetChunks);
  std::vector<pb::ChunkData> got;
  status = CallChunks(chunks, &got);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].hash(), chunks_[i]);
    EXPECT_EQ(common::Sha256(got[i].data()), chunks_[i]);
  }

  pb::ListArtifactsRequest list;
  list.set_shard_id(kShard);
  Sign(&list, member_->key, kMethodListArtifacts);
  pb::ListArtifactsResponse listed;
  grpc::ClientContext context;
  status = stub_->ListArtifacts(&context, list, &listed);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(listed.artifacts_size(), 1);
  EXPECT_EQ(listed.artifacts(0).artifact_id(), id_);
  EXPECT_TRUE(listed.artifacts(0).complete());
}

// Answers are encoded by hand around the chunk files' bytes; the generated parser reads them,
// whatever the width of the data's length (1, 2 and 3 byte varints here).
TEST_F(ServiceAttackTest, HandEncodedAnswersParseAsChunkData) {
  std::mt19937_64 rng(7);
  WriteFile(tmp_.path() / "sizes" / "big.bin", RandomBytes(rng, (1u << 20) + 100));
  WriteFile(tmp_.path() / "sizes" / "small.bin", RandomBytes(rng, 200));
  PublishOptions options;
  options.source_dir = (tmp_.path() / "sizes").string();
  options.chunk_size = 1u << 20;
  auto published = publisher_->store->Publish(options, publisher_->key, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  pb::GetChunksRequest request;
  request.set_shard_id(kShard);
  request.set_artifact_id(published->id);
  std::vector<uint64_t> sizes;
  for (const auto& file : published->body.files()) {
    uint64_t left = file.size();
    for (const auto& hash : file.chunks()) {
      request.add_chunks(hash);
      sizes.push_back(std::min<uint64_t>(left, options.chunk_size));
      left -= sizes.back();
    }
  }
  ASSERT_EQ(request.chunks_size(), 3);
  Sign(&request, member_->key, kMethodGetChunks);
  std::vector<pb::ChunkData> got;
  grpc::Status status = CallChunks(request, &got);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].hash(), request.chunks(static_cast<int>(i)));
    EXPECT_EQ(got[i].data().size(), sizes[i]);
    EXPECT_EQ(common::Sha256(got[i].data()), got[i].hash());
  }
}

TEST_F(ServiceAttackTest, Unsigned) {
  grpc::Status status = CallManifest(ManifestRequest());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message(), "auth: missing");
  pb::GetChunksRequest chunks = ChunksRequest(1);
  Sign(&chunks, member_->key, kMethodGetChunks);
  chunks.mutable_auth()->clear_signature();
  status = CallChunks(chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message(), "auth.signature: 0 bytes, want 65");
}

TEST_F(ServiceAttackTest, WrongAudience) {
  pb::GetManifestRequest request = ManifestRequest();
  Sign(&request, member_->key, kMethodGetManifest, /*audience=*/member_->address);
  grpc::Status status = CallManifest(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(status.error_message(), absl::StrCat("auth.audience: ", member_->address,
                                                 " is not this host (", publisher_->address, ")"));
}

TEST_F(ServiceAttackTest, Expired) {
  pb::GetManifestRequest request = ManifestRequest();
  Sign(&request, member_->key, kMethodGetManifest, "", Clock()->NowUnixMs() - 40000, 30000);
  grpc::Status status = CallManifest(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("auth.expires_unix_ms: "));
  EXPECT_THAT(status.error_message(), HasSubstr("is in the past"));
}

TEST_F(ServiceAttackTest, IssuedBeforeTheServerStarted) {
  pb::GetManifestRequest request = ManifestRequest();
  Sign(&request, member_->key, kMethodGetManifest, "", Clock()->NowUnixMs() - 60000, 90000);
  grpc::Status status = CallManifest(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("auth.issued_unix_ms: "));
  EXPECT_THAT(status.error_message(), HasSubstr("before this host started"));
}

TEST_F(ServiceAttackTest, Replayed) {
  pb::GetChunksRequest request = ChunksRequest(2);
  Sign(&request, member_->key, kMethodGetChunks);
  std::vector<pb::ChunkData> got;
  ASSERT_TRUE(CallChunks(request, &got).ok());
  EXPECT_EQ(got.size(), 2u);
  got.clear();
  grpc::Status status = CallChunks(request, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message(), "auth.nonce: replayed");
  EXPECT_TRUE(got.empty());
}

TEST_F(ServiceAttackTest, NonMember) {
  const common::PrivateKey stranger = KeyOf(0x5c);
  pb::GetManifestRequest request = ManifestRequest();
  Sign(&request, stranger, kMethodGetManifest);
  grpc::Status status = CallManifest(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(status.error_message(),
            absl::StrCat(AddressOf(stranger), " is neither a member nor a reader of shard 1"));
  pb::GetChunksRequest chunks = ChunksRequest(1);
  Sign(&chunks, stranger, kMethodGetChunks);
  EXPECT_EQ(CallChunks(chunks).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// The shard's creator and the readers its spec names fetch its checkpoints without being
// members — the whole fetch, over the chunk stream — and see nothing else; everyone else is still
// refused.
TEST_F(ServiceAttackTest, ReadersFetchCheckpointsOnly) {
  Host* creator = AddHost("creator", 0x6c, /*member=*/false);
  Host* reader = AddHost("reader", 0x6d, /*member=*/false);
  creator_ = creator->address;
  readers_ = {reader->address};
  UpdateDirectory();
  const std::string dataset = PublishOther("dataset");

  for (Host* who : {creator, reader}) {
    pb::ListArtifactsRequest list;
    list.set_shard_id(kShard);
    Sign(&list, who->key, kMethodListArtifacts);
    pb::ListArtifactsResponse listed;
    grpc::ClientContext context;
    grpc::Status status = stub_->ListArtifacts(&context, list, &listed);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(listed.artifacts_size(), 1) << "a reader sees the checkpoint only";
    EXPECT_EQ(listed.artifacts(0).artifact_id(), id_);

    pb::GetManifestRequest other = ManifestRequest();
    other.set_artifact_id(dataset);
    Sign(&other, who->key, kMethodGetManifest);
    grpc::Status refused = CallManifest(other);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(refused.error_message(),
                HasSubstr("is a dataset; a reader of the shard may fetch checkpoints only"));
    pb::GetChunksRequest other_chunks;
    other_chunks.set_shard_id(kShard);
    other_chunks.set_artifact_id(dataset);
    auto manifest = publisher_->store->GetManifest(dataset, true);
    ASSERT_TRUE(manifest.ok());
    other_chunks.add_chunks(manifest->body.files(0).chunks(0));
    Sign(&other_chunks, who->key, kMethodGetChunks);
    EXPECT_EQ(CallChunks(other_chunks).error_code(), grpc::StatusCode::PERMISSION_DENIED);

    auto fetched = FetchArtifact(ContextFor(who), RequestFor({publisher_->AsPeer()}));
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    ExpectIdentical(who, "out-" + who->address);
  }

  // A reader of another shard is nobody here.
  readers_.clear();
  UpdateDirectory();
  pb::GetManifestRequest request = ManifestRequest();
  Sign(&request, reader->key, kMethodGetManifest);
  EXPECT_EQ(CallManifest(request).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(ServiceAttackTest, BodyTamperedAfterSigning) {
  pb::GetChunksRequest request = ChunksRequest(1);
  Sign(&request, member_->key, kMethodGetChunks);
  request.set_chunks(0, chunks_[5]);
  grpc::Status status = CallChunks(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(), HasSubstr("auth.signature: signed by gonka1"));
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat("not auth.signer ", member_->address)));
  // A signature made for another method does not pass either.
  pb::GetManifestRequest manifest = ManifestRequest();
  Sign(&manifest, member_->key, kMethodGetChunks);
  EXPECT_EQ(CallManifest(manifest).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(ServiceAttackTest, TooManyChunks) {
  pb::GetChunksRequest request = ChunksRequest(0);
  for (int i = 0; i < 257; ++i) request.add_chunks(common::Sha256(std::to_string(i)));
  Sign(&request, member_->key, kMethodGetChunks);
  grpc::Status status = CallChunks(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "chunks: 257 hashes, at most 256 per request");
}

TEST_F(ServiceAttackTest, ChunkNotInTheManifest) {
  pb::GetChunksRequest request = ChunksRequest(1);
  const std::string stranger = common::Sha256("not in the manifest");
  request.add_chunks(stranger);
  Sign(&request, member_->key, kMethodGetChunks);
  std::vector<pb::ChunkData> got;
  grpc::Status status = CallChunks(request, &got);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), absl::StrCat("chunks[1]: ", Hex(stranger),
                                                 " is not named by the manifest of ", Hex(id_)));
  EXPECT_TRUE(got.empty());  // refused before anything is sent

  // A chunk of another artifact held here is not served under this one's id either.
  const std::string other = PublishOther();
  auto manifest = publisher_->store->GetManifest(other, true);
  ASSERT_TRUE(manifest.ok());
  pb::GetChunksRequest cross = ChunksRequest(0);
  cross.add_chunks(manifest->body.files(0).chunks(0));
  Sign(&cross, member_->key, kMethodGetChunks);
  EXPECT_EQ(CallChunks(cross).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServiceAttackTest, AnotherShard) {
  pb::GetManifestRequest request = ManifestRequest(/*shard=*/2);
  Sign(&request, member_->key, kMethodGetManifest);
  grpc::Status status = CallManifest(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "shard 2: not found");
  // Signed for shard 1, then relabelled.
  pb::GetManifestRequest relabelled = ManifestRequest();
  Sign(&relabelled, member_->key, kMethodGetManifest);
  relabelled.set_shard_id(2);
  EXPECT_EQ(CallManifest(relabelled).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // A shard this member belongs to but this host holds no store for.
  ShardView view;
  view.shard_id = 2;
  view.status = pb::SHARD_STATUS_RUNNING;
  view.members.push_back(ShardMember{member_->address, "", 1});
  directory_.Set(view);
  Sign(&request, member_->key, kMethodGetManifest);
  status = CallManifest(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "no store for shard 2");
}

TEST_F(ServiceAttackTest, BadIdsAndUnknownArtifacts) {
  pb::GetManifestRequest request = ManifestRequest();
  request.set_artifact_id("abc");
  Sign(&request, member_->key, kMethodGetManifest);
  grpc::Status status = CallManifest(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "artifact_id: 3 bytes, want 32");
  request.set_artifact_id(std::string(32, 'q'));
  Sign(&request, member_->key, kMethodGetManifest);
  EXPECT_EQ(CallManifest(request).error_code(), grpc::StatusCode::NOT_FOUND);
  pb::GetChunksRequest chunks = ChunksRequest(1);
  chunks.set_chunks(0, "short");
  Sign(&chunks, member_->key, kMethodGetChunks);
  status = CallChunks(chunks);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "chunks[0]: 5 bytes, want 32");
  pb::GetChunksRequest none = ChunksRequest(0);
  Sign(&none, member_->key, kMethodGetChunks);
  EXPECT_EQ(CallChunks(none).error_message(), "chunks: empty");
}

TEST_F(ServiceAttackTest, IncompleteArtifactsAreNotServed) {
  // member_ begins a fetch and stops: its row is incomplete, and so not offered to peers.
  ScriptedPeer partial(publisher_->store.get(), ScriptedPeer::Mode::kShort);
  Server partial_server = StartServer(&partial);
  FetcherOptions options;
  options.max_call_failures_per_peer = 1;
  auto result =
      FetchArtifact(ContextFor(member_),
                    RequestFor({FetchPeer{publisher_->address, partial_server.endpoint}}), options);
  partial_server.server->Shutdown();
  ASSERT_FALSE(result.ok());
  member_->Serve(&directory_);
  UpdateDirectory();
  auto stub = pb::ArtifactTransfer::NewStub(
      grpc::CreateChannel(member_->server.endpoint, grpc::InsecureChannelCredentials()));
  pb::GetManifestRequest request = ManifestRequest();
  Sign(&request, publisher_->key, kMethodGetManifest, member_->address);
  pb::GetManifestResponse response;
  grpc::ClientContext context;
  grpc::Status status = stub->GetManifest(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// The nonce-table lockout of the "Harden the host" issue, on a small table: validly signed
// requests of a host outside the shard, and of keys of no account at all, used to take places
// in the table before membership was asked, until members were refused RESOURCE_EXHAUSTED (and
// a refused request, sent again, came back "replayed"). Now refused requests keep nothing.
TEST_F(ServiceAttackTest, OutsidersCannotCrowdMembersOut) {
  PeerAuthOptions auth_options;
  auth_options.max_nonces = 16;
  PeerRequestVerifier verifier(publisher_->address, kChain, Clock(), auth_options);
  ArtifactTransferService service(publisher_->registry.get(), &directory_, &verifier);
  Server server = StartServer(&service);
  auto stub = pb::ArtifactTransfer::NewStub(
      grpc::CreateChannel(server.endpoint, grpc::InsecureChannelCredentials()));
  auto call = [&](const pb::GetManifestRequest& request) {
    pb::GetManifestResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->GetManifest(&context, request, &response);
  };
  const common::PrivateKey outsider = KeyOf(0x5c);  // an account, not a member
  pb::GetManifestRequest first = ManifestRequest();
  Sign(&first, outsider, kMethodGetManifest);
  for (int i = 0; i < 64; ++i) {
    pb::GetManifestRequest request = ManifestRequest();
    // Every other one from a key of no account at all, a new one each time.
    Sign(&request, i % 2 == 0 ? outsider : KeyOf(static_cast<char>(0x60 + i / 2)),
         kMethodGetManifest);
    grpc::Status status = call(request);
    ASSERT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  }
  for (int i = 0; i < 2; ++i) {
    grpc::Status again = call(first);
    EXPECT_EQ(again.error_code(), grpc::StatusCode::PERMISSION_DENIED) << again.error_message();
    EXPECT_THAT(again.error_message(), HasSubstr("is neither a member nor a reader of shard"));
  }
  // The member has the whole table.
  for (size_t i = 0; i < auth_options.max_nonces; ++i) {
    pb::GetManifestRequest request = ManifestRequest();
    Sign(&request, member_->key, kMethodGetManifest);
    grpc::Status status = call(request);
    ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
  }
  server.server->Shutdown();
}

TEST_F(ServiceAttackTest, ConcurrentStreamCap) {
  // A second server on the same store with no stream to give.
  TransferServiceOptions options;
  options.max_concurrent_streams = 0;
  PeerRequestVerifier verifier(publisher_->address, kChain, Clock());
  ArtifactTransferService capped(publisher_->registry.get(), &directory_, &verifier, options);
  Server server = StartServer(&capped);
  auto stub = pb::ArtifactTransfer::NewStub(
      grpc::CreateChannel(server.endpoint, grpc::InsecureChannelCredentials()));
  pb::GetChunksRequest request = ChunksRequest(1);
  Sign(&request, member_->key, kMethodGetChunks);
  grpc::ClientContext context;
  auto reader = stub->GetChunks(&context, request);
  pb::ChunkData chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("streams already running"));
  server.server->Shutdown();

  // With one slot, calls one after another each get it back.
  options.max_concurrent_streams = 1;
  ArtifactTransferService one(publisher_->registry.get(), &directory_, &verifier, options);
  Server one_server = StartServer(&one);
  auto one_stub = pb::ArtifactTransfer::NewStub(
      grpc::CreateChannel(one_server.endpoint, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 3; ++i) {
    pb::GetChunksRequest again = ChunksRequest(2);
    Sign(&again, member_->key, kMethodGetChunks);
    grpc::ClientContext call;
    auto r = one_stub->GetChunks(&call, again);
    int n = 0;
    while (r->Read(&chunk)) ++n;
    grpc::Status s = r->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(n, 2);
  }
  one_server.server->Shutdown();
}

// ---------------------------------------------------------------------------------------------
// Chunk stream

TEST_F(TransferTest, ChunksTravelOverTheStreamUnlessGrpcIsAsked) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), total_chunks_);
  ExpectIdentical(d, "out");

  Host* g = AddHost("g", 0x1f);
  FetcherOptions options;
  options.use_chunk_stream = false;
  result = FetchArtifact(ContextFor(g), RequestFor({publisher_->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), total_chunks_);  // none more
  const fs::path out = tmp_.path() / "out-grpc";
  ASSERT_TRUE(g->store->Export(id_, out.string(), nullptr).ok());
  EXPECT_EQ(Tree(out), Tree(tmp_.path() / "source"));
}

TEST_F(TransferTest, PeerWithoutAStreamServedOverGrpc) {
  Host* c = AddHost("c", 0x0c);
  c->Serve(&directory_, {}, /*stream=*/false);
  UpdateDirectory();
  ASSERT_TRUE(FetchArtifact(ContextFor(c), RequestFor({publisher_->AsPeer()})).ok());
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(ContextFor(d), RequestFor({c->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes_by_peer().at(c->address), result->bytes_fetched());
  ExpectIdentical(d, "out");
}

// A peer whose chunk stream refuses every connection (reset at once, or answered with an error
// frame) is fetched from over GetChunks instead of being dropped, and the fallback is reported.
TEST_F(TransferTest, FetchFallsBackToGrpcWhenTheStreamRefuses) {
  ResettingListener resetter;
  Host* c = AddHost("c", 0x0c);
  ASSERT_TRUE(FetchArtifact(ContextFor(c), RequestFor({publisher_->AsPeer()})).ok());
  TransferServiceOptions announce_resetter;
  announce_resetter.chunk_stream_port = resetter.port();
  c->Serve(&directory_, announce_resetter, /*stream=*/false);
  UpdateDirectory();
  Host* d = AddHost("d", 0x0d);
  std::vector<pb::ArtifactProgress> progress;
  FetchContext context = ContextFor(d);
  context.progress = [&](const pb::ArtifactProgress& p) { progress.push_back(p); };
  auto result = FetchArtifact(context, RequestFor({c->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  EXPECT_EQ(result->bytes_by_peer().at(c->address), result->bytes_fetched());
  EXPECT_EQ(result->peer_faults_size(), 0);
  ASSERT_EQ(result->stream_fallbacks_size(), 1);
  EXPECT_EQ(result->stream_fallbacks(0).peer(), c->address);
  EXPECT_THAT(result->stream_fallbacks(0).reason(), HasSubstr("unavailable: chunk stream"));
  EXPECT_FALSE(result->stream_fallbacks(0).corrupt());
  // Reported while the fetch ran, not only at its end; and the stream was left alone after
  // the first attempts (one per stream thread at most).
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().stream_fallbacks_size(), 1);
  EXPECT_GE(resetter.accepted(), 1);
  EXPECT_LE(resetter.accepted(), 4);
  ExpectIdentical(d, "out");

  // A stream that refuses with an error frame (no thread free to serve): the same.
  Host* e = AddHost("e", 0x1e);
  ASSERT_TRUE(FetchArtifact(ContextFor(e), RequestFor({publisher_->AsPeer()})).ok());
  ChunkStreamServerOptions no_thread;
  no_thread.max_connections = 0;
  e->Serve(&directory_, {}, /*stream=*/true, no_thread);
  UpdateDirectory();
  Host* g = AddHost("g", 0x1f);
  result = FetchArtifact(ContextFor(g), RequestFor({e->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->stream_fallbacks_size(), 1);
  EXPECT_THAT(result->stream_fallbacks(0).reason(), HasSubstr("resource exhausted"));
  EXPECT_EQ(e->chunk_stream->chunks_sent(), 0u);
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
}

// The issue's chunk-stream attack end to end: with more idle connections on the publisher's
// chunk stream port than the old bound of 64, a member's default fetch goes through, over the
// stream itself.
TEST_F(TransferTest, FetchSucceedsWhileIdleConnectionsHoldTheStreamPort) {
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(ConnectTo(publisher_->chunk_stream->port()));
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->peer_faults_size(), 0);
  EXPECT_EQ(result->stream_fallbacks_size(), 0);
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), total_chunks_);
  ExpectIdentical(d, "out");
  for (int fd : idle) ::close(fd);
}

class ChunkStreamAttackTest : public TransferTest {
 protected:
  void SetUp() override {
    TransferTest::SetUp();
    if (HasFatalFailure()) return;
    member_ = AddHost("m", 0x4d);
    auto manifest = publisher_->store->GetManifest(id_, true);
    ASSERT_TRUE(manifest.ok());
    for (const auto& file : manifest->body.files()) {
      for (const auto& h : file.chunks()) chunks_.push_back(h);
    }
  }

  pb::GetChunksRequest Request(size_t n, const common::PrivateKey& key,
                               std::string_view method = kMethodChunkStream,
                               std::string audience = "") {
    pb::GetChunksRequest request;
    request.set_shard_id(kShard);
    request.set_artifact_id(id_);
    for (size_t i = 0; i < n; ++i) request.add_chunks(chunks_[i]);
    Sign(&request, key, method, std::move(audience));
    return request;
  }

  // Sends `request` on a new connection; returns the chunks received, or the first failure.
  absl::StatusOr<std::vector<std::string>> Call(const pb::GetChunksRequest& request,
                                                const ChunkStreamTls& tls = {}) {
    ChunkStreamCall call(Clock(), Clock()->MonotonicMs() + 10000);
    TS_RETURN_IF_ERROR(call.Start("127.0.0.1", publisher_->chunk_stream->port(), request, tls));
    std::vector<char> buffer(kMaxChunkSize);
    std::vector<std::string> got;
    while (true) {
      TS_ASSIGN_OR_RETURN(ChunkStreamFrame frame, call.Next(buffer.data(), buffer.size()));
      if (frame.type == ChunkStreamFrameType::kEnd) {
        EXPECT_EQ(frame.index, got.size());
        return got;
      }
      EXPECT_EQ(frame.index, got.size());
      std::string data(buffer.data(), frame.size);
      EXPECT_EQ(common::Sha256(data), frame.hash);
      got.push_back(std::move(data));
    }
  }

  // A plain TCP connection to the publisher's chunk stream; `receive_buffer` > 0 sets SO_RCVBUF
  // before the connect, so the window is that small from the start.
  int RawConnect(int receive_buffer = 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TS_CHECK(fd >= 0);
    if (receive_buffer > 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(publisher_->chunk_stream->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TS_CHECK(::connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
    return fd;
  }

  // Connects and writes raw bytes; returns what the server sent back before closing.
  std::string RawExchange(const std::string& bytes, int64_t wait_ms = 5000) {
    const int fd = RawConnect();
    if (!bytes.empty()) TS_CHECK(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) > 0);
    struct timeval tv = {static_cast<time_t>(wait_ms / 1000),
                         static_cast<suseconds_t>((wait_ms % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return out;
  }

  // The status of the error frame that opens `answer`.
  absl::Status ErrorIn(const std::string& answer) {
    if (answer.size() < kChunkStreamFrameHeaderBytes) {
      return absl::InternalError(absl::StrCat("answer of ", answer.size(), " bytes"));
    }
    auto frame =
        DecodeChunkStreamFrameHeader(answer.substr(0, kChunkStreamFrameHeaderBytes), kMaxChunkSize);
    TS_CHECK(frame.ok() && frame->type == ChunkStreamFrameType::kError);
    return ChunkStreamErrorStatus(*frame, answer.substr(kChunkStreamFrameHeaderBytes));
  }

  Host* member_ = nullptr;
  std::vector<std::string> chunks_;
};

TEST_F(ChunkStreamAttackTest, SignedMemberRequestServedInOrder) {
  auto got = Call(Request(5, member_->key));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(common::Sha256((*got)[i]), chunks_[i]);
}

std::shared_ptr<const common::TlsContext> NewTlsContext() {
  auto identity = common::NewTlsIdentity("gonka1test");
  TS_CHECK(identity.ok());
  auto context = common::TlsContext::New(*identity);
  TS_CHECK(context.ok());
  return *context;
}

// Under TLS the same request is served to a fetcher that pins the server's certificate; a
// fetcher pinning another one, or speaking in the clear, gets no chunk; and a refusal still
// reaches a TLS fetcher, sealed.
TEST_F(ChunkStreamAttackTest, TlsServesThePinnedAndNoOneElse) {
  auto server_tls = NewTlsContext();
  auto client_tls = NewTlsContext();
  publisher_->Stop();
  ChunkStreamServerOptions options;
  options.tls = server_tls;
  publisher_->Serve(&directory_, {}, true, options);

  auto got = Call(Request(5, member_->key), {client_tls, server_tls->cert_sha256()});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(common::Sha256((*got)[i]), chunks_[i]);

  auto impostor = Call(Request(1, member_->key), {client_tls, client_tls->cert_sha256()});
  ASSERT_FALSE(impostor.ok());
  EXPECT_EQ(impostor.status().code(), absl::StatusCode::kUnauthenticated) << impostor.status();
  EXPECT_THAT(std::string(impostor.status().message()),
              ::testing::HasSubstr(common::HexEncode(server_tls->cert_sha256())));

  auto clear = Call(Request(1, member_->key));
  ASSERT_FALSE(clear.ok());
  EXPECT_EQ(clear.status().code(), absl::StatusCode::kUnavailable) << clear.status();

  // A request signed by a non-member: refused by the service, the refusal in a record.
  auto refused = Call(Request(1, KeyOf(0x77)), {client_tls, server_tls->cert_sha256()});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), 5u);
}

TEST_F(ChunkStreamAttackTest, RefusedRequests) {
  pb::GetChunksRequest unsigned_request = Request(1, member_->key);
  unsigned_request.clear_auth();
  EXPECT_EQ(Call(unsigned_request).status().code(), absl::StatusCode::kUnauthenticated);

  // Signed for GetChunks: not valid on the stream.
  auto wrong_method = Call(Request(1, member_->key, kMethodGetChunks));
  EXPECT_EQ(wrong_method.status().code(), absl::StatusCode::kUnauthenticated)
      << wrong_method.status();

  auto wrong_audience = Call(Request(1, member_->key, kMethodChunkStream, member_->address));
  EXPECT_EQ(wrong_audience.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong_audience.status().message(), HasSubstr("auth.audience"));

  pb::GetChunksRequest once = Request(1, member_->key);
  ASSERT_TRUE(Call(once).ok());
  auto replayed = Call(once);
  EXPECT_EQ(replayed.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(replayed.status().message(), HasSubstr("replay"));

  Host* outsider = AddHost("x", 0x2a, /*member=*/false);
  auto non_member = Call(Request(1, outsider->key));
  EXPECT_EQ(non_member.status().code(), absl::StatusCode::kPermissionDenied);

  pb::GetChunksRequest foreign = Request(0, member_->key);
  foreign.add_chunks(std::string(32, 'z'));
  foreign.clear_auth();
  auto auth = SignPeerRequest(member_->key, kChain, kShard, kMethodChunkStream, publisher_->address,
                              foreign, Clock()->NowUnixMs(), 30000);
  ASSERT_TRUE(auth.ok());
  *foreign.mutable_auth() = *auth;
  auto not_named = Call(foreign);
  EXPECT_EQ(not_named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_named.status().message(), HasSubstr("not named by the manifest"));
}

TEST_F(ChunkStreamAttackTest, MalformedRequestsGetAnErrorAndNoChunk) {
  absl::Status garbage = ErrorIn(RawExchange("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.message(), HasSubstr("magic"));

  absl::Status oversize = ErrorIn(RawExchange(EncodeChunkStreamRequestHeader(1u << 30)));
  EXPECT_EQ(oversize.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(oversize.message(), HasSubstr("length 1073741824"));

  absl::Status junk =
      ErrorIn(RawExchange(EncodeChunkStreamRequestHeader(8) + "\xff\xff\xff\xff\xff\xff\xff\xff"));
  EXPECT_EQ(junk.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(junk.message(), HasSubstr("not a GetChunksRequest"));
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), 0u);
}

// A reader that resets the connection while a chunk is on its way: the server's sendfile, which
// has no MSG_NOSIGNAL, meets the reset mid-file. This process does not ignore SIGPIPE (gtest's
// main leaves it as it is), so the test dies if the server lets the signal through; the server
// must go on serving afterwards.
TEST_F(ChunkStreamAttackTest, ReaderThatResetsMidChunkDoesNotKillTheServer) {
  std::mt19937_64 rng(11);
  const fs::path dir = tmp_.path() / "large";
  for (int i = 0; i < 6; ++i) {
    WriteFile(dir / absl::StrCat("f", i, ".bin"), RandomBytes(rng, kMaxChunkSize));
  }
  PublishOptions options;
  options.source_dir = dir.string();
  options.chunk_size = kMaxChunkSize;
  auto published = publisher_->store->Publish(options, publisher_->key, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  pb::GetChunksRequest request;
  request.set_shard_id(kShard);
  request.set_artifact_id(published->id);
  for (const auto& file : published->body.files()) {
    for (const auto& hash : file.chunks()) request.add_chunks(hash);
  }
  Sign(&request, member_->key, kMethodChunkStream);
  const std::string body = request.SerializeAsString();
  const std::string bytes =
      EncodeChunkStreamRequestHeader(static_cast<uint32_t>(body.size())) + body;

  for (int round = 0; round < 5; ++round) {
    const int fd = RawConnect(/*receive_buffer=*/4096);  // the server blocks inside a chunk
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    // Some of the first chunk arrives, then the server is left blocked in the middle of it.
    char buf[4096];
    ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const struct linger reset = {1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    ::close(fd);
  }
  auto got = Call(Request(5, member_->key));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 5u);
}

TEST_F(ChunkStreamAttackTest, SilentConnectionsAreClosedAndMakeRoomForNewOnes) {
  ChunkStreamServerOptions options;
  options.max_pending_connections = 2;
  options.request_deadline_ms = 300;
  publisher_->Stop();
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();

  // A connection that never sends its request is closed after the deadline, nothing sent.
  const int64_t start_ms = Clock()->MonotonicMs();
  EXPECT_EQ(RawExchange(""), "");
  EXPECT_GE(Clock()->MonotonicMs() - start_ms, 250);
  EXPECT_LT(Clock()->MonotonicMs() - start_ms, 4000);

  // Two silent connections fill the pending pool (with a deadline long enough for the check,
  // even on a slow sanitizer build); a third connection takes the place of the older one, which
  // is closed at once with nothing sent, and is served.
  publisher_->Stop();
  options.request_deadline_ms = 5000;
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();
  std::vector<int64_t> held_ms(2, 0);
  std::vector<std::thread> holders;
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([this, i, &held_ms] {
      const int64_t begin = Clock()->MonotonicMs();
      EXPECT_EQ(RawExchange(""), "");
      held_ms[i] = Clock()->MonotonicMs() - begin;
    });
    // One after the other, so which one is older is known.
    for (int w = 0; w < 500 && publisher_->chunk_stream->pending_connections() < size_t(i + 1);
         ++w) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  EXPECT_EQ(publisher_->chunk_stream->pending_connections(), 2u);
  auto got = Call(Request(2, member_->key));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 2u);
  EXPECT_EQ(publisher_->chunk_stream->evictions(), 1u);
  EXPECT_LE(publisher_->chunk_stream->connections(), 2u);
  for (std::thread& t : holders) t.join();
  EXPECT_LT(held_ms[0], 4000);  // evicted for the member's connection
  EXPECT_GE(held_ms[1], 4500);  // kept until its deadline
}

// The chunk-stream lockout of the "Harden the host" issue: more idle connections than the old
// bound of 64 (which closed every further connection at its accept, a member's too). Idle
// connections now only ever evict each other: from the member's own source (above its
// per-source bound) and from many others (above the pool's bound).
TEST_F(ChunkStreamAttackTest, IdleConnectionsCannotKeepAMemberOut) {
  // Bounds as the defaults; a deadline long enough that no idle connection times out during
  // the test (what is checked is who makes room for whom).
  ChunkStreamServerOptions options;
  options.request_deadline_ms = 60000;
  publisher_->Stop();
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(ConnectTo(publisher_->chunk_stream->port()));
  for (int source = 2; source < 12; ++source) {
    for (int i = 0; i < 20; ++i) {
      idle.push_back(ConnectTo(publisher_->chunk_stream->port(), absl::StrCat("127.0.0.", source)));
    }
  }
  const ChunkStreamServerOptions defaults;
  for (int i = 0; i < 500 && publisher_->chunk_stream->evictions() <
                                 idle.size() - defaults.max_pending_connections;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(publisher_->chunk_stream->pending_connections(), defaults.max_pending_connections);
  for (int round = 0; round < 3; ++round) {
    auto got = Call(Request(3, member_->key));
    ASSERT_TRUE(got.ok()) << round << ": " << got.status();
    EXPECT_EQ(got->size(), 3u);
  }
  // From sources that hold nothing: once the pool is full again, the flooders' connections
  // make room. (Each member connection above took the place of one idle connection of its own
  // source and then left the pool, so the pool has room for one before anyone is evicted.)
  const uint64_t evicted = publisher_->chunk_stream->evictions();
  const size_t room =
      defaults.max_pending_connections - publisher_->chunk_stream->pending_connections();
  std::vector<int> newcomers;
  for (size_t i = 0; i <= room; ++i) {
    newcomers.push_back(
        ConnectTo(publisher_->chunk_stream->port(), absl::StrCat("127.0.0.", 100 + i)));
  }
  for (int i = 0; i < 500 && publisher_->chunk_stream->evictions() == evicted; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(publisher_->chunk_stream->evictions(), evicted + 1);
  EXPECT_EQ(publisher_->chunk_stream->pending_connections(), defaults.max_pending_connections);
  for (int fd : newcomers) ::close(fd);
  for (int fd : idle) ::close(fd);
}

// Connections being served are bounded apart from pending ones: a request beyond the bound is
// told so (RESOURCE_EXHAUSTED) rather than left waiting.
TEST_F(ChunkStreamAttackTest, ServingConnectionsAreBoundedApart) {
  ChunkStreamServerOptions options;
  options.max_connections = 1;
  publisher_->Stop();
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();
  // One request of large chunks to a reader that does not read: it holds the only thread.
  std::mt19937_64 rng(12);
  const fs::path dir = tmp_.path() / "large";
  for (int i = 0; i < 4; ++i) {
    WriteFile(dir / absl::StrCat("f", i, ".bin"), RandomBytes(rng, kMaxChunkSize));
  }
  PublishOptions publish;
  publish.source_dir = dir.string();
  publish.chunk_size = kMaxChunkSize;
  auto published = publisher_->store->Publish(publish, publisher_->key, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  pb::GetChunksRequest large;
  large.set_shard_id(kShard);
  large.set_artifact_id(published->id);
  for (const auto& file : published->body.files()) {
    for (const auto& hash : file.chunks()) large.add_chunks(hash);
  }
  Sign(&large, member_->key, kMethodChunkStream);
  const std::string body = large.SerializeAsString();
  const std::string bytes =
      EncodeChunkStreamRequestHeader(static_cast<uint32_t>(body.size())) + body;
  const int slow = RawConnect(/*receive_buffer=*/4096);
  ASSERT_EQ(::send(slow, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  for (int i = 0; i < 500 && publisher_->chunk_stream->serving_connections() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(publisher_->chunk_stream->serving_connections(), 1u);
  auto refused = Call(Request(1, member_->key));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("already being served"));
  ::close(slow);
  for (int i = 0; i < 500 && publisher_->chunk_stream->serving_connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto served = Call(Request(1, member_->key));
  ASSERT_TRUE(served.ok()) << served.status();
}

// A chunk stream peer that misbehaves in one chosen way, behind an honest gRPC service that
// announces it.
class ScriptedStreamPeer final : public pb::ArtifactTransfer::Service {
 public:
  enum class Mode {
    kBadMagic,       // a frame header that is not one
    kWrongPosition,  // the second chunk where the first belongs
    kWrongData,      // the right header, other bytes
    kOversize,       // a chunk larger than the artifact's chunk size
    kCloseMidChunk,  // half a chunk, then the connection closes
    kShortEnd,       // an end frame after fewer chunks than asked for
    kDataLoss,       // an error frame with DATA_LOSS
  };
  ScriptedStreamPeer(ArtifactStore* store, Mode mode) : store_(store), mode_(mode) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TS_CHECK(::bind(listen_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
    TS_CHECK(::listen(listen_, 16) == 0);
    socklen_t len = sizeof(addr);
    TS_CHECK(::getsockname(listen_, reinterpret_cast<struct sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~ScriptedStreamPeer() override {
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  int connections() const { return connections_.load(); }

  grpc::Status GetManifest(grpc::ServerContext*, const pb::GetManifestRequest* request,
                           pb::GetManifestResponse* response) override {
    auto manifest = store_->GetManifest(request->artifact_id(), /*complete_only=*/true);
    if (!manifest.ok()) return ToGrpcStatus(manifest.status());
    *response->mutable_manifest() = manifest->manifest;
    return grpc::Status::OK;
  }
  grpc::Status GetChunkStream(grpc::ServerContext*, const pb::GetChunkStreamRequest*,
                              pb::GetChunkStreamResponse* response) override {
    response->set_port(port_);
    return grpc::Status::OK;
  }

 private:
  void Loop() {
    while (true) {
      int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ++connections_;
      Answer(fd);
      ::close(fd);
    }
  }
  static bool ReadAll(int fd, char* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::recv(fd, out + done, n - done, 0);
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }
  static void Send(int fd, const std::string& bytes) {
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  static std::string Header(uint32_t index, uint32_t size, const std::string& hash) {
    std::string h(kChunkStreamFrameHeaderBytes, '\0');
    EncodeChunkFrameHeader(index, size, hash, h.data());
    return h;
  }
  void Answer(int fd) {
    char header[kChunkStreamRequestHeaderBytes];
    if (!ReadAll(fd, header, sizeof(header))) return;
    auto length = DecodeChunkStreamRequestHeader(std::string_view(header, sizeof(header)), 1 << 16);
    if (!length.ok()) return;
    std::string body(*length, '\0');
    if (!ReadAll(fd, body.data(), body.size())) return;
    pb::GetChunksRequest request;
    if (!request.ParseFromString(body)) return;
    std::vector<std::string> data;
    for (const std::string& hash : request.chunks()) {
      auto chunk = store_->ReadChunk(hash);
      if (!chunk.ok()) return;
      data.push_back(*std::move(chunk));
    }
    const auto& hashes = request.chunks();
    const uint32_t n = static_cast<uint32_t>(hashes.size());
    switch (mode_) {
      case Mode::kBadMagic:
        Send(fd, std::string(kChunkStreamFrameHeaderBytes, 'X'));
        return;
      case Mode::kWrongPosition:
        if (n < 2) break;
        Send(fd, Header(0, static_cast<uint32_t>(data[1].size()), hashes[1]) + data[1]);
        return;
      case Mode::kWrongData: {
        std::string other = data[0];
        other[0] = static_cast<char>(other[0] ^ 1);
        Send(fd, Header(0, static_cast<uint32_t>(other.size()), hashes[0]) + other);
        return;
      }
      case Mode::kOversize:
        Send(fd, Header(0, kChunk + 4096, hashes[0]) + std::string(kChunk + 4096, 'o'));
        return;
      case Mode::kCloseMidChunk:
        Send(fd, Header(0, static_cast<uint32_t>(data[0].size()), hashes[0]) +
                     data[0].substr(0, data[0].size() / 2));
        return;
      case Mode::kShortEnd: {
        std::string end(kChunkStreamFrameHeaderBytes, '\0');
        EncodeEndFrameHeader(n, end.data());
        Send(fd, Header(0, static_cast<uint32_t>(data[0].size()), hashes[0]) + data[0] + end);
        return;
      }
      case Mode::kDataLoss:
        Send(fd, EncodeErrorFrame(absl::DataLossError("chunk file damaged")));
        return;
    }
  }

  ArtifactStore* store_;
  const Mode mode_;
  int listen_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<int> connections_{0};
};

class MisbehavingStreamPeerTest : public TransferTest {
 protected:
  absl::StatusOr<pb::ArtifactProgress> FetchFrom(ScriptedStreamPeer::Mode mode, Host* fetcher) {
    ScriptedStreamPeer peer(publisher_->store.get(), mode);
    Server server = StartServer(&peer);
    FetcherOptions options;
    options.chunks_per_request = 4;
    auto result = FetchArtifact(ContextFor(fetcher),
                                RequestFor({FetchPeer{bad_address_, server.endpoint}}), options);
    server.server->Shutdown();
    return result;
  }

  // The bad peer is dropped (corrupt or not), nothing unverified is stored, and the publisher
  // then completes the fetch.
  void ExpectDropped(ScriptedStreamPeer::Mode mode, bool corrupt, const std::string& reason) {
    Host* d = AddHost(absl::StrCat("d", static_cast<int>(mode)), 0x0d);
    auto result = FetchFrom(mode, d);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
    EXPECT_THAT(result.status().message(), HasSubstr(reason));
    if (corrupt) {
      EXPECT_THAT(result.status().message(), HasSubstr("(corrupt)"));
    } else {
      EXPECT_THAT(result.status().message(), Not(HasSubstr("(corrupt)")));
    }
    auto verify = d->store->Verify();
    ASSERT_TRUE(verify.ok()) << verify.status();
    EXPECT_EQ(verify->modified_size(), 0);
    EXPECT_FALSE(HasComplete(d));
    auto honest = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
    ASSERT_TRUE(honest.ok()) << honest.status();
    ExpectIdentical(d, absl::StrCat("out", static_cast<int>(mode)));
  }

  const std::string bad_address_ = AddressOf(KeyOf(0x3b));
};

TEST_F(MisbehavingStreamPeerTest, BadFrameHeader) {
  ExpectDropped(ScriptedStreamPeer::Mode::kBadMagic, true, "malformed chunk stream frame");
}
TEST_F(MisbehavingStreamPeerTest, WrongPosition) {
  ExpectDropped(ScriptedStreamPeer::Mode::kWrongPosition, true, "sent chunk");
}
TEST_F(MisbehavingStreamPeerTest, WrongData) {
  ExpectDropped(ScriptedStreamPeer::Mode::kWrongData, true, "failed verification");
}
TEST_F(MisbehavingStreamPeerTest, OversizeChunk) {
  ExpectDropped(ScriptedStreamPeer::Mode::kOversize, true, "more than the");
}
TEST_F(MisbehavingStreamPeerTest, ClosedMidChunkIsAFailureNotCorruption) {
  ExpectDropped(ScriptedStreamPeer::Mode::kCloseMidChunk, false, "connection closed");
}
TEST_F(MisbehavingStreamPeerTest, ShortEndFrame) {
  ExpectDropped(ScriptedStreamPeer::Mode::kShortEnd, true, "ended its chunk stream");
}
TEST_F(MisbehavingStreamPeerTest, DataLossErrorMarksCorrupt) {
  ExpectDropped(ScriptedStreamPeer::Mode::kDataLoss, true, "chunk file damaged");
}

}  // namespace
}  // namespace ts::sidecar
