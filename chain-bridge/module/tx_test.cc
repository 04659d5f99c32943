#include "chain-bridge/module/tx.h"

#include <functional>
#include <string>

#include "chain-bridge/module/proto_util.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"
#include "cosmos/tx/signing/v1beta1/signing.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::bridge {
namespace {

constexpr TxFee kFee{200000, 250};

using cosmos::tx::v1beta1::AuthInfo;
using cosmos::tx::v1beta1::TxBody;
using cosmos::tx::v1beta1::TxRaw;
using ::testing::HasSubstr;

common::PrivateKey TestKey() {
  return common::PrivateKey::FromBytes(common::Sha256("tx-test-key")).value();
}

google::protobuf::Any Send(const std::string& amount) {
  cosmos::bank::v1beta1::MsgSend msg;
  msg.set_from_address("gonka1from");
  msg.set_to_address("gonka1to");
  auto* coin = msg.add_amount();
  coin->set_denom("ngonka");
  coin->set_amount(amount);
  return PackMsg(msg);
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(TxTest, PackMsgUsesTheFullNameAsTypeUrl) {
  google::protobuf::Any any = Send("5");
  EXPECT_EQ(any.type_url(), "/cosmos.bank.v1beta1.MsgSend");
  cosmos::bank::v1beta1::MsgSend back;
  ASSERT_TRUE(back.ParseFromString(any.value()));
  EXPECT_EQ(back.amount(0).amount(), "5");
}

TEST(TxTest, BuildSignedTxDecodesAndItsSignatureVerifies) {
  common::PrivateKey key = TestKey();
  std::string bytes = BuildSignedTx(key, "chain-a", 7, 3, {Send("1"), Send("2")}, kFee, "memo");
  auto tx = DecodeTx(bytes);
  ASSERT_TRUE(tx.ok()) << tx.status();
  EXPECT_EQ(tx->body.messages_size(), 2);
  EXPECT_EQ(tx->body.memo(), "memo");
  ASSERT_EQ(tx->auth_info.signer_infos_size(), 1);
  const auto& signer = tx->auth_info.signer_infos(0);
  EXPECT_EQ(signer.sequence(), 3u);
  EXPECT_EQ(signer.public_key().type_url(), kSecp256k1PubKeyType);
  EXPECT_EQ(signer.mode_info().single().mode(), cosmos::tx::signing::v1beta1::SIGN_MODE_DIRECT);
  cosmos::crypto::secp256k1::PubKey pub;
  ASSERT_TRUE(pub.ParseFromString(signer.public_key().value()));
  EXPECT_EQ(pub.key(), key.public_key());

  std::string digest = common::Sha256(
      DirectSignBytes(tx->raw.body_bytes(), tx->raw.auth_info_bytes(), "chain-a", 7));
  EXPECT_TRUE(common::VerifyCompact(key.public_key(), digest, tx->raw.signatures(0)).ok());
  // Another chain id or account number is another message.
  std::string other = common::Sha256(
      DirectSignBytes(tx->raw.body_bytes(), tx->raw.auth_info_bytes(), "chain-b", 7));
  EXPECT_FALSE(common::VerifyCompact(key.public_key(), other, tx->raw.signatures(0)).ok());
  other = common::Sha256(
      DirectSignBytes(tx->raw.body_bytes(), tx->raw.auth_info_bytes(), "chain-a", 8));
  EXPECT_FALSE(common::VerifyCompact(key.public_key(), other, tx->raw.signatures(0)).ok());
}

TEST(TxTest, DirectSignBytesIsASerializedSignDoc) {
  std::string bytes = DirectSignBytes("body", "auth", "chain-a", 300);
  cosmos::tx::v1beta1::SignDoc doc;
  ASSERT_TRUE(doc.ParseFromString(bytes));
  EXPECT_EQ(doc.body_bytes(), "body");
  EXPECT_EQ(doc.auth_info_bytes(), "auth");
  EXPECT_EQ(doc.chain_id(), "chain-a");
  EXPECT_EQ(doc.account_number(), 300u);
  // Field order and encoding as Cosmos SDK: 0a len body 12 len auth 1a len chain 20 varint.
  EXPECT_EQ(common::HexEncode(bytes),
            "0a04626f6479120461757468"
            "1a07636861696e2d61"
            "20ac02");
}

TEST(TxTest, TxHashIsUpperCaseHexSha256) {
  EXPECT_EQ(TxHash("abc"), "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD");
}

// Re-encodes a decoded tx after `mutate` changes its parts (signature left as it was).
std::string Mutated(const std::function<void(TxRaw*, TxBody*, AuthInfo*)>& mutate) {
  auto tx = DecodeTx(BuildSignedTx(TestKey(), "chain-a", 0, 0, {Send("1")}, kFee));
  EXPECT_TRUE(tx.ok());
  TxRaw raw = tx->raw;
  TxBody body = tx->body;
  AuthInfo auth = tx->auth_info;
  mutate(&raw, &body, &auth);
  raw.set_body_bytes(DeterministicBytes(body));
  raw.set_auth_info_bytes(DeterministicBytes(auth));
  return DeterministicBytes(raw);
}

TEST(TxTest, DecodeRefusesMalformedTxsNamingTheField) {
  auto refused = [](const std::string& bytes, const std::string& fragment) {
    auto tx = DecodeTx(bytes);
    EXPECT_EQ(tx.status().code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(Message(tx.status()), HasSubstr(fragment));
  };
  refused("", "tx: empty");
  refused(std::string(kMaxTxBytes + 1, '\0'), "exceeds the cap");
  refused("\x0a\xff\xff", "not a valid cosmos.tx.v1beta1.TxRaw");
  refused(Mutated([](TxRaw*, TxBody* body, AuthInfo*) { body->clear_messages(); }),
          "tx.body.messages: no messages");
  refused(Mutated([](TxRaw*, TxBody* body, AuthInfo*) {
            for (int i = 0; i < kMaxMsgsPerTx; ++i) *body->add_messages() = Send("1");
          }),
          "65 messages exceed the cap of 64");
  refused(
      Mutated([](TxRaw*, TxBody* body, AuthInfo*) { *body->add_extension_options() = Send("1"); }),
      "tx.body.extension_options");
  refused(Mutated([](TxRaw*, TxBody*, AuthInfo* auth) {
            *auth->add_signer_infos() = auth->signer_infos(0);
          }),
          "2 signer infos, want exactly 1");
  refused(Mutated([](TxRaw* raw, TxBody*, AuthInfo*) { raw->add_signatures("x"); }),
          "2 signatures, want exactly 1");
  refused(Mutated([](TxRaw* raw, TxBody*, AuthInfo*) { raw->set_signatures(0, "short"); }),
          "tx.signatures[0]: 5 bytes, want 64");
  refused(Mutated([](TxRaw*, TxBody*, AuthInfo* auth) {
            auth->mutable_signer_infos(0)->mutable_mode_info()->mutable_single()->set_mode(
                cosmos::tx::signing::v1beta1::SIGN_MODE_TEXTUAL);
          }),
          "2 is not SIGN_MODE_DIRECT or SIGN_MODE_LEGACY_AMINO_JSON");
  refused(Mutated([](TxRaw*, TxBody*, AuthInfo* auth) {
            auth->mutable_signer_infos(0)->mutable_public_key()->set_type_url(
                "/cosmos.crypto.ed25519.PubKey");
          }),
          "is not /cosmos.crypto.secp256k1.PubKey");
  refused(Mutated([](TxRaw*, TxBody*, AuthInfo* auth) {
            cosmos::crypto::secp256k1::PubKey pub;
            pub.set_key(std::string(65, '\x04'));
            auth->mutable_signer_infos(0)->mutable_public_key()->set_value(DeterministicBytes(pub));
          }),
          "public_key.key: 65 bytes, want 33");
  refused(Mutated([](TxRaw*, TxBody*, AuthInfo* auth) {
            auth->mutable_signer_infos(0)->clear_public_key();
          }),
          "public_key: missing");
}

TEST(TxTest, DecodeRefusesUnknownFieldsInTheSignedParts) {
  auto tx = DecodeTx(BuildSignedTx(TestKey(), "chain-a", 0, 0, {Send("1")}, kFee));
  ASSERT_TRUE(tx.ok());
  // Field 99 (varint) appended to the body, to the auth info, and to the envelope.
  const std::string extra = "\x98\x06\x01";
  TxRaw raw = tx->raw;
  raw.set_body_bytes(raw.body_bytes() + extra);
  auto refused = DecodeTx(DeterministicBytes(raw));
  EXPECT_THAT(Message(refused.status()), HasSubstr("tx.body: unknown field 99"));
  raw = tx->raw;
  raw.set_auth_info_bytes(raw.auth_info_bytes() + extra);
  refused = DecodeTx(DeterministicBytes(raw));
  EXPECT_THAT(Message(refused.status()), HasSubstr("tx.auth_info: unknown field 99"));
  refused = DecodeTx(DeterministicBytes(tx->raw) + extra);
  EXPECT_THAT(Message(refused.status()), HasSubstr("tx: unknown field 99"));
  // Nested: inside the signer info's mode info.
  AuthInfo auth = tx->auth_info;
  auth.mutable_signer_infos(0)
      ->mutable_mode_info()
      ->mutable_single()
      ->GetReflection()
      ->MutableUnknownFields(auth.mutable_signer_infos(0)->mutable_mode_info()->mutable_single())
      ->AddVarint(42, 1);
  raw = tx->raw;
  raw.set_auth_info_bytes(DeterministicBytes(auth));
  refused = DecodeTx(DeterministicBytes(raw));
  EXPECT_THAT(Message(refused.status()),
              HasSubstr("unknown field 42 in cosmos.tx.v1beta1.ModeInfo.Single"));
}

}  // namespace
}  // namespace ts::bridge
