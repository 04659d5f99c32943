#include "chain-bridge/module/member_key.h"

#include <secp256k1.h>

#include "chain-bridge/module/str_cat.h"
#include "common/crypto/secp256k1.h"

namespace ts::bridge {
namespace {

constexpr size_t kDigestSize = 32;

const unsigned char* Bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// libsecp256k1's static context allocates nothing and serves parsing and verification (no
// secret is involved). The library asks for its self-test before that context is used; it runs
// once, and fails (aborting) only on a miscompiled library, never on any input.
const secp256k1_context* Context() {
  static const secp256k1_context* const ctx = [] {
    secp256k1_selftest();
    return secp256k1_context_static;
  }();
  return ctx;
}

}  // namespace

absl::StatusOr<std::string> UncompressMemberKey(std::string_view compressed) {
  if (compressed.size() != common::kPublicKeySize) {
    return absl::InvalidArgumentError(
        Cat("public key: ", compressed.size(), " bytes, want ", common::kPublicKeySize));
  }
  secp256k1_pubkey key;
  if (secp256k1_ec_pubkey_parse(Context(), &key, Bytes(compressed), compressed.size()) != 1) {
    return absl::InvalidArgumentError("public key: not a point on secp256k1");
  }
  std::string out(kMemberKeySize, '\0');
  size_t size = out.size();
  if (secp256k1_ec_pubkey_serialize(Context(), reinterpret_cast<unsigned char*>(out.data()), &size,
                                    &key, SECP256K1_EC_UNCOMPRESSED) != 1 ||
      size != kMemberKeySize) {
    return absl::InternalError("public key: uncompressed serialization failed");
  }
  return out;
}

bool VerifyWithMemberKey(std::string_view member_key, std::string_view digest,
                         std::string_view signature) {
  if (member_key.size() != kMemberKeySize || digest.size() != kDigestSize ||
      signature.size() != common::kRecoverableSignatureSize) {
    return false;
  }
  if (static_cast<unsigned char>(signature[64]) > 3) return false;
  secp256k1_pubkey key;
  if (secp256k1_ec_pubkey_parse(Context(), &key, Bytes(member_key), member_key.size()) != 1) {
    return false;
  }
  secp256k1_ecdsa_signature sig;
  if (secp256k1_ecdsa_signature_parse_compact(Context(), &sig, Bytes(signature)) != 1) {
    return false;
  }
  // normalize reports whether S was above n/2: the malleated twin is refused here by name, as
  // recovery and common::VerifyCompact refuse it (secp256k1_ecdsa_verify would too).
  secp256k1_ecdsa_signature normalized;
  if (secp256k1_ecdsa_signature_normalize(Context(), &normalized, &sig) == 1) {
    return false;
  }
  return secp256k1_ecdsa_verify(Context(), &sig, Bytes(digest), &key) == 1;
}

}  // namespace ts::bridge
