#include "chain-bridge/module/member_key.h"

#include <string>

#include "chain-bridge/module/keeper.h"
#include "chain-bridge/module/kv_overlay.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/hex.h"
#include "gtest/gtest.h"

namespace ts::bridge {
namespace {

common::PrivateKey Key(const std::string& name) {
  return common::PrivateKey::FromBytes(common::Sha256("member-key-test/" + name)).value();
}

// n - S for the big-endian S in bytes 32..63: the high-S twin of a low-S signature.
std::string HighSTwin(std::string signature) {
  const std::string n =
      common::HexDecode("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141").value();
  int borrow = 0;
  for (int i = 31; i >= 0; --i) {
    int diff = static_cast<uint8_t>(n[static_cast<size_t>(i)]) -
               static_cast<uint8_t>(signature[32 + static_cast<size_t>(i)]) - borrow;
    borrow = diff < 0 ? 1 : 0;
    signature[32 + static_cast<size_t>(i)] = static_cast<char>(diff + 256 * borrow);
  }
  signature[64] = static_cast<char>(signature[64] ^ 1);  // the twin recovers with the other V
  return signature;
}

TEST(MemberKeyTest, UncompressedFormOfACompressedKey) {
  common::PrivateKey key = Key("a");
  auto uncompressed = UncompressMemberKey(key.public_key());
  ASSERT_TRUE(uncompressed.ok()) << uncompressed.status();
  ASSERT_EQ(uncompressed->size(), kMemberKeySize);
  EXPECT_EQ((*uncompressed)[0], '\x04');
  // X is the compressed key's X; Y's parity is the compressed key's prefix.
  EXPECT_EQ(uncompressed->substr(1, 32), key.public_key().substr(1));
  EXPECT_EQ(static_cast<uint8_t>((*uncompressed)[64]) & 1,
            static_cast<uint8_t>(key.public_key()[0]) & 1);

  EXPECT_EQ(UncompressMemberKey(key.public_key().substr(0, 32)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UncompressMemberKey(*uncompressed).status().code(), absl::StatusCode::kInvalidArgument);
  // x = p + 1 is not a field element, so no point has it.
  std::string off_curve = "\x02" + std::string(32, '\xff');
  EXPECT_EQ(UncompressMemberKey(off_curve).status().code(), absl::StatusCode::kInvalidArgument);
}

class VerifyWithMemberKeyTest : public ::testing::Test {
 protected:
  VerifyWithMemberKeyTest()
      : key_(Key("signer")),
        member_key_(UncompressMemberKey(key_.public_key()).value()),
        digest_(common::Sha256("statement")),
        signature_(key_.SignRecoverable(digest_)) {}

  common::PrivateKey key_;
  std::string member_key_;
  std::string digest_;
  std::string signature_;
};

TEST_F(VerifyWithMemberKeyTest, AcceptsTheSignersSignatureOnly) {
  EXPECT_TRUE(VerifyWithMemberKey(member_key_, digest_, signature_));
  // Another key, another digest, a flipped bit.
  std::string other = UncompressMemberKey(Key("other").public_key()).value();
  EXPECT_FALSE(VerifyWithMemberKey(other, digest_, signature_));
  EXPECT_FALSE(VerifyWithMemberKey(member_key_, common::Sha256("other statement"), signature_));
  std::string corrupted = signature_;
  corrupted[5] = static_cast<char>(corrupted[5] ^ 0x10);
  EXPECT_FALSE(VerifyWithMemberKey(member_key_, digest_, corrupted));
  // The same signature recovers to the same key: the two checks agree.
  EXPECT_EQ(common::RecoverPublicKey(digest_, signature_).value(), key_.public_key());
}

TEST_F(VerifyWithMemberKeyTest, RefusesMalformedInputs) {
  EXPECT_FALSE(VerifyWithMemberKey(key_.public_key(), digest_, signature_));  // compressed
  EXPECT_FALSE(VerifyWithMemberKey(member_key_, digest_.substr(1), signature_));
  EXPECT_FALSE(VerifyWithMemberKey(member_key_, digest_, signature_.substr(0, 64)));
  EXPECT_FALSE(VerifyWithMemberKey(member_key_, digest_, signature_ + "x"));
  std::string not_a_point = member_key_;
  not_a_point[64] = static_cast<char>(not_a_point[64] ^ 1);  // (X, Y+1) is off the curve
  EXPECT_FALSE(VerifyWithMemberKey(not_a_point, digest_, signature_));
  std::string r_too_big = signature_;
  for (size_t i = 0; i < 32; ++i) r_too_big[i] = '\xff';
  EXPECT_FALSE(VerifyWithMemberKey(member_key_, digest_, r_too_big));
}

TEST_F(VerifyWithMemberKeyTest, RecoveryByteIsRangeCheckedAndHighSIsRefused) {
  // V only says which key recovery would find; against a known key any V in 0..3 is accepted
  // and anything above is refused, as RecoverPublicKey refuses it.
  for (int v = 0; v <= 3; ++v) {
    std::string with_v = signature_;
    with_v[64] = static_cast<char>(v);
    EXPECT_TRUE(VerifyWithMemberKey(member_key_, digest_, with_v)) << "V " << v;
  }
  for (int v : {4, 27, 255}) {
    std::string with_v = signature_;
    with_v[64] = static_cast<char>(v);
    EXPECT_FALSE(VerifyWithMemberKey(member_key_, digest_, with_v)) << "V " << v;
  }
  // The malleated high-S twin is mathematically valid but refused, as recovery refuses it.
  std::string twin = HighSTwin(signature_);
  EXPECT_FALSE(VerifyWithMemberKey(member_key_, digest_, twin));
  EXPECT_FALSE(common::RecoverPublicKey(digest_, twin).ok());
}

TEST_F(VerifyWithMemberKeyTest, CacheRemembersSuccessesPerKey) {
  SigCache cache;
  EXPECT_TRUE(cache.Verify(member_key_, digest_, signature_));
  EXPECT_EQ(cache.verified_size(), 1u);
  EXPECT_TRUE(cache.Verify(member_key_, digest_, signature_));
  EXPECT_EQ(cache.verified_size(), 1u);
  // A remembered (digest, signature) does not verify for another key: the key is in the entry.
  std::string other = UncompressMemberKey(Key("other").public_key()).value();
  EXPECT_FALSE(cache.Verify(other, digest_, signature_));
  // Failures are not remembered.
  EXPECT_FALSE(cache.Verify(member_key_, digest_, HighSTwin(signature_)));
  EXPECT_EQ(cache.verified_size(), 1u);

  auto recovered = cache.Recover(digest_, signature_);
  ASSERT_TRUE(recovered.ok());
  EXPECT_EQ(recovered->public_key, key_.public_key());
  EXPECT_EQ(recovered->address, common::AddressFromPublicKey(key_.public_key()));
  EXPECT_EQ(cache.recovered_size(), 1u);
  EXPECT_EQ(cache.Recover(digest_, signature_)->address, recovered->address);
  EXPECT_EQ(cache.recovered_size(), 1u);
  EXPECT_FALSE(cache.Recover(digest_, HighSTwin(signature_)).ok());
  EXPECT_EQ(cache.recovered_size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// The finalized state and overlays over it

TEST(KvStateTest, ApplyKeepsMapAndIndexTogether) {
  KvState state;
  state.Assign({{"a", "1"}, {"b", "2"}});
  ASSERT_NE(state.Find("a"), nullptr);
  EXPECT_EQ(*state.Find("a"), "1");
  EXPECT_EQ(state.Find("c"), nullptr);

  EXPECT_FALSE(state.Apply("a", std::string("1")));  // same value: no change
  EXPECT_FALSE(state.Apply("c", std::nullopt));      // deleting an absent key: no change
  EXPECT_TRUE(state.Apply("a", std::string("one")));
  EXPECT_TRUE(state.Apply("c", std::string("3")));
  EXPECT_TRUE(state.Apply("b", std::nullopt));
  EXPECT_EQ(*state.Find("a"), "one");
  EXPECT_EQ(*state.Find("c"), "3");
  EXPECT_EQ(state.Find("b"), nullptr);
  EXPECT_EQ(state.map(), (KvState::Map{{"a", "one"}, {"c", "3"}}));
  // Re-adding a deleted key and many others (the index rehashes) keeps every lookup right.
  EXPECT_TRUE(state.Apply("b", std::string("again")));
  for (int i = 0; i < 1000; ++i) state.Apply("k" + std::to_string(i), std::to_string(i));
  for (int i = 0; i < 1000; i += 2) state.Apply("k" + std::to_string(i), std::nullopt);
  EXPECT_EQ(state.map().size(), 3u + 500u);
  for (int i = 0; i < 1000; ++i) {
    const std::string* found = state.Find("k" + std::to_string(i));
    if (i % 2 == 0) {
      EXPECT_EQ(found, nullptr) << i;
    } else {
      ASSERT_NE(found, nullptr) << i;
      EXPECT_EQ(*found, std::to_string(i));
    }
  }
  EXPECT_EQ(*state.Find("b"), "again");
}

TEST(KvOverlayTest, BranchesReadThroughAndCommitUpwards) {
  KvState state;
  state.Assign({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  KvOverlay block(&state);
  block.Set("a", "block");
  block.Delete("b");
  KvOverlay tx(&block);
  EXPECT_EQ(*tx.Find("a"), "block");
  EXPECT_EQ(tx.Find("b"), nullptr);
  EXPECT_FALSE(tx.Contains("b"));
  EXPECT_EQ(*tx.Get("c"), "3");
  tx.Set("b", "tx");
  tx.Delete("c");
  tx.Set("d", "4");
  // Nothing is visible below the branch until it commits.
  EXPECT_EQ(block.Find("b"), nullptr);
  EXPECT_EQ(*block.Find("c"), "3");
  tx.Commit();
  EXPECT_TRUE(tx.writes().empty());
  EXPECT_EQ(*block.Find("b"), "tx");
  EXPECT_EQ(block.Find("c"), nullptr);
  EXPECT_EQ(*block.Find("d"), "4");
  EXPECT_EQ(*block.Find("a"), "block");
  auto scanned = block.Scan("");
  ASSERT_EQ(scanned.size(), 3u);
  EXPECT_EQ(scanned[0], (std::pair<std::string, std::string>{"a", "block"}));
  EXPECT_EQ(scanned[1], (std::pair<std::string, std::string>{"b", "tx"}));
  EXPECT_EQ(scanned[2], (std::pair<std::string, std::string>{"d", "4"}));
  // A commit into an empty parent hands the writes over whole.
  KvOverlay empty_parent(&state);
  KvOverlay child(&empty_parent);
  child.Set("z", "26");
  child.Commit();
  EXPECT_EQ(*empty_parent.Find("z"), "26");
  // The finalized state itself is untouched by overlays.
  EXPECT_EQ(state.map(), (KvState::Map{{"a", "1"}, {"b", "2"}, {"c", "3"}}));
  KvOverlay::Writes taken = block.TakeWrites();
  EXPECT_TRUE(block.writes().empty());
  EXPECT_EQ(taken.size(), 4u);
}

}  // namespace
}  // namespace ts::bridge
