#include "common/crypto/signing.h"

#include "absl/strings/str_cat.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/status.h"

namespace ts::common {
namespace {

// Debian's Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// which StrCat takes but std::string_view does not convert to.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr size_t kKindSizeMax = 32;
constexpr size_t kChainIdSizeMax = 64;

absl::Status CheckKind(std::string_view kind) {
  if (kind.empty() || kind.size() > kKindSizeMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind: length ", kind.size(), " is outside 1..", kKindSizeMax));
  }
  for (char c : kind) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) {
      return absl::InvalidArgumentError(
          absl::StrCat("kind: '", ToAbsl(kind), "' has a character outside [a-z_]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckChainId(std::string_view chain_id) {
  if (chain_id.empty() || chain_id.size() > kChainIdSizeMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("chain_id: length ", chain_id.size(), " is outside 1..", kChainIdSizeMax));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SignBytes(std::string_view kind, std::string_view chain_id,
                                      uint64_t shard_id, std::string_view message) {
  TS_RETURN_IF_ERROR(CheckKind(kind));
  TS_RETURN_IF_ERROR(CheckChainId(chain_id));
  std::string out;
  out.reserve(kSignDomain.size() + kind.size() + 2 + chain_id.size() + 8 + message.size());
  out.append(kSignDomain);
  out.append(kind);
  // The 0x00 ends the kind (which cannot contain it) and the length byte delimits the chain id,
  // so no two (kind, chain_id, shard_id, message) tuples share sign bytes.
  out.push_back('\0');
  out.push_back(static_cast<char>(chain_id.size()));
  out.append(chain_id);
  for (int shift = 56; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((shard_id >> shift) & 0xff));
  }
  out.append(message);
  return out;
}

absl::StatusOr<std::string> SignStatement(const PrivateKey& key, std::string_view kind,
                                          std::string_view chain_id, uint64_t shard_id,
                                          std::string_view message) {
  TS_ASSIGN_OR_RETURN(std::string bytes, SignBytes(kind, chain_id, shard_id, message));
  return key.SignRecoverable(Sha256(bytes));
}

absl::StatusOr<std::string> RecoverStatementSigner(std::string_view kind, std::string_view chain_id,
                                                   uint64_t shard_id, std::string_view message,
                                                   std::string_view signature) {
  TS_ASSIGN_OR_RETURN(std::string bytes, SignBytes(kind, chain_id, shard_id, message));
  TS_ASSIGN_OR_RETURN(std::string public_key, RecoverPublicKey(Sha256(bytes), signature));
  return AddressFromPublicKey(public_key);
}

}  // namespace ts::common
