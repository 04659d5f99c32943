#include "sidecar/peer/peer_auth.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/status.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;

constexpr char kChainId[] = "peer-test-1";
constexpr char kMethod[] = "/gonka.trainshard.v1.ArtifactTransfer/GetChunks";
constexpr uint64_t kShard = 7;

class FakeClock final : public common::Clock {
 public:
  int64_t NowUnixMs() override { return now_ms_.load(); }
  int64_t MonotonicMs() override { return now_ms_.load(); }
  void SleepMs(int64_t ms) override { now_ms_ += ms; }
  void Advance(int64_t ms) { now_ms_ += ms; }

 private:
  std::atomic<int64_t> now_ms_{1'700'000'000'000};
};

common::PrivateKey KeyOf(char byte) {
  auto key = common::PrivateKey::FromBytes(std::string(32, byte));
  TS_CHECK(key.ok());
  return *key;
}

std::string AddressOf(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

pb::GetChunksRequest Request(std::string chunk = std::string(32, 'c')) {
  pb::GetChunksRequest request;
  request.set_shard_id(kShard);
  request.set_artifact_id(std::string(32, 'a'));
  request.add_chunks(std::move(chunk));
  return request;
}

class PeerAuthTest : public ::testing::Test {
 protected:
  PeerAuthTest()
      : sender_(KeyOf(0x11)),
        receiver_(KeyOf(0x22)),
        verifier_(AddressOf(receiver_), kChainId, &clock_) {}

  // A request signed by `key` to the receiver, issued now.
  pb::GetChunksRequest Signed(const common::PrivateKey& key, pb::GetChunksRequest request,
                              int64_t lifetime_ms = kDefaultPeerRequestLifetimeMs,
                              std::string audience = "") {
    if (audience.empty()) audience = AddressOf(receiver_);
    auto auth = SignPeerRequest(key, kChainId, request.shard_id(), kMethod, audience, request,
                                clock_.NowUnixMs(), lifetime_ms);
    TS_CHECK(auth.ok());
    *request.mutable_auth() = *auth;
    return request;
  }

  FakeClock clock_;
  common::PrivateKey sender_;
  common::PrivateKey receiver_;
  PeerRequestVerifier verifier_;
};

TEST(RequestBodyBytesTest, LeavesOutAuthOnly) {
  pb::GetChunksRequest a = Request();
  pb::GetChunksRequest b = Request();
  b.mutable_auth()->set_signer("gonka1someone");
  b.mutable_auth()->set_nonce("n");
  EXPECT_EQ(RequestBodyBytes(a), RequestBodyBytes(b));
  EXPECT_FALSE(RequestBodyBytes(a).empty());
  pb::GetChunksRequest c = Request(std::string(32, 'd'));
  EXPECT_NE(RequestBodyBytes(a), RequestBodyBytes(c));
  // A message without an auth field is its plain deterministic encoding.
  pb::PeerFault fault;
  fault.set_peer("p");
  EXPECT_EQ(RequestBodyBytes(fault), fault.SerializeAsString());
}

TEST_F(PeerAuthTest, SignedRequestVerifies) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  EXPECT_EQ(request.auth().signer(), AddressOf(sender_));
  EXPECT_EQ(request.auth().audience(), AddressOf(receiver_));
  EXPECT_EQ(request.auth().nonce().size(), 16u);
  EXPECT_EQ(request.auth().signature().size(), 65u);
  EXPECT_EQ(request.auth().expires_unix_ms() - request.auth().issued_unix_ms(),
            kDefaultPeerRequestLifetimeMs);
  auto signer = verifier_.VerifyRequest(request, kMethod, kShard);
  ASSERT_TRUE(signer.ok()) << signer.status();
  EXPECT_EQ(*signer, AddressOf(sender_));
}

TEST_F(PeerAuthTest, NoncesDiffer) {
  pb::GetChunksRequest a = Signed(sender_, Request());
  pb::GetChunksRequest b = Signed(sender_, Request());
  EXPECT_NE(a.auth().nonce(), b.auth().nonce());
  EXPECT_TRUE(verifier_.VerifyRequest(a, kMethod, kShard).ok());
  EXPECT_TRUE(verifier_.VerifyRequest(b, kMethod, kShard).ok());
}

