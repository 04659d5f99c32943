#include "chain-bridge/module/tx.h"

#include <string>

#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/str_cat.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/status.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"
#include "cosmos/tx/signing/v1beta1/signing.pb.h"

namespace ts::bridge {
namespace {

using cosmos::tx::v1beta1::AuthInfo;
using cosmos::tx::v1beta1::SignDoc;
using cosmos::tx::v1beta1::TxBody;
using cosmos::tx::v1beta1::TxRaw;

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(Cat(field, ": ", why));
}

}  // namespace

absl::StatusOr<DecodedTx> DecodeTx(std::string_view tx_bytes) {
  if (tx_bytes.empty()) return Invalid("tx", "empty");
  if (tx_bytes.size() > kMaxTxBytes) {
    return Invalid("tx", Cat(tx_bytes.size(), " bytes exceeds the cap of ", kMaxTxBytes, " bytes"));
  }
  DecodedTx tx;
  TS_RETURN_IF_ERROR(ParseMessageStrict("tx", tx_bytes, &tx.raw));
  TS_RETURN_IF_ERROR(ParseMessageStrict("tx.body", tx.raw.body_bytes(), &tx.body));
  TS_RETURN_IF_ERROR(ParseMessageStrict("tx.auth_info", tx.raw.auth_info_bytes(), &tx.auth_info));

  const TxBody& body = tx.body;
  if (body.messages_size() == 0) return Invalid("tx.body.messages", "no messages");
  if (body.messages_size() > kMaxMsgsPerTx) {
    return Invalid("tx.body.messages",
                   Cat(body.messages_size(), " messages exceed the cap of ", kMaxMsgsPerTx));
  }
  if (body.extension_options_size() > 0) {
    return Invalid("tx.body.extension_options", "extension options are not supported");
  }

  const AuthInfo& auth = tx.auth_info;
  if (auth.signer_infos_size() != 1) {
    return Invalid("tx.auth_info.signer_infos",
                   Cat(auth.signer_infos_size(), " signer infos, want exactly 1"));
  }
  if (tx.raw.signatures_size() != 1) {
    return Invalid("tx.signatures", Cat(tx.raw.signatures_size(), " signatures, want exactly 1"));
  }
  if (tx.raw.signatures(0).size() != common::kCompactSignatureSize) {
    return Invalid("tx.signatures[0]", Cat(tx.raw.signatures(0).size(), " bytes, want ",
                                           common::kCompactSignatureSize));
  }
  const auto& signer = auth.signer_infos(0);
  if (!signer.mode_info().has_single()) {
    return Invalid("tx.auth_info.signer_infos[0].mode_info", "not a single-signer mode");
  }
  if (signer.mode_info().single().mode() != cosmos::tx::signing::v1beta1::SIGN_MODE_DIRECT) {
    return Invalid(
        "tx.auth_info.signer_infos[0].mode_info.single.mode",
        Cat(static_cast<int>(signer.mode_info().single().mode()), " is not SIGN_MODE_DIRECT"));
  }
  if (!signer.has_public_key()) {
    return Invalid("tx.auth_info.signer_infos[0].public_key", "missing");
  }
  if (signer.public_key().type_url() != kSecp256k1PubKeyType) {
    return Invalid(
        "tx.auth_info.signer_infos[0].public_key.type_url",
        Cat("'", signer.public_key().type_url().substr(0, 128), "' is not ", kSecp256k1PubKeyType));
  }
  cosmos::crypto::secp256k1::PubKey pub;
  TS_RETURN_IF_ERROR(ParseMessageStrict("tx.auth_info.signer_infos[0].public_key",
                                        signer.public_key().value(), &pub));
  if (pub.key().size() != common::kPublicKeySize) {
    return Invalid("tx.auth_info.signer_infos[0].public_key.key",
                   Cat(pub.key().size(), " bytes, want ", common::kPublicKeySize));
  }
  return tx;
}

std::string DirectSignBytes(std::string_view body_bytes, std::string_view auth_info_bytes,
                            std::string_view chain_id, uint64_t account_number) {
  SignDoc doc;
  doc.set_body_bytes(std::string(body_bytes));
  doc.set_auth_info_bytes(std::string(auth_info_bytes));
  doc.set_chain_id(std::string(chain_id));
  doc.set_account_number(account_number);
  return DeterministicBytes(doc);
}

std::string TxHash(std::string_view tx_bytes) {
  return common::HexEncodeUpper(common::Sha256(tx_bytes));
}

google::protobuf::Any PackMsg(const google::protobuf::Message& msg) {
  google::protobuf::Any any;
  any.set_type_url(Cat("/", msg.GetDescriptor()->full_name()));
  any.set_value(DeterministicBytes(msg));
  return any;
}

std::string BuildSignedTx(const common::PrivateKey& key, std::string_view chain_id,
                          uint64_t account_number, uint64_t sequence,
                          const std::vector<google::protobuf::Any>& msgs, std::string_view memo) {
  TxBody body;
  for (const auto& msg : msgs) *body.add_messages() = msg;
  body.set_memo(std::string(memo));

  AuthInfo auth;
  auto* signer = auth.add_signer_infos();
  cosmos::crypto::secp256k1::PubKey pub;
  pub.set_key(key.public_key());
  *signer->mutable_public_key() = PackMsg(pub);
  signer->mutable_mode_info()->mutable_single()->set_mode(
      cosmos::tx::signing::v1beta1::SIGN_MODE_DIRECT);
  signer->set_sequence(sequence);
  auth.mutable_fee();  // present and empty: this chain charges no fees

  TxRaw raw;
  raw.set_body_bytes(DeterministicBytes(body));
  raw.set_auth_info_bytes(DeterministicBytes(auth));
  std::string digest = common::Sha256(
      DirectSignBytes(raw.body_bytes(), raw.auth_info_bytes(), chain_id, account_number));
  raw.add_signatures(key.SignCompact(digest));
  return DeterministicBytes(raw);
}

}  // namespace ts::bridge
