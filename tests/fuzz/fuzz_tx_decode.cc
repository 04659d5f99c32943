// Fuzz target: the chain's transaction decoder, the first code to touch tx bytes from the
// network. Checks that refusals are INVALID_ARGUMENT, that an accepted tx has what DecodeTx
// promises, that re-encoding it decodes to the same signed parts, and that the tx hash and the
// SIGN_MODE_DIRECT sign bytes are well-formed and deterministic. Signature verification runs on
// whatever was accepted and must only answer, never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/status.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"
#include "cosmos/tx/signing/v1beta1/signing.pb.h"
#include "cosmos/tx/v1beta1/tx.pb.h"

namespace {

constexpr std::string_view kChainId = "gonka-fuzz";

bool IsUpperHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'))) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string hash = ts::bridge::TxHash(bytes);
  TS_CHECK(hash.size() == 64 && IsUpperHex(hash));

  auto decoded = ts::bridge::DecodeTx(bytes);
  if (!decoded.ok()) {
    TS_CHECK(decoded.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const ts::bridge::DecodedTx& tx = *decoded;

  // What the header promises about an accepted tx.
  TS_CHECK(size <= ts::bridge::kMaxTxBytes);
  TS_CHECK(tx.body.messages_size() >= 1);
  TS_CHECK(tx.body.messages_size() <= ts::bridge::kMaxMsgsPerTx);
  TS_CHECK(tx.auth_info.signer_infos_size() == 1);
  TS_CHECK(tx.raw.signatures_size() == 1);
  const auto& signer = tx.auth_info.signer_infos(0);
  TS_CHECK(signer.mode_info().has_single());
  TS_CHECK(signer.mode_info().single().mode() == cosmos::tx::signing::v1beta1::SIGN_MODE_DIRECT);
  TS_CHECK(signer.public_key().type_url() == ts::bridge::kSecp256k1PubKeyType);
  cosmos::crypto::secp256k1::PubKey pub;
  TS_CHECK(pub.ParseFromString(signer.public_key().value()));
  TS_CHECK(pub.key().size() == ts::common::kPublicKeySize);

  // The body and auth info DecodeTx returns are the ones the raw bytes carry.
  cosmos::tx::v1beta1::TxBody body;
  TS_CHECK(body.ParseFromString(tx.raw.body_bytes()));
  TS_CHECK(body.SerializeAsString() == tx.body.SerializeAsString());
  cosmos::tx::v1beta1::AuthInfo auth_info;
  TS_CHECK(auth_info.ParseFromString(tx.raw.auth_info_bytes()));
  TS_CHECK(auth_info.SerializeAsString() == tx.auth_info.SerializeAsString());

  // Re-encoding the TxRaw keeps it acceptable and keeps the signed parts byte for byte.
  const std::string reencoded = tx.raw.SerializeAsString();
  auto again = ts::bridge::DecodeTx(reencoded);
  TS_CHECK(again.ok());
  TS_CHECK(again->raw.body_bytes() == tx.raw.body_bytes());
  TS_CHECK(again->raw.auth_info_bytes() == tx.raw.auth_info_bytes());
  TS_CHECK(again->raw.signatures(0) == tx.raw.signatures(0));
  const std::string rehash = ts::bridge::TxHash(reencoded);
  TS_CHECK(rehash.size() == 64 && IsUpperHex(rehash));
  TS_CHECK((rehash == hash) == (reencoded == bytes));

  // SIGN_MODE_DIRECT sign bytes are deterministic and are a SignDoc of exactly these parts.
  const uint64_t account_number = signer.sequence();
  const std::string sign_bytes = ts::bridge::DirectSignBytes(
      tx.raw.body_bytes(), tx.raw.auth_info_bytes(), kChainId, account_number);
  TS_CHECK(sign_bytes == ts::bridge::DirectSignBytes(tx.raw.body_bytes(), tx.raw.auth_info_bytes(),
                                                     kChainId, account_number));
  cosmos::tx::v1beta1::SignDoc doc;
  TS_CHECK(doc.ParseFromString(sign_bytes));
  TS_CHECK(doc.body_bytes() == tx.raw.body_bytes());
  TS_CHECK(doc.auth_info_bytes() == tx.raw.auth_info_bytes());
  TS_CHECK(doc.chain_id() == kChainId);
  TS_CHECK(doc.account_number() == account_number);

  const absl::Status verified =
      ts::common::VerifyCompact(pub.key(), ts::common::Sha256(sign_bytes), tx.raw.signatures(0));
  TS_CHECK(verified.ok() || verified.code() == absl::StatusCode::kInvalidArgument ||
           verified.code() == absl::StatusCode::kUnauthenticated);
  return 0;
}