TEST_F(PeerAuthTest, MissingAuthRefused) {
  auto r = verifier_.VerifyRequest(Request(), kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth: missing");
}

TEST_F(PeerAuthTest, UnsignedRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->clear_signature();
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth.signature: 0 bytes, want 65");
}

TEST_F(PeerAuthTest, GarbageSignatureRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->set_signature(std::string(65, '\x7f'));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("auth.signature: "));
}

TEST_F(PeerAuthTest, WrongAudienceRefused) {
  const common::PrivateKey other = KeyOf(0x33);
  pb::GetChunksRequest request =
      Signed(sender_, Request(), kDefaultPeerRequestLifetimeMs, AddressOf(other));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status().message(), absl::StrCat("auth.audience: ", AddressOf(other),
                                               " is not this host (", AddressOf(receiver_), ")"));
}

TEST_F(PeerAuthTest, ExpiredRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request(), /*lifetime_ms=*/1000);
  clock_.Advance(1001);
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(),
            absl::StrCat("auth.expires_unix_ms: ", request.auth().expires_unix_ms(),
                         " is in the past (now ", clock_.NowUnixMs(), ")"));
}

TEST_F(PeerAuthTest, AtExpiryStillAccepted) {
  pb::GetChunksRequest request = Signed(sender_, Request(), /*lifetime_ms=*/1000);
  clock_.Advance(1000);
  EXPECT_TRUE(verifier_.VerifyRequest(request, kMethod, kShard).ok());
}

TEST_F(PeerAuthTest, IssuedInTheFutureRefused) {
  clock_.Advance(6000);
  pb::GetChunksRequest request = Signed(sender_, Request());
  clock_.Advance(-6000);
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("auth.issued_unix_ms: "));
  EXPECT_THAT(r.status().message(), HasSubstr("is in the future"));

  // Within the allowed skew a sender's clock may run ahead.
  clock_.Advance(4000);
  pb::GetChunksRequest ahead = Signed(sender_, Request());
  clock_.Advance(-4000);
  EXPECT_TRUE(verifier_.VerifyRequest(ahead, kMethod, kShard).ok());
}

TEST_F(PeerAuthTest, LifetimeAboveMaximumRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request(), /*lifetime_ms=*/120001);
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(),
            "auth.expires_unix_ms: lifetime 120001 ms is outside 0..120000 ms");
}

TEST_F(PeerAuthTest, IssuedBeforeStartRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  clock_.Advance(10);
  // A restarted receiver has forgotten the nonces it saw; anything older than its start is
  // refused rather than accepted unchecked.
  PeerRequestVerifier restarted(AddressOf(receiver_), kChainId, &clock_);
  auto r = restarted.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(),
            absl::StrCat("auth.issued_unix_ms: ", request.auth().issued_unix_ms(),
                         " is before this host started (", clock_.NowUnixMs(), ")"));
}

TEST_F(PeerAuthTest, ReplayRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  EXPECT_TRUE(verifier_.VerifyRequest(request, kMethod, kShard).ok());
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth.nonce: replayed");
  // Still refused later on, then as expired.
  clock_.Advance(kDefaultPeerRequestLifetimeMs + 1);
  r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_THAT(r.status().message(), HasSubstr("auth.expires_unix_ms"));
}

