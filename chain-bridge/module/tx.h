// Cosmos transaction encoding for the trainshard chain: decoding with caps (what the chain runs
// on untrusted bytes), tx hashes, message packing, and building SIGN_MODE_DIRECT-signed TxRaw
// bytes (what the CLI, the sidecar and tests use). Wire-compatible with Cosmos SDK.
// Pure functions; thread-safe.
#ifndef TS_CHAIN_BRIDGE_MODULE_TX_H_
#define TS_CHAIN_BRIDGE_MODULE_TX_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "cosmos/tx/signing/v1beta1/signing.pb.h"
#include "cosmos/tx/v1beta1/tx.pb.h"
#include "google/protobuf/any.pb.h"
#include "google/protobuf/message.h"

namespace ts::bridge {

// Caps on untrusted input, checked before parsing.
inline constexpr size_t kMaxTxBytes = 1 << 20;  // 1 MiB per tx
inline constexpr int kMaxMsgsPerTx = 64;

inline constexpr std::string_view kSecp256k1PubKeyType = "/cosmos.crypto.secp256k1.PubKey";

struct DecodedTx {
  cosmos::tx::v1beta1::TxRaw raw;
  cosmos::tx::v1beta1::TxBody body;
  cosmos::tx::v1beta1::AuthInfo auth_info;
  uint64_t fee_amount = 0;  // ngonka, from auth_info.fee.amount
  cosmos::tx::signing::v1beta1::SignMode sign_mode = cosmos::tx::signing::v1beta1::SIGN_MODE_DIRECT;
};

// What a tx pays: its gas limit and its fee in ngonka.
struct TxFee {
  uint64_t gas_limit = 0;
  uint64_t amount = 0;
};

enum class DecodeMode {
  kSigned,    // a tx for the mempool or a block
  kSimulate,  // a tx to simulate: its signature may be empty and its sign mode unspecified
};

// Decodes a TxRaw and its body and auth info, within the caps above. Errors name the field and
// report as the SDK's (tx_errors.h): tx too large (21); no signature (15) or more than one (14);
// an unparsable tx, unknown fields in the signed parts, no messages, more than kMaxMsgsPerTx,
// not exactly one signer, a sign mode other than SIGN_MODE_DIRECT or SIGN_MODE_LEGACY_AMINO_JSON
// (2); a public key that is not
// a 33-byte secp256k1 key (8); a fee that is not at most one coin of ngonka (10); a fee payer
// other than the signer or a fee granter (18).
absl::StatusOr<DecodedTx> DecodeTx(std::string_view tx_bytes,
                                   DecodeMode mode = DecodeMode::kSigned);

// The bytes SIGN_MODE_DIRECT signs (a serialized SignDoc).
std::string DirectSignBytes(std::string_view body_bytes, std::string_view auth_info_bytes,
                            std::string_view chain_id, uint64_t account_number);

// Upper-case hex SHA-256 of tx bytes, as Cosmos reports tx hashes.
std::string TxHash(std::string_view tx_bytes);

// Packs a message as google.protobuf.Any with type URL "/<full message name>".
google::protobuf::Any PackMsg(const google::protobuf::Message& msg);

// A gov v1 MsgSubmitProposal by `proposer` that executes `messages` if it passes, with an
// initial deposit of `deposit` ngonka (none when empty), packed as PackMsg does.
google::protobuf::Any GovProposalMsg(std::string_view proposer, std::string_view title,
                                     std::string_view summary, std::string_view deposit,
                                     const std::vector<google::protobuf::Any>& messages);

// The bytes whose SHA-256 the signer signed, for its sign mode (DirectSignBytes, or
// AminoJsonSignBytes: INVALID_ARGUMENT for a message without an amino JSON form).
absl::StatusOr<std::string> SignBytes(const DecodedTx& tx, std::string_view chain_id,
                                      uint64_t account_number);

// Builds and signs a one-signer TxRaw (paying `fee`, in `mode`: SIGN_MODE_DIRECT, or
// SIGN_MODE_LEGACY_AMINO_JSON for messages with an amino JSON form) and returns its bytes.
std::string BuildSignedTx(
    const common::PrivateKey& key, std::string_view chain_id, uint64_t account_number,
    uint64_t sequence, const std::vector<google::protobuf::Any>& msgs, TxFee fee,
    std::string_view memo = "",
    cosmos::tx::signing::v1beta1::SignMode mode = cosmos::tx::signing::v1beta1::SIGN_MODE_DIRECT);

// The tx a client simulates before signing, as Cosmos clients build it: the same body and
// signer (33-byte `public_key`, `sequence`), sign mode unspecified, an empty signature, no fee.
std::string BuildSimulateTx(std::string_view public_key, uint64_t sequence,
                            const std::vector<google::protobuf::Any>& msgs,
                            std::string_view memo = "");

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_TX_H_
