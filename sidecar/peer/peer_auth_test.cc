#include "sidecar/peer/peer_auth.h"

#include <atomic>
#include <functional>
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

// A membership check under which every signer is a member (the tests of everything else).
absl::Status Anyone(uint64_t, std::string_view) { return absl::OkStatus(); }

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
  auto signer = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  ASSERT_TRUE(signer.ok()) << signer.status();
  EXPECT_EQ(*signer, AddressOf(sender_));
}

TEST_F(PeerAuthTest, NoncesDiffer) {
  pb::GetChunksRequest a = Signed(sender_, Request());
  pb::GetChunksRequest b = Signed(sender_, Request());
  EXPECT_NE(a.auth().nonce(), b.auth().nonce());
  EXPECT_TRUE(verifier_.VerifyRequest(a, kMethod, kShard, Anyone).ok());
  EXPECT_TRUE(verifier_.VerifyRequest(b, kMethod, kShard, Anyone).ok());
}

TEST_F(PeerAuthTest, MissingAuthRefused) {
  auto r = verifier_.VerifyRequest(Request(), kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth: missing");
}

TEST_F(PeerAuthTest, UnsignedRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->clear_signature();
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth.signature: 0 bytes, want 65");
}

TEST_F(PeerAuthTest, GarbageSignatureRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->set_signature(std::string(65, '\x7f'));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("auth.signature: "));
}

TEST_F(PeerAuthTest, WrongAudienceRefused) {
  const common::PrivateKey other = KeyOf(0x33);
  pb::GetChunksRequest request =
      Signed(sender_, Request(), kDefaultPeerRequestLifetimeMs, AddressOf(other));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status().message(), absl::StrCat("auth.audience: ", AddressOf(other),
                                               " is not this host (", AddressOf(receiver_), ")"));
}

TEST_F(PeerAuthTest, ExpiredRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request(), /*lifetime_ms=*/1000);
  clock_.Advance(1001);
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(),
            absl::StrCat("auth.expires_unix_ms: ", request.auth().expires_unix_ms(),
                         " is in the past (now ", clock_.NowUnixMs(), ")"));
}

TEST_F(PeerAuthTest, AtExpiryStillAccepted) {
  pb::GetChunksRequest request = Signed(sender_, Request(), /*lifetime_ms=*/1000);
  clock_.Advance(1000);
  EXPECT_TRUE(verifier_.VerifyRequest(request, kMethod, kShard, Anyone).ok());
}

TEST_F(PeerAuthTest, IssuedInTheFutureRefused) {
  clock_.Advance(6000);
  pb::GetChunksRequest request = Signed(sender_, Request());
  clock_.Advance(-6000);
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("auth.issued_unix_ms: "));
  EXPECT_THAT(r.status().message(), HasSubstr("is in the future"));

  // Within the allowed skew a sender's clock may run ahead.
  clock_.Advance(4000);
  pb::GetChunksRequest ahead = Signed(sender_, Request());
  clock_.Advance(-4000);
  EXPECT_TRUE(verifier_.VerifyRequest(ahead, kMethod, kShard, Anyone).ok());
}

TEST_F(PeerAuthTest, LifetimeAboveMaximumRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request(), /*lifetime_ms=*/120001);
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
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
  auto r = restarted.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(),
            absl::StrCat("auth.issued_unix_ms: ", request.auth().issued_unix_ms(),
                         " is before this host started (", clock_.NowUnixMs(), ")"));
}

TEST_F(PeerAuthTest, ReplayRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  EXPECT_TRUE(verifier_.VerifyRequest(request, kMethod, kShard, Anyone).ok());
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth.nonce: replayed");
  // Still refused later on, then as expired.
  clock_.Advance(kDefaultPeerRequestLifetimeMs + 1);
  r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_THAT(r.status().message(), HasSubstr("auth.expires_unix_ms"));
}

TEST_F(PeerAuthTest, SameNonceOfAnotherSignerIsNotAReplay) {
  const common::PrivateKey other = KeyOf(0x44);
  pb::GetChunksRequest a = Signed(sender_, Request());
  EXPECT_TRUE(verifier_.VerifyRequest(a, kMethod, kShard, Anyone).ok());
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
  auto r = verifier_.VerifyRequest(b, kMethod, kShard, Anyone);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, AddressOf(other));
}

TEST_F(PeerAuthTest, SignerFieldMismatchRefused) {
  const common::PrivateKey other = KeyOf(0x33);
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->set_signer(AddressOf(other));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  // The signer is part of what is signed, so the recovered key is neither of the two.
  EXPECT_THAT(r.status().message(), HasSubstr("auth.signature: signed by gonka1"));
  EXPECT_THAT(r.status().message(),
              HasSubstr(absl::StrCat(", not auth.signer ", AddressOf(other))));
}

TEST_F(PeerAuthTest, BodyTamperedAfterSigningRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.set_chunks(0, std::string(32, 'x'));
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(r.status().message(), HasSubstr("not auth.signer"));
}