TEST_F(PeerAuthTest, SameNonceOfAnotherSignerIsNotAReplay) {
  const common::PrivateKey other = KeyOf(0x44);
  pb::GetChunksRequest a = Signed(sender_, Request());
  EXPECT_TRUE(verifier_.VerifyRequest(a, kMethod, kShard).ok());
  // The other signer picks the same nonce (and signs it properly).
  pb::GetChunksRequest b = Request();
  pb::PeerRequestAuth auth = a.auth();
  auth.set_signer(AddressOf(other));
  pb::PeerRequestStatement statement;
  statement.set_method(kMethod);
  statement.set_signer(auth.signer());
  statement.set_audience(auth.audience());
  statement.set_expires_unix_ms(auth.expires_unix_ms());
  statement.set_nonce(auth.nonce());
  statement.set_body_sha256(common::Sha256(RequestBodyBytes(b)));
  statement.set_issued_unix_ms(auth.issued_unix_ms());
  std::string bytes;
  ASSERT_TRUE(statement.SerializeToString(&bytes));
  auto signature = common::SignStatement(other, kPeerRequestSignKind, kChainId, kShard, bytes);
  ASSERT_TRUE(signature.ok());
  auth.set_signature(*signature);
  *b.mutable_auth() = auth;
  auto r = verifier_.VerifyRequest(b, kMethod, kShard);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, AddressOf(other));
}

TEST_F(PeerAuthTest, SignerFieldMismatchRefused) {
  const common::PrivateKey other = KeyOf(0x33);
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->set_signer(AddressOf(other));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  // The signer is part of what is signed, so the recovered key is neither of the two.
  EXPECT_THAT(r.status().message(), HasSubstr("auth.signature: signed by gonka1"));
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat(", not auth.signer ", AddressOf(other))));
}

TEST_F(PeerAuthTest, BodyTamperedAfterSigningRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.set_chunks(0, std::string(32, 'x'));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("not auth.signer"));
}

TEST_F(PeerAuthTest, BoundToMethodShardAndChain) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  EXPECT_EQ(
      verifier_.VerifyRequest(request, "/gonka.trainshard.v1.ArtifactTransfer/GetManifest", kShard)
          .status()
          .code(),
      absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(verifier_.VerifyRequest(request, kMethod, kShard + 1).status().code(),
            absl::StatusCode::kUnauthenticated);
  PeerRequestVerifier other_chain(AddressOf(receiver_), "other-chain", &clock_);
  EXPECT_EQ(other_chain.VerifyRequest(request, kMethod, kShard).status().code(),
            absl::StatusCode::kUnauthenticated);
  // None of the refusals took the nonce: the genuine request still passes once.
  EXPECT_TRUE(verifier_.VerifyRequest(request, kMethod, kShard).ok());
}

TEST_F(PeerAuthTest, BadNonceSizeRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->set_nonce("short");
  auto r = verifier_.VerifyRequest(request, kMethod, kShard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth.nonce: 5 bytes, want 16");
}

TEST_F(PeerAuthTest, NonceCapAndPruning) {
  PeerAuthOptions options;
  options.max_nonces = 4;
  options.max_lifetime_ms = 4000;
  PeerRequestVerifier verifier(AddressOf(receiver_), kChainId, &clock_, options);
  for (int i = 0; i < 4; ++i) {
    auto r = verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  auto full = verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("auth.nonce: 4 unexpired requests held"));
  // Once they expire (and a pruning period passed) there is room again.
  clock_.Advance(2001);
  auto r = verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard);
  EXPECT_TRUE(r.ok()) << r.status();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard).ok());
  }
  EXPECT_EQ(
      verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard).status().code(),
      absl::StatusCode::kResourceExhausted);
}

TEST_F(PeerAuthTest, ConcurrentReplaysAcceptedOnce) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  std::vector<pb::GetChunksRequest> fresh;
  for (int i = 0; i < 8; ++i) fresh.push_back(Signed(sender_, Request()));
  std::atomic<int> replay_ok{0};
  std::atomic<int> fresh_ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      if (verifier_.VerifyRequest(request, kMethod, kShard).ok()) ++replay_ok;
      if (verifier_.VerifyRequest(fresh[i], kMethod, kShard).ok()) ++fresh_ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(replay_ok.load(), 1);
  EXPECT_EQ(fresh_ok.load(), 8);
}

TEST_F(PeerAuthTest, BadChainIdFailsToSign) {
  auto auth = SignPeerRequest(sender_, "", kShard, kMethod, AddressOf(receiver_), Request(),
                              clock_.NowUnixMs(), 1000);
  EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::sidecar
