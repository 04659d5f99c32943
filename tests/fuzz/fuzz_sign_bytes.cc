// Fuzz target: domain-separated sign bytes and statement signer recovery (statements and their
// signatures arrive from peers and from the chain). Input layout: tests/fuzz/sign_bytes_input.h.
// Checks that SignBytes accepts exactly the documented kinds and chain ids, that its output
// parses back into the fields it was given, and that recovery never crashes and agrees with
// recovering the key from SHA-256 of the sign bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/signing.h"
#include "common/status.h"
#include "tests/fuzz/sign_bytes_input.h"

namespace {

bool ValidKind(std::string_view kind) {
  if (kind.empty() || kind.size() > 32) return false;
  for (char c : kind) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  }
  return true;
}

bool ValidChainId(std::string_view chain_id) { return !chain_id.empty() && chain_id.size() <= 64; }

// Reads the layout of signing.h back out of `bytes` and compares it with the inputs.
void CheckLayout(const std::string& bytes, const ts::fuzz::SignBytesInput& in) {
  std::string_view rest = bytes;
  TS_CHECK(rest.substr(0, ts::common::kSignDomain.size()) == ts::common::kSignDomain);
  rest.remove_prefix(ts::common::kSignDomain.size());
  const size_t end_of_kind = rest.find('\0');
  TS_CHECK(end_of_kind != std::string_view::npos);
  TS_CHECK(rest.substr(0, end_of_kind) == in.kind);
  rest.remove_prefix(end_of_kind + 1);
  TS_CHECK(!rest.empty());
  const size_t chain_id_size = static_cast<unsigned char>(rest[0]);
  rest.remove_prefix(1);
  TS_CHECK(chain_id_size == in.chain_id.size());
  TS_CHECK(rest.substr(0, chain_id_size) == in.chain_id);
  rest.remove_prefix(chain_id_size);
  TS_CHECK(rest.size() >= 8);
  uint64_t shard_id = 0;
  for (int i = 0; i < 8; ++i) shard_id = (shard_id << 8) | static_cast<unsigned char>(rest[i]);
  TS_CHECK(shard_id == in.shard_id);
  rest.remove_prefix(8);
  TS_CHECK(rest == in.message);
  TS_CHECK(bytes.size() == ts::common::kSignDomain.size() + in.kind.size() + 2 +
                               in.chain_id.size() + 8 + in.message.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ts::fuzz::SignBytesInput in =
      ts::fuzz::ParseSignBytesInput(std::string_view(reinterpret_cast<const char*>(data), size));
  const bool valid = ValidKind(in.kind) && ValidChainId(in.chain_id);

  auto bytes = ts::common::SignBytes(in.kind, in.chain_id, in.shard_id, in.message);
  TS_CHECK(bytes.ok() == valid);
  if (!bytes.ok()) {
    TS_CHECK(bytes.status().code() == absl::StatusCode::kInvalidArgument);
  } else {
    CheckLayout(*bytes, in);
    auto again = ts::common::SignBytes(in.kind, in.chain_id, in.shard_id, in.message);
    TS_CHECK(again.ok() && *again == *bytes);
  }

  auto signer = ts::common::RecoverStatementSigner(in.kind, in.chain_id, in.shard_id, in.message,
                                                   in.signature);
  if (!valid) {
    TS_CHECK(!signer.ok() && signer.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  auto key = ts::common::RecoverPublicKey(ts::common::Sha256(*bytes), in.signature);
  TS_CHECK(signer.ok() == key.ok());
  if (signer.ok()) {
    TS_CHECK(*signer == ts::common::AddressFromPublicKey(*key));
    TS_CHECK(ts::common::ParseAddress("signer", *signer).ok());
  } else {
    const absl::StatusCode code = signer.status().code();
    TS_CHECK(code == absl::StatusCode::kInvalidArgument ||
             code == absl::StatusCode::kUnauthenticated);
    TS_CHECK(code == key.status().code());
  }

  if (in.flags & ts::fuzz::kFlagSignAndRecover) {
    // A key derived from the input; out-of-range secrets (probability ~2^-128) are skipped.
    auto own = ts::common::PrivateKey::FromBytes(ts::common::Sha256(*bytes));
    if (!own.ok()) return 0;
    auto sig = ts::common::SignStatement(*own, in.kind, in.chain_id, in.shard_id, in.message);
    TS_CHECK(sig.ok() && sig->size() == ts::common::kRecoverableSignatureSize);
    auto recovered =
        ts::common::RecoverStatementSigner(in.kind, in.chain_id, in.shard_id, in.message, *sig);
    TS_CHECK(recovered.ok());
    TS_CHECK(*recovered == ts::common::AddressFromPublicKey(own->public_key()));
    // The same signature under another shard id names someone else (or no one).
    auto other =
        ts::common::RecoverStatementSigner(in.kind, in.chain_id, in.shard_id ^ 1, in.message, *sig);
    TS_CHECK(!other.ok() || *other != *recovered);
  }
  return 0;
}