TEST_F(PeerAuthTest, BoundToMethodShardAndChain) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  EXPECT_EQ(verifier_
                .VerifyRequest(request, "/gonka.trainshard.v1.ArtifactTransfer/GetManifest", kShard,
                               Anyone)
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(verifier_.VerifyRequest(request, kMethod, kShard + 1, Anyone).status().code(),
            absl::StatusCode::kUnauthenticated);
  PeerRequestVerifier other_chain(AddressOf(receiver_), "other-chain", &clock_);
  EXPECT_EQ(other_chain.VerifyRequest(request, kMethod, kShard, Anyone).status().code(),
            absl::StatusCode::kUnauthenticated);
  // None of the refusals took the nonce: the genuine request still passes once.
  EXPECT_TRUE(verifier_.VerifyRequest(request, kMethod, kShard, Anyone).ok());
}

TEST_F(PeerAuthTest, BadNonceSizeRefused) {
  pb::GetChunksRequest request = Signed(sender_, Request());
  request.mutable_auth()->set_nonce("short");
  auto r = verifier_.VerifyRequest(request, kMethod, kShard, Anyone);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(r.status().message(), "auth.nonce: 5 bytes, want 16");
}

TEST_F(PeerAuthTest, NonceCapAndPruning) {
  PeerAuthOptions options;
  options.max_nonces = 4;
  options.max_lifetime_ms = 4000;
  PeerRequestVerifier verifier(AddressOf(receiver_), kChainId, &clock_, options);
  for (int i = 0; i < 4; ++i) {
    auto r = verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard, Anyone);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  auto full = verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard, Anyone);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("auth.nonce: 4 unexpired requests held"));
  // Once they expire (and a pruning period passed) there is room again.
  clock_.Advance(2001);
  auto r = verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard, Anyone);
  EXPECT_TRUE(r.ok()) << r.status();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(
        verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard, Anyone).ok());
  }
  EXPECT_EQ(verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard, Anyone)
                .status()
                .code(),
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
      if (verifier_.VerifyRequest(request, kMethod, kShard, Anyone).ok()) ++replay_ok;
      if (verifier_.VerifyRequest(fresh[i], kMethod, kShard, Anyone).ok()) ++fresh_ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(replay_ok.load(), 1);
  EXPECT_EQ(fresh_ok.load(), 8);
}

// A membership check that admits one address and counts its calls.
class OnlyMember {
 public:
  explicit OnlyMember(std::string member) : member_(std::move(member)) {}
  absl::Status operator()(uint64_t shard_id, std::string_view signer) {
    ++calls_;
    if (shard_id == kShard && signer == member_) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("host ", std::string(signer), " is not a member of shard ", shard_id));
  }
  int calls() const { return calls_; }

 private:
  const std::string member_;
  int calls_ = 0;
};

// A key made from a counter: as many distinct signers as a test wants, none with an account.
common::PrivateKey NumberedKey(uint32_t i) {
  std::string bytes(32, '\x01');
  bytes[28] = static_cast<char>(i >> 24);
  bytes[29] = static_cast<char>(i >> 16);
  bytes[30] = static_cast<char>(i >> 8);
  bytes[31] = static_cast<char>(i);
  auto key = common::PrivateKey::FromBytes(bytes);
  TS_CHECK(key.ok());
  return *key;
}

// The attack of the "Harden the host" issue: validly signed requests of hosts outside the shard
// (one key, and keys of no account at all) used to take places in the nonce table before
// membership was asked, until members were refused RESOURCE_EXHAUSTED. Now a refused request
// keeps nothing, is refused again for the same reason, and members keep their room.
TEST_F(PeerAuthTest, NonMembersKeepNoState) {
  PeerAuthOptions options;
  options.max_nonces = 8;
  PeerRequestVerifier verifier(AddressOf(receiver_), kChainId, &clock_, options);
  OnlyMember member(AddressOf(sender_));
  const common::PrivateKey outsider = KeyOf(0x55);
  pb::GetChunksRequest first = Signed(outsider, Request());
  for (uint32_t i = 0; i < 200; ++i) {
    pb::GetChunksRequest request = Signed(i % 2 == 0 ? outsider : NumberedKey(i), Request());
    auto r = verifier.VerifyRequest(request, kMethod, kShard, std::ref(member));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("is not a member of shard"));
  }
  EXPECT_EQ(verifier.nonces_held(), 0u);
  EXPECT_EQ(verifier.signers_held(), 0u);
  // Sent again, the same request is refused for the same reason, not as a replay.
  for (int i = 0; i < 2; ++i) {
    auto again = verifier.VerifyRequest(first, kMethod, kShard, std::ref(member));
    EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied) << again.status();
  }
  // The member has every place.
  for (size_t i = 0; i < options.max_nonces; ++i) {
    auto r = verifier.VerifyRequest(Signed(sender_, Request()), kMethod, kShard, std::ref(member));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, AddressOf(sender_));
  }
  EXPECT_EQ(verifier.nonces_held(), options.max_nonces);
  EXPECT_EQ(verifier.signers_held(), 1u);
}

