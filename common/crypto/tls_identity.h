// A host's TLS identity for its peer-facing channels (docs/threat-model.md, "TLS between
// hosts"): an ECDSA P-256 key and a self-signed X.509 certificate, made at the host's first
// start and kept in its data dir. No certificate authority vouches for it: the SHA-256 of the
// certificate's DER encoding goes into every reservation the host makes on chain, and peers
// accept exactly the certificate whose fingerprint the chain holds for that host. The chain stays
// the only root of trust.
//
// OpenSSL stays behind this header. Pure functions over files and strings; thread-safe.
#ifndef TS_COMMON_CRYPTO_TLS_IDENTITY_H_
#define TS_COMMON_CRYPTO_TLS_IDENTITY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ts::common {

inline constexpr char kTlsKeyFile[] = "tls.key";       // PEM, mode 0600
inline constexpr char kTlsCertFile[] = "tls.crt";      // PEM
inline constexpr int64_t kTlsCertValidityDays = 3650;  // the fingerprint, not the dates, is trusted
inline constexpr size_t kMaxTlsPemBytes = 64 << 10;

struct TlsIdentity {
  std::string key_pem;
  std::string cert_pem;
  std::string cert_sha256;  // 32 bytes: SHA-256 of the certificate's DER encoding
};

// Makes a new identity: a fresh P-256 key and a self-signed certificate naming `common_name`
// (the host's address), valid from now for kTlsCertValidityDays. INTERNAL if OpenSSL fails.
absl::StatusOr<TlsIdentity> NewTlsIdentity(std::string_view common_name);

// Loads the identity in `dir` (kTlsKeyFile and kTlsCertFile), or, when neither file exists,
// makes one (NewTlsIdentity) and writes both (the key 0600, each written to a temporary file,
// synced and renamed, the key first). FAILED_PRECONDITION, naming the file, when only one of the
// two exists, a file is not PEM of the right kind or over kMaxTlsPemBytes, or the key is not
// the certificate's: the host's fingerprint is on chain, so a damaged identity is the
// operator's to restore (from a backup), never silently replaced. INTERNAL for an I/O error.
absl::StatusOr<TlsIdentity> LoadOrCreateTlsIdentity(const std::string& dir,
                                                    std::string_view common_name);

// Loads the identity LoadOrCreateTlsIdentity made in `dir`, never making one (for a host's
// own processes that serve with it). FAILED_PRECONDITION naming the file as above, and when a
// file is missing.
absl::StatusOr<TlsIdentity> LoadTlsIdentity(const std::string& dir);

// SHA-256 of the DER encoding of the first certificate in `pem`. INVALID_ARGUMENT when `pem`
// holds no certificate.
absl::StatusOr<std::string> CertificateSha256(std::string_view pem);

}  // namespace ts::common

#endif  // TS_COMMON_CRYPTO_TLS_IDENTITY_H_
