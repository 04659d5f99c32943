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
};

// Decodes a TxRaw and its body and auth info, within the caps above. INVALID_ARGUMENT naming
// the field for anything malformed: oversize, unparsable, unknown fields in the signed parts,
// no messages, more than kMaxMsgsPerTx, not exactly one signer and one signature, a sign mode
// other than SIGN_MODE_DIRECT, a public key that is not a 33-byte secp256k1 key.
absl::StatusOr<DecodedTx> DecodeTx(std::string_view tx_bytes);

// The bytes SIGN_MODE_DIRECT signs (a serialized SignDoc).
std::string DirectSignBytes(std::string_view body_bytes, std::string_view auth_info_bytes,
                            std::string_view chain_id, uint64_t account_number);

// Upper-case hex SHA-256 of tx bytes, as Cosmos reports tx hashes.
std::string TxHash(std::string_view tx_bytes);

// Packs a message as google.protobuf.Any with type URL "/<full message name>".
google::protobuf::Any PackMsg(const google::protobuf::Message& msg);

// Builds and signs a one-signer TxRaw (SIGN_MODE_DIRECT, no fee) and returns its bytes.
std::string BuildSignedTx(const common::PrivateKey& key, std::string_view chain_id,
                          uint64_t account_number, uint64_t sequence,
                          const std::vector<google::protobuf::Any>& msgs,
                          std::string_view memo = "");

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_TX_H_
