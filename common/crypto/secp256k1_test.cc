#include "common/crypto/secp256k1.h"

#include <string>
#include <vector>

#include "common/crypto/hash.h"
#include "common/hex.h"
#include "gtest/gtest.h"

namespace ts::common {
namespace {

constexpr char kOrderHex[] = "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141";

std::string Unhex(std::string_view hex) {
  auto bytes = HexDecode(hex);
  EXPECT_TRUE(bytes.ok()) << hex;
  return bytes.ok() ? *bytes : std::string();
}

PrivateKey KeyFromHex(std::string_view hex) {
  auto key = PrivateKey::FromBytes(Unhex(hex));
  EXPECT_TRUE(key.ok()) << key.status();
  return *std::move(key);
}

// n - s for a 32-byte big-endian s, which turns a low-S signature into its high-S twin.
std::string NegateScalar(std::string_view s) {
  const std::string n = Unhex(kOrderHex);
  std::string out(32, '\0');
  int borrow = 0;
  for (int i = 31; i >= 0; --i) {
    int d = static_cast<unsigned char>(n[i]) - static_cast<unsigned char>(s[i]) - borrow;
    borrow = d < 0 ? 1 : 0;
    out[i] = static_cast<char>(d + (borrow ? 256 : 0));
  }
  return out;
}

struct Rfc6979Vector {
  const char* secret;
  const char* message;
  const char* r;
  const char* s;  // low S, as libsecp256k1 emits and Cosmos requires
};

// The widely published secp256k1 / SHA-256 RFC 6979 vectors (the set used by libsecp256k1's own
// tests, CoreBitcoin, btcd, python-ecdsa and trezor-crypto), digest = SHA-256(message).
const std::vector<Rfc6979Vector>& Rfc6979Vectors() {
  static const auto* v = new std::vector<Rfc6979Vector>{
      {"cca9fbcc1b41e5a95d369eaa6ddcff73b61a4efaa279cfc6567e8daa39cbaf50", "sample",
       "af340daf02cc15c8d5d08d7735dfe6b98a474ed373bdb5fbecf7571be52b3842",
       "5009fb27f37034a9b24b707b7c6b79ca23ddef9e25f7282e8a797efe53a8f124"},
      {"0000000000000000000000000000000000000000000000000000000000000001", "Satoshi Nakamoto",
       "934b1ea10a4b3c1757e2b0c017d0b6143ce3c9a7e6a4a49860d7a6ab210ee3d8",
       "2442ce9d2b916064108014783e923ec36b49743e2ffa1c4496f01a512aafd9e5"},
      {"fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364140", "Satoshi Nakamoto",
       "fd567d121db66e382991534ada77a6bd3106f0a1098c231e47993447cd6af2d0",
       "6b39cd0eb1bc8603e159ef5c20a5c8ad685a45b06ce9bebed3f153d10d93bed5"},
      {"f8b8af8ce3c7cca5e300d33939540c10d45ce001b8f252bfbc57ba0342904181", "Alan Turing",
       "7063ae83e7f62bbb171798131b4a0564b956930092b33b07b395615d9ec7e15c",
       "58dfcc1e00a35e1572f366ffe34ba0fc47db1e7189759b9fb233c5b05ab388ea"},
      {"0000000000000000000000000000000000000000000000000000000000000001",
       "All those moments will be lost in time, like tears in rain. Time to die...",
       "8600dbd41e348fe5c9465ab92d23e3db8b98b873beecd930736488696438cb6b",
       "547fe64427496db33bf66019dacbf0039c04199abb0122918601db38a72cfc21"},
      {"e91671c46231f833a6406ccbea0e3e392c76c167bac1cb013f6f1013980455c2",
       "There is a computer disease that anybody who works with computers knows about. It's a "
       "very serious disease and it interferes completely with the work. The trouble with "
       "computers is that you 'play' with them!",
       "b552edd27580141f3b2a5463048cb7cd3e047b97c9f98076c32dbdf85a68718b",
       "279fa72dd19bfae05577e06c7c0c1900c371fcd5893f7e1d56a37d30174671f6"},
  };
  return *v;
}

TEST(PrivateKeyTest, KeyOneIsTheGenerator) {
  PrivateKey key = KeyFromHex("0000000000000000000000000000000000000000000000000000000000000001");
  EXPECT_EQ(HexEncodeUpper(key.public_key()),
            "0279BE667EF9DCBBAC55A06295CE870B07029BFCDB2DCE28D959F2815B16F81798");
}

TEST(PrivateKeyTest, KeyTwoIsTwiceTheGenerator) {
  PrivateKey key = KeyFromHex("0000000000000000000000000000000000000000000000000000000000000002");
  EXPECT_EQ(HexEncodeUpper(key.public_key()),
            "02C6047F9441ED7D6D3045406E95C07CD85C778E4B8CEF3CA7ABAC09B95C709EE5");
}

TEST(PrivateKeyTest, RejectsOutOfRangeAndWrongSize) {
  EXPECT_EQ(PrivateKey::FromBytes(std::string(32, '\0')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrivateKey::FromBytes(Unhex(kOrderHex)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrivateKey::FromBytes(std::string(32, '\xff')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrivateKey::FromBytes(std::string(31, '\x01')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrivateKey::FromBytes(std::string(33, '\x01')).status().code(),
            absl::StatusCode::kInvalidArgument);
  // n - 1 is the largest valid scalar.
  EXPECT_TRUE(PrivateKey::FromBytes(
                  Unhex("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364140"))
                  .ok());
}

TEST(PrivateKeyTest, GenerateGivesDistinctUsableKeys) {
  PrivateKey a = PrivateKey::Generate();
  PrivateKey b = PrivateKey::Generate();
  EXPECT_NE(a.secret(), b.secret());
  EXPECT_EQ(a.public_key().size(), kPublicKeySize);
  EXPECT_TRUE(a.public_key()[0] == '\x02' || a.public_key()[0] == '\x03');
  const std::string digest = Sha256("generated");
  EXPECT_TRUE(VerifyCompact(a.public_key(), digest, a.SignCompact(digest)).ok());
  EXPECT_EQ(VerifyCompact(b.public_key(), digest, a.SignCompact(digest)).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(SignTest, Rfc6979VectorsMatchAndVerify) {
  for (const auto& v : Rfc6979Vectors()) {
    SCOPED_TRACE(v.message);
    PrivateKey key = KeyFromHex(v.secret);
    const std::string digest = Sha256(v.message);
    const std::string sig = key.SignCompact(digest);
    ASSERT_EQ(sig.size(), kCompactSignatureSize);
    EXPECT_EQ(HexEncode(sig.substr(0, 32)), v.r);
    EXPECT_EQ(HexEncode(sig.substr(32)), v.s);
    EXPECT_TRUE(VerifyCompact(key.public_key(), digest, sig).ok());

    // The recoverable signature uses the same nonce, so R||S are identical.
    const std::string rsig = key.SignRecoverable(digest);
    ASSERT_EQ(rsig.size(), kRecoverableSignatureSize);
    EXPECT_EQ(rsig.substr(0, 64), sig);
    EXPECT_LE(static_cast<unsigned char>(rsig[64]), 3);
    auto recovered = RecoverPublicKey(digest, rsig);
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    EXPECT_EQ(*recovered, key.public_key());
  }
}

TEST(SignTest, DeterministicSignatures) {
  PrivateKey key = KeyFromHex(Rfc6979Vectors()[3].secret);
  const std::string digest = Sha256("same digest");
  EXPECT_EQ(key.SignCompact(digest), key.SignCompact(digest));
  EXPECT_EQ(key.SignRecoverable(digest), key.SignRecoverable(digest));
}

TEST(VerifyTest, TamperedDigestOrSignatureFails) {
  PrivateKey key = KeyFromHex(Rfc6979Vectors()[0].secret);
  const std::string digest = Sha256("payload");
  const std::string sig = key.SignCompact(digest);
  std::string other_digest = digest;
  other_digest[0] ^= 1;
  EXPECT_EQ(VerifyCompact(key.public_key(), other_digest, sig).code(),
            absl::StatusCode::kUnauthenticated);
  for (size_t i : {0u, 31u, 32u, 63u}) {
    std::string bad = sig;
    bad[i] ^= 0x01;
    const absl::Status st = VerifyCompact(key.public_key(), digest, bad);
    EXPECT_FALSE(st.ok()) << i;
  }
  // A different key does not verify.
  PrivateKey other = KeyFromHex(Rfc6979Vectors()[3].secret);
  EXPECT_EQ(VerifyCompact(other.public_key(), digest, sig).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(VerifyTest, HighSIsRejectedAsMalformed) {
  for (const auto& v : Rfc6979Vectors()) {
    SCOPED_TRACE(v.message);
    PrivateKey key = KeyFromHex(v.secret);
    const std::string digest = Sha256(v.message);
    const std::string sig = key.SignCompact(digest);
    const std::string high = sig.substr(0, 32) + NegateScalar(sig.substr(32));
    // (r, n - s) is a mathematically valid ECDSA signature, so only the low-S rule refuses it.
    EXPECT_EQ(VerifyCompact(key.public_key(), digest, high).code(),
              absl::StatusCode::kInvalidArgument);

    const std::string rsig = key.SignRecoverable(digest);
    std::string rhigh = rsig.substr(0, 32) + NegateScalar(rsig.substr(32, 32));
    // Negating S flips the parity of the recovered R, so V ^ 1 recovers the same key.
    rhigh.push_back(static_cast<char>(rsig[64] ^ 1));
    EXPECT_EQ(RecoverPublicKey(digest, rhigh).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(VerifyTest, UncompressedKeyVerifiesTheSameSignatures) {
  const PrivateKey key = PrivateKey::Generate();
  const PrivateKey other = PrivateKey::Generate();
  const std::string digest = Sha256("uncompressed");
  const std::string sig = key.SignCompact(digest);
  absl::StatusOr<std::string> full = UncompressPublicKey(key.public_key());
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->size(), kUncompressedPublicKeySize);
  EXPECT_EQ((*full)[0], 0x04);
  EXPECT_EQ(full->substr(1, 32), key.public_key().substr(1, 32));  // same X
  EXPECT_TRUE(VerifyCompact(*full, digest, sig).ok());
  EXPECT_EQ(VerifyCompact(*UncompressPublicKey(other.public_key()), digest, sig).code(),
            absl::StatusCode::kUnauthenticated);
  std::string hybrid = *full;
  hybrid[0] = 0x06;  // hybrid encodings are not accepted
  EXPECT_EQ(VerifyCompact(hybrid, digest, sig).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UncompressPublicKey(*full).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UncompressPublicKey(std::string(33, '\x05')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(VerifyTest, WrongSizesAreInvalidArgument) {
  PrivateKey key = KeyFromHex(Rfc6979Vectors()[0].secret);
  const std::string digest = Sha256("x");
  const std::string sig = key.SignCompact(digest);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(VerifyCompact(key.public_key().substr(1), digest, sig).code(), kInvalid);
  EXPECT_EQ(VerifyCompact(key.public_key() + "x", digest, sig).code(), kInvalid);
  EXPECT_EQ(VerifyCompact(key.public_key(), digest.substr(1), sig).code(), kInvalid);
  EXPECT_EQ(VerifyCompact(key.public_key(), digest + "x", sig).code(), kInvalid);
  EXPECT_EQ(VerifyCompact(key.public_key(), digest, sig.substr(1)).code(), kInvalid);
  EXPECT_EQ(VerifyCompact(key.public_key(), digest, sig + "x").code(), kInvalid);
  EXPECT_EQ(VerifyCompact("", "", "").code(), kInvalid);

  const std::string rsig = key.SignRecoverable(digest);
  EXPECT_EQ(RecoverPublicKey(digest.substr(1), rsig).status().code(), kInvalid);
  EXPECT_EQ(RecoverPublicKey(digest, rsig.substr(0, 64)).status().code(), kInvalid);
  EXPECT_EQ(RecoverPublicKey(digest, rsig + "x").status().code(), kInvalid);
}

TEST(VerifyTest, MalformedKeysAndScalarsAreInvalidArgument) {
  PrivateKey key = KeyFromHex(Rfc6979Vectors()[0].secret);
  const std::string digest = Sha256("x");
  const std::string sig = key.SignCompact(digest);
  // Prefix 0x04 with 33 bytes and an x with no point on the curve are not keys.
  std::string bad_prefix = key.public_key();
  bad_prefix[0] = '\x04';
  EXPECT_EQ(VerifyCompact(bad_prefix, digest, sig).code(), absl::StatusCode::kInvalidArgument);
  // x = 5 has no square root of x^3 + 7 modulo p.
  std::string not_on_curve(33, '\0');
  not_on_curve[0] = '\x02';
  not_on_curve[32] = '\x05';
  EXPECT_EQ(VerifyCompact(not_on_curve, digest, sig).code(), absl::StatusCode::kInvalidArgument);
  // R or S at or above the group order does not parse.
  const std::string n = Unhex(kOrderHex);
  EXPECT_EQ(VerifyCompact(key.public_key(), digest, n + sig.substr(32)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VerifyCompact(key.public_key(), digest, sig.substr(0, 32) + n).code(),
            absl::StatusCode::kInvalidArgument);
  // Zero R and S parse but never verify.
  EXPECT_EQ(VerifyCompact(key.public_key(), digest, std::string(64, '\0')).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(RecoverTest, RecidAboveThreeIsInvalid) {
  PrivateKey key = KeyFromHex(Rfc6979Vectors()[1].secret);
  const std::string digest = Sha256("recid");
  std::string rsig = key.SignRecoverable(digest);
  for (int v : {4, 27, 28, 255}) {
    rsig[64] = static_cast<char>(v);
    EXPECT_EQ(RecoverPublicKey(digest, rsig).status().code(), absl::StatusCode::kInvalidArgument)
        << v;
  }
}

TEST(RecoverTest, TamperedInputsDoNotRecoverTheSigner) {
  PrivateKey key = KeyFromHex(Rfc6979Vectors()[2].secret);
  const std::string digest = Sha256("statement");
  const std::string rsig = key.SignRecoverable(digest);
  ASSERT_EQ(*RecoverPublicKey(digest, rsig), key.public_key());

  std::string other_digest = digest;
  other_digest[5] ^= 0x40;
  auto from_other_digest = RecoverPublicKey(other_digest, rsig);
  ASSERT_TRUE(from_other_digest.ok());
  EXPECT_NE(*from_other_digest, key.public_key());

  std::string flipped_v = rsig;
  flipped_v[64] ^= 1;
  auto from_flipped_v = RecoverPublicKey(digest, flipped_v);
  EXPECT_TRUE(!from_flipped_v.ok() || *from_flipped_v != key.public_key());

  std::string flipped_s = rsig;
  flipped_s[40] ^= 0x01;
  auto from_flipped_s = RecoverPublicKey(digest, flipped_s);
  EXPECT_TRUE(!from_flipped_s.ok() || *from_flipped_s != key.public_key());

  // R = 0 is no point's x coordinate: nothing to recover.
  std::string zero_r = rsig;
  for (int i = 0; i < 32; ++i) zero_r[i] = '\0';
  EXPECT_EQ(RecoverPublicKey(digest, zero_r).status().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace ts::common
