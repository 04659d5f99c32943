#include "common/crypto/signing.h"

#include <string>

#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "gtest/gtest.h"

namespace ts::common {
namespace {

PrivateKey TestKey(char fill) {
  auto key = PrivateKey::FromBytes(std::string(32, fill));
  EXPECT_TRUE(key.ok());
  return *std::move(key);
}

TEST(SignBytesTest, LayoutByteByByte) {
  auto bytes = SignBytes("settlement", "gonka-devnet", 0x0102030405060708ULL, "abc");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string expected =
      // "gonka-trainshard/v1/"
      "676f6e6b612d747261696e73686172642f76312f"
      // "settlement"
      "736574746c656d656e74"
      // 0x00 terminator, then u8 length 12
      "000c"
      // "gonka-devnet"
      "676f6e6b612d6465766e6574"
      // be64 shard id
      "0102030405060708"
      // message "abc"
      "616263";
  EXPECT_EQ(HexEncode(*bytes), expected);
  EXPECT_EQ(bytes->size(), 20u + 10u + 1u + 1u + 12u + 8u + 3u);
}

TEST(SignBytesTest, EmptyMessageAndExtremeShardIds) {
  auto zero = SignBytes("a", "c", 0, "");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, std::string("gonka-trainshard/v1/a\0\x01"
                               "c",
                               24) +
                       std::string(8, '\0'));
  auto max = SignBytes("a", "c", UINT64_MAX, "");
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(max->substr(max->size() - 8), std::string(8, '\xff'));
}

TEST(SignBytesTest, KindIsValidated) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(SignBytes("", "chain", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignBytes("Settlement", "chain", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignBytes("round-cert", "chain", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignBytes("kind1", "chain", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignBytes(std::string("a\0b", 3), "chain", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignBytes("a/b", "chain", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignBytes(std::string(33, 'a'), "chain", 1, "m").status().code(), kInvalid);
  EXPECT_TRUE(SignBytes(std::string(32, 'a'), "chain", 1, "m").ok());
  EXPECT_TRUE(SignBytes("round_certificate", "chain", 1, "m").ok());
  EXPECT_NE(SignBytes("Bad", "chain", 1, "m").status().message().find("kind"),
            absl::string_view::npos);
}

TEST(SignBytesTest, ChainIdIsValidated) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(SignBytes("settlement", "", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignBytes("settlement", std::string(65, 'c'), 1, "m").status().code(), kInvalid);
  auto longest = SignBytes("settlement", std::string(64, 'c'), 1, "m");
  ASSERT_TRUE(longest.ok());
  EXPECT_EQ(static_cast<unsigned char>((*longest)[kSignDomain.size() + 10 + 1]), 64);
  EXPECT_NE(SignBytes("settlement", "", 1, "m").status().message().find("chain_id"),
            absl::string_view::npos);
}

TEST(SignBytesTest, FieldBoundariesCannotBeShifted) {
  // Moving bytes between kind, chain id and message changes the sign bytes.
  auto a = SignBytes("ab", "c", 1, "m");
  auto b = SignBytes("a", "bc", 1, "m");
  auto c = SignBytes("ab", "cm", 1, "");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST(StatementTest, SignedStatementRecoversTheSignerAddress) {
  PrivateKey key = TestKey('\x11');
  auto sig = SignStatement(key, "reservation", "gonka-devnet", 42, "message bytes");
  ASSERT_TRUE(sig.ok()) << sig.status();
  ASSERT_EQ(sig->size(), kRecoverableSignatureSize);
  auto signer = RecoverStatementSigner("reservation", "gonka-devnet", 42, "message bytes", *sig);
  ASSERT_TRUE(signer.ok()) << signer.status();
  EXPECT_EQ(*signer, AddressFromPublicKey(key.public_key()));
  EXPECT_EQ(signer->substr(0, 6), "gonka1");

  // The signature is over SHA-256 of exactly SignBytes.
  auto bytes = SignBytes("reservation", "gonka-devnet", 42, "message bytes");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*sig, key.SignRecoverable(Sha256(*bytes)));
}

TEST(StatementTest, AnyChangedFieldRecoversAnotherAddress) {
  PrivateKey key = TestKey('\x22');
  const std::string address = AddressFromPublicKey(key.public_key());
  auto sig = SignStatement(key, "settlement", "gonka-mainnet", 7, "payload");
  ASSERT_TRUE(sig.ok());
  ASSERT_EQ(*RecoverStatementSigner("settlement", "gonka-mainnet", 7, "payload", *sig), address);

  auto expect_other = [&](absl::StatusOr<std::string> got) {
    // Either nothing is recovered or a different key is; never the signer.
    EXPECT_TRUE(!got.ok() || *got != address);
  };
  expect_other(RecoverStatementSigner("settlement", "gonka-devnet", 7, "payload", *sig));
  expect_other(RecoverStatementSigner("settlement", "gonka-mainnet", 8, "payload", *sig));
  expect_other(RecoverStatementSigner("reservation", "gonka-mainnet", 7, "payload", *sig));
  expect_other(RecoverStatementSigner("settlement", "gonka-mainnet", 7, "payloaD", *sig));
}

TEST(StatementTest, ChainIdAndShardIdChangeTheRecoveredAddress) {
  PrivateKey key = TestKey('\x33');
  auto sig = SignStatement(key, "round_certificate", "chain-a", 1, "m");
  ASSERT_TRUE(sig.ok());
  auto other_chain = RecoverStatementSigner("round_certificate", "chain-b", 1, "m", *sig);
  auto other_shard = RecoverStatementSigner("round_certificate", "chain-a", 2, "m", *sig);
  // Recovery from a different digest yields some other valid key almost surely.
  ASSERT_TRUE(other_chain.ok());
  ASSERT_TRUE(other_shard.ok());
  EXPECT_NE(*other_chain, AddressFromPublicKey(key.public_key()));
  EXPECT_NE(*other_shard, AddressFromPublicKey(key.public_key()));
  EXPECT_NE(*other_chain, *other_shard);
}

TEST(StatementTest, BadInputsAreInvalidArgument) {
  PrivateKey key = TestKey('\x44');
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(SignStatement(key, "BAD", "chain", 1, "m").status().code(), kInvalid);
  EXPECT_EQ(SignStatement(key, "ok", "", 1, "m").status().code(), kInvalid);
  auto sig = SignStatement(key, "ok", "chain", 1, "m");
  ASSERT_TRUE(sig.ok());
  EXPECT_EQ(RecoverStatementSigner("BAD", "chain", 1, "m", *sig).status().code(), kInvalid);
  EXPECT_EQ(RecoverStatementSigner("ok", "chain", 1, "m", sig->substr(0, 64)).status().code(),
            kInvalid);
  std::string bad_v = *sig;
  bad_v[64] = 4;
  EXPECT_EQ(RecoverStatementSigner("ok", "chain", 1, "m", bad_v).status().code(), kInvalid);
}

}  // namespace
}  // namespace ts::common
