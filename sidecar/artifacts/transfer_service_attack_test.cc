// Attacks on the real transfer service over gRPC: unsigned, expired, replayed, tampered and
// misaddressed requests, outsiders and readers, bad ids, and the bounds on nonces and streams.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "sidecar/artifacts/transfer.h"
#include "sidecar/artifacts/transfer_test_util.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;
using transfer_testing::AddressOf;
using transfer_testing::Clock;
using transfer_testing::Host;
using transfer_testing::kChain;
using transfer_testing::KeyOf;
using transfer_testing::kShard;
using transfer_testing::RandomBytes;
using transfer_testing::ScriptedPeer;
using transfer_testing::Server;
using transfer_testing::StartServer;
using transfer_testing::TransferTest;
using transfer_testing::WriteFile;

std::string Hex(std::string_view bytes) { return common::HexEncode(bytes); }

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

}  // namespace
}  // namespace ts::sidecar