// Cheap checks and the signature come before membership, which may cost a chain query: a
// request that fails them is never looked up.
TEST_F(PeerAuthTest, MembershipAskedOnlyAfterTheSignature) {
  OnlyMember member(AddressOf(sender_));
  pb::GetChunksRequest forged = Signed(sender_, Request());
  forged.mutable_auth()->set_signature(std::string(65, '\x7f'));
  EXPECT_FALSE(verifier_.VerifyRequest(forged, kMethod, kShard, std::ref(member)).ok());
  pb::GetChunksRequest elsewhere =
      Signed(sender_, Request(), kDefaultPeerRequestLifetimeMs, AddressOf(KeyOf(0x66)));
  EXPECT_FALSE(verifier_.VerifyRequest(elsewhere, kMethod, kShard, std::ref(member)).ok());
  pb::GetChunksRequest tampered = Signed(sender_, Request());
  tampered.set_chunks(0, std::string(32, 'x'));
  EXPECT_FALSE(verifier_.VerifyRequest(tampered, kMethod, kShard, std::ref(member)).ok());
  EXPECT_EQ(member.calls(), 0);
  pb::GetChunksRequest good = Signed(sender_, Request());
  EXPECT_TRUE(verifier_.VerifyRequest(good, kMethod, kShard, std::ref(member)).ok());
  EXPECT_EQ(member.calls(), 1);
  // A replay is signed and a member's: it is looked up, then refused by its nonce.
  auto replay = verifier_.VerifyRequest(good, kMethod, kShard, std::ref(member));
  EXPECT_EQ(replay.status().message(), "auth.nonce: replayed");
  // Authenticate alone keeps nothing: the same request still verifies once afterwards.
  pb::GetChunksRequest fresh = Signed(sender_, Request());
  auto who = verifier_.AuthenticateRequest(fresh, kMethod, kShard);
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(*who, AddressOf(sender_));
  EXPECT_TRUE(verifier_.AuthenticateRequest(fresh, kMethod, kShard).ok());
  EXPECT_TRUE(verifier_.VerifyRequest(fresh, kMethod, kShard, std::ref(member)).ok());
}

// One member cannot take the places of the others.
TEST_F(PeerAuthTest, PerSignerCap) {
  PeerAuthOptions options;
  options.max_nonces_per_signer = 3;
  PeerRequestVerifier verifier(AddressOf(receiver_), kChainId, &clock_, options);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(verifier.VerifyRequest(Signed(sender_, Request()), kMethod, kShard, Anyone).ok());
  }
  auto capped = verifier.VerifyRequest(Signed(sender_, Request()), kMethod, kShard, Anyone);
  EXPECT_EQ(capped.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(capped.status().message(),
              HasSubstr(absl::StrCat("3 unexpired requests of ", AddressOf(sender_))));
  const common::PrivateKey other = KeyOf(0x44);
  EXPECT_TRUE(verifier.VerifyRequest(Signed(other, Request()), kMethod, kShard, Anyone).ok());
  EXPECT_EQ(verifier.nonces_held(), 4u);
}

// A burst's tables are given back once its requests expire.
TEST_F(PeerAuthTest, ExpiredNoncesGiveTheirMemoryBack) {
  PeerAuthOptions options;
  options.max_lifetime_ms = 4000;
  PeerRequestVerifier verifier(AddressOf(receiver_), kChainId, &clock_, options);
  const common::PrivateKey other = KeyOf(0x44);
  for (int i = 0; i < 3000; ++i) {
    pb::GetChunksRequest request = Signed(i % 3 == 0 ? other : sender_, Request(), 2000);
    ASSERT_TRUE(verifier.VerifyRequest(request, kMethod, kShard, Anyone).ok());
  }
  EXPECT_EQ(verifier.nonces_held(), 3000u);
  EXPECT_EQ(verifier.signers_held(), 2u);
  EXPECT_GE(verifier.nonce_slots(), 3000u);
  clock_.Advance(2001);
  EXPECT_TRUE(
      verifier.VerifyRequest(Signed(sender_, Request(), 2000), kMethod, kShard, Anyone).ok());
  EXPECT_EQ(verifier.nonces_held(), 1u);
  EXPECT_EQ(verifier.signers_held(), 1u);
  EXPECT_LT(verifier.nonce_slots(), 100u);
}

TEST_F(PeerAuthTest, BadChainIdFailsToSign) {
  auto auth = SignPeerRequest(sender_, "", kShard, kMethod, AddressOf(receiver_), Request(),
                              clock_.NowUnixMs(), 1000);
  EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::sidecar
