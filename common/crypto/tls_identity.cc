#include "common/crypto/tls_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/regular_file.h"
#include "common/status.h"

namespace ts::common {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;

absl::Status OpensslError(std::string_view what) {
  return absl::InternalError(absl::StrCat("TLS identity: ", std::string(what), " failed"));
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return size > 0 ? std::string(data, static_cast<size_t>(size)) : std::string();
}

Cert ReadCert(std::string_view pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return nullptr;
  return Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

Pkey ReadKey(std::string_view pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return nullptr;
  return Pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
}

std::string DerSha256(X509* cert) {
  unsigned char* der = nullptr;
  int size = i2d_X509(cert, &der);
  if (size <= 0) return "";
  std::string digest =
      Sha256(std::string_view(reinterpret_cast<const char*>(der), static_cast<size_t>(size)));
  OPENSSL_free(der);
  return digest;
}

// Writes `content` to `path` through a temporary file in the same directory (mode `mode`),
// synced, then renamed over `path`.
absl::Status WriteFileDurably(const std::string& path, const std::string& content, mode_t mode) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat(tmp, ": ", std::strerror(errno)));
  absl::Status status;
  if (::fchmod(fd, mode) != 0) status = absl::InternalError(std::strerror(errno));
  size_t done = 0;
  while (status.ok() && done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = absl::InternalError(std::strerror(errno));
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (status.ok() && ::fsync(fd) != 0) status = absl::InternalError(std::strerror(errno));
  ::close(fd);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(std::strerror(errno));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": ", status.message()));
  }
  return absl::OkStatus();
}

void SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<TlsIdentity> NewTlsIdentity(std::string_view common_name) {
  Pkey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (key == nullptr) return OpensslError("P-256 key generation");
  Cert cert(X509_new());
  if (cert == nullptr || X509_set_version(cert.get(), 2) != 1) return OpensslError("X509_new");
  // A random 128-bit serial, as RFC 5280 asks of certificates (positive, at most 20 bytes).
  BIGNUM* serial = BN_new();
  if (serial == nullptr || BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get())) == nullptr) {
    BN_free(serial);
    return OpensslError("certificate serial");
  }
  BN_free(serial);
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), 0) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), kTlsCertValidityDays * 24 * 3600) ==
          nullptr) {
    return OpensslError("certificate validity");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  const std::string cn(common_name);
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) != 1 ||
      X509_set_issuer_name(cert.get(), name) != 1 || X509_set_pubkey(cert.get(), key.get()) != 1 ||
      X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) {
    return OpensslError("certificate signing");
  }
  Bio key_bio(BIO_new(BIO_s_mem()));
  Bio cert_bio(BIO_new(BIO_s_mem()));
  if (key_bio == nullptr || cert_bio == nullptr ||
      PEM_write_bio_PrivateKey(key_bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) !=
          1 ||
      PEM_write_bio_X509(cert_bio.get(), cert.get()) != 1) {
    return OpensslError("PEM encoding");
  }
  TlsIdentity identity;
  identity.key_pem = BioText(key_bio.get());
  identity.cert_pem = BioText(cert_bio.get());
  identity.cert_sha256 = DerSha256(cert.get());
  if (identity.cert_sha256.size() != kSha256Size) return OpensslError("DER encoding");
  return identity;
}

absl::StatusOr<std::string> CertificateSha256(std::string_view pem) {
  Cert cert = ReadCert(pem);
  if (cert == nullptr) return absl::InvalidArgumentError("no PEM certificate");
  std::string digest = DerSha256(cert.get());
  if (digest.empty()) return absl::InvalidArgumentError("certificate does not encode");
  return digest;
}

absl::StatusOr<TlsIdentity> LoadOrCreateTlsIdentity(const std::string& dir,
                                                    std::string_view common_name) {
  const std::string key_path = absl::StrCat(dir, "/", kTlsKeyFile);
  const std::string cert_path = absl::StrCat(dir, "/", kTlsCertFile);
  const bool have_key = Exists(key_path);
  const bool have_cert = Exists(cert_path);
  if (!have_key && !have_cert) {
    TS_ASSIGN_OR_RETURN(TlsIdentity identity, NewTlsIdentity(common_name));
    // The key first: a crash between the two leaves a key without a certificate, which the
    // next start refuses rather than replaces (the operator sees it before any reservation).
    TS_RETURN_IF_ERROR(WriteFileDurably(key_path, identity.key_pem, 0600));
    TS_RETURN_IF_ERROR(WriteFileDurably(cert_path, identity.cert_pem, 0644));
    SyncDirectory(dir);
    return identity;
  }
  if (!have_key || !have_cert) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TLS identity: ", have_key ? cert_path : key_path, " is missing beside ",
        have_key ? key_path : cert_path,
        "; restore both from a backup (this host's fingerprint is in its reservations), or "
        "remove the other to make a new identity"));
  }
  return LoadTlsIdentity(dir);
}

absl::StatusOr<TlsIdentity> LoadTlsIdentity(const std::string& dir) {
  const std::string key_path = absl::StrCat(dir, "/", kTlsKeyFile);
  const std::string cert_path = absl::StrCat(dir, "/", kTlsCertFile);
  TlsIdentity identity;
  auto key = ReadRegularFile("TLS key", key_path, kMaxTlsPemBytes);
  if (!key.ok()) return absl::FailedPreconditionError(key.status().message());
  auto cert = ReadRegularFile("TLS certificate", cert_path, kMaxTlsPemBytes);
  if (!cert.ok()) return absl::FailedPreconditionError(cert.status().message());
  identity.key_pem = *std::move(key);
  identity.cert_pem = *std::move(cert);
  Pkey pkey = ReadKey(identity.key_pem);
  if (pkey == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(key_path, ": not a PEM private key"));
  }
  Cert x509 = ReadCert(identity.cert_pem);
  if (x509 == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(cert_path, ": not a PEM certificate"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    return absl::FailedPreconditionError(absl::StrCat(key_path, " is not the key of ", cert_path));
  }
  identity.cert_sha256 = DerSha256(x509.get());
  if (identity.cert_sha256.size() != kSha256Size) {
    return absl::FailedPreconditionError(absl::StrCat(cert_path, ": does not encode"));
  }
  return identity;
}

}  // namespace ts::common
