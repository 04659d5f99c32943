#include "chain-bridge/module/member_key.h"

#include "common/crypto/secp256k1.h"

namespace ts::bridge {

absl::StatusOr<std::string> UncompressMemberKey(std::string_view compressed) {
  return common::UncompressPublicKey(compressed);
}

bool VerifyWithMemberKey(std::string_view member_key, std::string_view digest,
                         std::string_view signature) {
  if (member_key.size() != kMemberKeySize ||
      signature.size() != common::kRecoverableSignatureSize) {
    return false;
  }
  if (static_cast<unsigned char>(signature[64]) > 3) return false;
  // R||S under the rules of VerifyCompact (R and S below the group order, low S); V is only
  // range-checked, as a known key does not need it.
  return common::VerifyCompact(member_key, digest, signature.substr(0, 64)).ok();
}

}  // namespace ts::bridge
