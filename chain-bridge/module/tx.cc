#include "chain-bridge/module/tx.h"

#include <string>

#include "chain-bridge/module/amino_json.h"
#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/str_cat.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/status.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "cosmos/tx/signing/v1beta1/signing.pb.h"

namespace ts::bridge {
namespace {

using cosmos::tx::v1beta1::AuthInfo;
using cosmos::tx::v1beta1::SignDoc;
using cosmos::tx::v1beta1::TxBody;
using cosmos::tx::v1beta1::TxRaw;

absl::Status Invalid(std::string_view field, std::string_view why,
                     SdkCode code = SdkCode::kTxDecode) {
  return SdkError(code, Cat(field, ": ", why));
}

// A parse failure reports as the SDK's decode error, naming the field as before.
absl::Status Decode(absl::Status parsed) {
  if (parsed.ok()) return parsed;
  return SdkError(SdkCode::kTxDecode, parsed);
}

absl::StatusOr<uint64_t> FeeAmount(const AuthInfo& auth) {
  const auto& fee = auth.fee();
  if (!fee.granter().empty()) {
    return Invalid("tx.auth_info.fee.granter", "fee grants are not supported",
                   SdkCode::kInvalidRequest);
  }
  if (fee.amount_size() == 0) return 0;
  if (fee.amount_size() > 1) {
    return Invalid("tx.auth_info.fee.amount",
                   Cat(fee.amount_size(), " coins, want at most one (", common::kDenom, ")"),
                   SdkCode::kInvalidCoins);
  }
  if (fee.amount(0).denom() != common::kDenom) {
    return Invalid("tx.auth_info.fee.amount[0].denom",
                   Cat("'", fee.amount(0).denom().substr(0, 64), "' is not ", common::kDenom),
                   SdkCode::kInvalidCoins);
  }
  auto amount = common::ParseAmount("tx.auth_info.fee.amount[0].amount", fee.amount(0).amount());
  if (!amount.ok()) return SdkError(SdkCode::kInvalidCoins, amount.status());
  return *amount;
}

}  // namespace

absl::StatusOr<DecodedTx> DecodeTx(std::string_view tx_bytes, DecodeMode mode) {
  const bool simulate = mode == DecodeMode::kSimulate;
  if (tx_bytes.empty()) return Invalid("tx", "empty");
  if (tx_bytes.size() > kMaxTxBytes) {
    return Invalid("tx", Cat(tx_bytes.size(), " bytes exceeds the cap of ", kMaxTxBytes, " bytes"),
                   SdkCode::kTxTooLarge);
  }
  DecodedTx tx;
  TS_RETURN_IF_ERROR(Decode(ParseMessageStrict("tx", tx_bytes, &tx.raw)));
  TS_RETURN_IF_ERROR(Decode(ParseMessageStrict("tx.body", tx.raw.body_bytes(), &tx.body)));
  TS_RETURN_IF_ERROR(
      Decode(ParseMessageStrict("tx.auth_info", tx.raw.auth_info_bytes(), &tx.auth_info)));

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
    return Invalid(
        "tx.signatures", Cat(tx.raw.signatures_size(), " signatures, want exactly 1"),
        tx.raw.signatures_size() == 0 ? SdkCode::kNoSignatures : SdkCode::kTooManySignatures);
  }
  if (!(simulate && tx.raw.signatures(0).empty()) &&
      tx.raw.signatures(0).size() != common::kCompactSignatureSize) {
    return Invalid("tx.signatures[0]", Cat(tx.raw.signatures(0).size(), " bytes, want ",
                                           common::kCompactSignatureSize));
  }
  const auto& signer = auth.signer_infos(0);
  if (!signer.mode_info().has_single()) {
    return Invalid("tx.auth_info.signer_infos[0].mode_info", "not a single-signer mode");
  }
  const auto sign_mode = signer.mode_info().single().mode();
  tx.sign_mode = sign_mode;
  if (sign_mode != cosmos::tx::signing::v1beta1::SIGN_MODE_DIRECT &&
      sign_mode != cosmos::tx::signing::v1beta1::SIGN_MODE_LEGACY_AMINO_JSON &&
      !(simulate && sign_mode == cosmos::tx::signing::v1beta1::SIGN_MODE_UNSPECIFIED)) {
    return Invalid("tx.auth_info.signer_infos[0].mode_info.single.mode",
                   Cat(static_cast<int>(signer.mode_info().single().mode()),
                       " is not SIGN_MODE_DIRECT or SIGN_MODE_LEGACY_AMINO_JSON"));
  }
  if (!signer.has_public_key()) {
    return Invalid("tx.auth_info.signer_infos[0].public_key", "missing", SdkCode::kInvalidPubKey);
  }
  if (signer.public_key().type_url() != kSecp256k1PubKeyType) {
    return Invalid(
        "tx.auth_info.signer_infos[0].public_key.type_url",
        Cat("'", signer.public_key().type_url().substr(0, 128), "' is not ", kSecp256k1PubKeyType),
        SdkCode::kInvalidPubKey);
  }
  cosmos::crypto::secp256k1::PubKey pub;
  absl::Status parsed = ParseMessageStrict("tx.auth_info.signer_infos[0].public_key",
                                           signer.public_key().value(), &pub);
  if (!parsed.ok()) return SdkError(SdkCode::kInvalidPubKey, parsed);
  if (pub.key().size() != common::kPublicKeySize) {
    return Invalid("tx.auth_info.signer_infos[0].public_key.key",
                   Cat(pub.key().size(), " bytes, want ", common::kPublicKeySize),
                   SdkCode::kInvalidPubKey);
  }
  if (!auth.fee().payer().empty() &&
      auth.fee().payer() != common::AddressFromPublicKey(pub.key())) {
    return Invalid(
        "tx.auth_info.fee.payer",
        Cat("'", auth.fee().payer().substr(0, 128), "' is not the signer: only the signer may pay"),
        SdkCode::kInvalidRequest);
  }
  TS_ASSIGN_OR_RETURN(tx.fee_amount, FeeAmount(auth));
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

google::protobuf::Any GovProposalMsg(std::string_view proposer, std::string_view title,
                                     std::string_view summary, std::string_view deposit,
                                     const std::vector<google::protobuf::Any>& messages) {
  cosmos::gov::v1::MsgSubmitProposal msg;
  msg.set_proposer(std::string(proposer));
  msg.set_title(std::string(title));
  msg.set_summary(std::string(summary));
  if (!deposit.empty()) {
    cosmos::base::v1beta1::Coin* coin = msg.add_initial_deposit();
    coin->set_denom(std::string(common::kDenom));
    coin->set_amount(std::string(deposit));
  }
  for (const google::protobuf::Any& m : messages) *msg.add_messages() = m;
  return PackMsg(msg);
}

namespace {

// The unsigned parts of a one-signer tx.
TxRaw UnsignedTx(std::string_view public_key, uint64_t sequence,
                 const std::vector<google::protobuf::Any>& msgs, std::string_view memo,
                 cosmos::tx::signing::v1beta1::SignMode mode, TxFee fee) {
  TxBody body;
  for (const auto& msg : msgs) *body.add_messages() = msg;
  body.set_memo(std::string(memo));

  AuthInfo auth;
  auto* signer = auth.add_signer_infos();
  cosmos::crypto::secp256k1::PubKey pub;
  pub.set_key(std::string(public_key));
  *signer->mutable_public_key() = PackMsg(pub);
  signer->mutable_mode_info()->mutable_single()->set_mode(mode);
  signer->set_sequence(sequence);
  auto* tx_fee = auth.mutable_fee();
  tx_fee->set_gas_limit(fee.gas_limit);
  if (fee.amount > 0) {
    auto* coin = tx_fee->add_amount();
    coin->set_denom(std::string(common::kDenom));
    coin->set_amount(common::FormatAmount(fee.amount));
  }

  TxRaw raw;
  raw.set_body_bytes(DeterministicBytes(body));
  raw.set_auth_info_bytes(DeterministicBytes(auth));
  return raw;
}

}  // namespace

std::string BuildSimulateTx(std::string_view public_key, uint64_t sequence,
                            const std::vector<google::protobuf::Any>& msgs, std::string_view memo) {
  TxRaw raw = UnsignedTx(public_key, sequence, msgs, memo,
                         cosmos::tx::signing::v1beta1::SIGN_MODE_UNSPECIFIED, TxFee{});
  raw.add_signatures("");
  return DeterministicBytes(raw);
}

absl::StatusOr<std::string> SignBytes(const DecodedTx& tx, std::string_view chain_id,
                                      uint64_t account_number) {
  if (tx.sign_mode == cosmos::tx::signing::v1beta1::SIGN_MODE_LEGACY_AMINO_JSON) {
    return AminoJsonSignBytes(tx.body, tx.auth_info, chain_id, account_number,
                              tx.auth_info.signer_infos(0).sequence());
  }
  return DirectSignBytes(tx.raw.body_bytes(), tx.raw.auth_info_bytes(), chain_id, account_number);
}

std::string BuildSignedTx(const common::PrivateKey& key, std::string_view chain_id,
                          uint64_t account_number, uint64_t sequence,
                          const std::vector<google::protobuf::Any>& msgs, TxFee fee,
                          std::string_view memo, cosmos::tx::signing::v1beta1::SignMode mode) {
  TxRaw raw = UnsignedTx(key.public_key(), sequence, msgs, memo, mode, fee);
  if (mode == cosmos::tx::signing::v1beta1::SIGN_MODE_LEGACY_AMINO_JSON) {
    DecodedTx parts;
    parts.body.ParseFromString(raw.body_bytes());
    parts.auth_info.ParseFromString(raw.auth_info_bytes());
    // A message without an amino form signs nothing; the chain refuses the tx, naming it.
    auto bytes =
        AminoJsonSignBytes(parts.body, parts.auth_info, chain_id, account_number, sequence);
    raw.add_signatures(key.SignCompact(common::Sha256(bytes.ok() ? *bytes : "")));
    return DeterministicBytes(raw);
  }
  std::string digest = common::Sha256(
      DirectSignBytes(raw.body_bytes(), raw.auth_info_bytes(), chain_id, account_number));
  raw.add_signatures(key.SignCompact(digest));
  return DeterministicBytes(raw);
}

}  // namespace ts::bridge
