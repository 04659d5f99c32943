#include "common/crypto/tls_session.h"

#include <poll.h>
#include <sys/socket.h>

#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/status.h"

namespace ts::common {
namespace {

constexpr unsigned char kApplicationData = 23;
constexpr unsigned char kAlert = 21;
constexpr unsigned char kHandshake = 22;
constexpr unsigned char kLegacyVersion[2] = {0x03, 0x03};
constexpr size_t kKeySize = 16;  // AES-128
constexpr size_t kIvSize = 12;

std::string Hex8(std::string_view bytes) {
  return absl::BytesToHexString(std::string(bytes.substr(0, 4)));
}

std::string OpensslReason() {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return "no reason given";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

std::string DerSha256(X509* cert) {
  unsigned char* der = nullptr;
  const int size = i2d_X509(cert, &der);
  if (size <= 0) return "";
  std::string digest =
      Sha256(std::string_view(reinterpret_cast<const char*>(der), static_cast<size_t>(size)));
  OPENSSL_free(der);
  return digest;
}

// HKDF-Expand-Label(secret, label, "", length) with SHA-256 (RFC 8446 §7.1).
absl::StatusOr<std::string> ExpandLabel(std::string_view secret, std::string_view label,
                                        size_t length) {
  std::string info;
  info.push_back(static_cast<char>(length >> 8));
  info.push_back(static_cast<char>(length & 0xff));
  const std::string full = absl::StrCat("tls13 ", std::string(label));
  info.push_back(static_cast<char>(full.size()));
  info.append(full);
  info.push_back('\0');  // empty context
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) return absl::InternalError("TLS: HKDF unavailable");
  EVP_KDF_CTX* kctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (kctx == nullptr) return absl::InternalError("TLS: HKDF context");
  int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(secret.data()),
                                        secret.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info.data(), info.size()),
      OSSL_PARAM_construct_end()};
  std::string out(length, '\0');
  const int ok = EVP_KDF_derive(kctx, reinterpret_cast<unsigned char*>(out.data()), length, params);
  EVP_KDF_CTX_free(kctx);
  if (ok != 1) return absl::InternalError("TLS: HKDF-Expand-Label failed");
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// TlsContext

TlsContext::TlsContext(ssl_ctx_st* ctx, std::string cert_sha256)
    : ctx_(ctx), cert_sha256_(std::move(cert_sha256)) {}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::New(const TlsIdentity& identity) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return absl::InternalError("TLS: SSL_CTX_new failed");
  std::shared_ptr<const TlsContext> out(new TlsContext(ctx, identity.cert_sha256));
  BIO* cert_bio =
      BIO_new_mem_buf(identity.cert_pem.data(), static_cast<int>(identity.cert_pem.size()));
  X509* cert =
      cert_bio == nullptr ? nullptr : PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  BIO* key_bio =
      BIO_new_mem_buf(identity.key_pem.data(), static_cast<int>(identity.key_pem.size()));
  EVP_PKEY* key =
      key_bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  const bool loaded = cert != nullptr && key != nullptr &&
                      SSL_CTX_use_certificate(ctx, cert) == 1 &&
                      SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
  const std::string sha = cert == nullptr ? "" : DerSha256(cert);
  X509_free(cert);
  EVP_PKEY_free(key);
  if (!loaded) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS identity: key and certificate do not load: ", OpensslReason()));
  }
  if (sha != identity.cert_sha256) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS identity: cert_sha256 ", Hex8(identity.cert_sha256),
                     "… is not the certificate's (", Hex8(sha), "…)"));
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  if (SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256") != 1) {
    return absl::InternalError("TLS: TLS_AES_128_GCM_SHA256 unavailable");
  }
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_clear_options(ctx, SSL_OP_ENABLE_MIDDLEBOX_COMPAT);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                     &TlsHandshake::OnVerify);
  SSL_CTX_set_keylog_callback(ctx, &TlsHandshake::OnKeylog);
  return out;
}

// ---------------------------------------------------------------------------------------------
// TlsSealer

// ---------------------------------------------------------------------------------------------
// RecordState

namespace tls_internal {

RecordState::RecordState(RecordState&& other) noexcept
    : ctx(std::exchange(other.ctx, nullptr)), sequence(other.sequence) {
  std::memcpy(iv, other.iv, sizeof(iv));
}

RecordState& RecordState::operator=(RecordState&& other) noexcept {
  if (this != &other) {
    EVP_CIPHER_CTX_free(ctx);
    ctx = std::exchange(other.ctx, nullptr);
    sequence = other.sequence;
    std::memcpy(iv, other.iv, sizeof(iv));
  }
  return *this;
}

RecordState::~RecordState() { EVP_CIPHER_CTX_free(ctx); }

absl::Status RecordState::Init(std::string_view secret, bool encrypt) {
  TS_ASSIGN_OR_RETURN(std::string key, ExpandLabel(secret, "key", kKeySize));
  TS_ASSIGN_OR_RETURN(std::string iv_bytes, ExpandLabel(secret, "iv", kIvSize));
  std::memcpy(iv, iv_bytes.data(), kIvSize);
  sequence = 0;
  EVP_CIPHER_CTX_free(ctx);
  ctx = EVP_CIPHER_CTX_new();
  const auto* k = reinterpret_cast<const unsigned char*>(key.data());
  const int ok =
      ctx != nullptr && (encrypt ? EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, k, nullptr)
                                 : EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), nullptr, k, nullptr));
  OPENSSL_cleanse(key.data(), key.size());
  if (ok != 1) return absl::InternalError("TLS: cipher init failed");
  return absl::OkStatus();
}

void RecordState::Nonce(unsigned char* out) const {
  std::memcpy(out, iv, kIvSize);
  for (int i = 0; i < 8; ++i) {
    out[kIvSize - 1 - i] ^= static_cast<unsigned char>(sequence >> (8 * i));
  }
}

}  // namespace tls_internal

// ---------------------------------------------------------------------------------------------
// TlsSealer

size_t TlsSealer::SealedSize(size_t plaintext) {
  const size_t records = (plaintext + kTlsMaxPlaintext - 1) / kTlsMaxPlaintext;
  return plaintext + records * (kTlsRecordHeader + 1 + kTlsTagSize);
}

absl::Status TlsSealer::Seal(std::initializer_list<std::string_view> parts, std::string* out) {
  evp_cipher_ctx_st* const ctx = state_.ctx;
  if (ctx == nullptr) return absl::FailedPreconditionError("TLS: sealer not keyed");
  size_t total = 0;
  for (std::string_view p : parts) total += p.size();
  const size_t start = out->size();
  out->resize(start + SealedSize(total));
  auto* dst = reinterpret_cast<unsigned char*>(out->data()) + start;
  const std::string_view* part = parts.begin();
  size_t at = 0;  // within *part
  size_t left = total;
  while (left > 0) {
    if (state_.sequence >= kTlsMaxRecords) {
      out->resize(start);
      return absl::ResourceExhaustedError(
          absl::StrCat("TLS: ", kTlsMaxRecords, " records sealed; the key may not be used again"));
    }
    const size_t n = std::min(left, kTlsMaxPlaintext);
    const size_t body = n + 1 + kTlsTagSize;
    unsigned char* header = dst;
    header[0] = kApplicationData;
    header[1] = kLegacyVersion[0];
    header[2] = kLegacyVersion[1];
    header[3] = static_cast<unsigned char>(body >> 8);
    header[4] = static_cast<unsigned char>(body & 0xff);
    unsigned char nonce[kIvSize];
    state_.Nonce(nonce);
    int len = 0;
    bool ok = EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) == 1 &&
              EVP_EncryptUpdate(ctx, nullptr, &len, header, kTlsRecordHeader) == 1;
    unsigned char* w = dst + kTlsRecordHeader;
    size_t need = n;
    while (ok && need > 0) {
      while (at == part->size()) {
        ++part;
        at = 0;
      }
      const size_t take = std::min(need, part->size() - at);
      ok =
          EVP_EncryptUpdate(ctx, w, &len, reinterpret_cast<const unsigned char*>(part->data()) + at,
                            static_cast<int>(take)) == 1;
      w += len;
      at += take;
      need -= take;
    }
    const unsigned char type = kApplicationData;
    ok = ok && EVP_EncryptUpdate(ctx, w, &len, &type, 1) == 1;
    w += len;
    ok = ok && EVP_EncryptFinal_ex(ctx, w, &len) == 1;
    w += len;
    ok = ok && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kTlsTagSize, w) == 1;
    if (!ok || w != dst + kTlsRecordHeader + n + 1) {
      out->resize(start);
      return absl::InternalError("TLS: record sealing failed");
    }
    dst += kTlsRecordHeader + body;
    left -= n;
    ++state_.sequence;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// TlsOpener

absl::StatusOr<size_t> TlsOpener::Open(std::string_view in, std::string* out, bool* closed) {
  *closed = false;
  evp_cipher_ctx_st* const ctx = state_.ctx;
  if (ctx == nullptr) return absl::FailedPreconditionError("TLS: opener not keyed");
  if (failed_) return absl::FailedPreconditionError("TLS: an earlier record failed");
  size_t pos = 0;
  const auto fail = [&](absl::Status status) {
    failed_ = true;
    return status;
  };
  while (in.size() - pos >= kTlsRecordHeader) {
    const auto* header = reinterpret_cast<const unsigned char*>(in.data() + pos);
    const size_t body = (size_t{header[3]} << 8) | header[4];
    if (header[0] != kApplicationData) {
      return fail(absl::InvalidArgumentError(absl::StrCat("TLS: record ", state_.sequence,
                                                          " has outer type ", header[0], ", want ",
                                                          kApplicationData)));
    }
    if (header[1] != kLegacyVersion[0] || header[2] != kLegacyVersion[1]) {
      return fail(
          absl::InvalidArgumentError(absl::StrCat("TLS: record ", state_.sequence, " has version ",
                                                  header[1], ".", header[2], ", want 3.3")));
    }
    if (body < 1 + kTlsTagSize || body > kTlsMaxRecordBody) {
      return fail(absl::InvalidArgumentError(absl::StrCat("TLS: record ", state_.sequence, " is ",
                                                          body, " bytes, want ", 1 + kTlsTagSize,
                                                          "..", kTlsMaxRecordBody)));
    }
    if (in.size() - pos < kTlsRecordHeader + body) break;
    if (state_.sequence >= kTlsMaxRecords) {
      return fail(absl::ResourceExhaustedError(
          absl::StrCat("TLS: ", kTlsMaxRecords, " records opened; the key may not be used again")));
    }
    const size_t sealed = body - kTlsTagSize;
    const size_t start = out->size();
    out->resize(start + sealed);
    auto* dst = reinterpret_cast<unsigned char*>(out->data()) + start;
    unsigned char nonce[kIvSize];
    state_.Nonce(nonce);
    const unsigned char* ciphertext = header + kTlsRecordHeader;
    unsigned char tag[kTlsTagSize];
    std::memcpy(tag, ciphertext + sealed, kTlsTagSize);
    int len = 0;
    int final_len = 0;
    const bool ok = EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) == 1 &&
                    EVP_DecryptUpdate(ctx, nullptr, &len, header, kTlsRecordHeader) == 1 &&
                    EVP_DecryptUpdate(ctx, dst, &len, ciphertext, static_cast<int>(sealed)) == 1 &&
                    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kTlsTagSize, tag) == 1 &&
                    EVP_DecryptFinal_ex(ctx, dst + len, &final_len) == 1;
    if (!ok) {
      out->resize(start);
      return fail(absl::DataLossError(
          absl::StrCat("TLS: record ", state_.sequence, " fails authentication")));
    }
    ++state_.sequence;
    pos += kTlsRecordHeader + body;
    // The content type is the last non-zero byte; zeros after it are padding (§5.4).
    size_t end = sealed;
    while (end > 0 && dst[end - 1] == 0) --end;
    if (end == 0) {
      out->resize(start);
      return fail(absl::InvalidArgumentError(
          absl::StrCat("TLS: record ", state_.sequence - 1, " has no content type")));
    }
    const unsigned char type = dst[end - 1];
    const size_t plain = end - 1;
    if (type == kApplicationData) {
      out->resize(start + plain);
      continue;
    }
    const std::string content(reinterpret_cast<const char*>(dst), plain);
    out->resize(start);
    if (type == kAlert && plain == 2 && content[1] == 0) {
      *closed = true;
      return pos;
    }
    if (type == kAlert && plain == 2) {
      return fail(absl::UnavailableError(absl::StrCat(
          "TLS: the peer sent alert ", static_cast<int>(static_cast<unsigned char>(content[1])))));
    }
    return fail(absl::InvalidArgumentError(
        absl::StrCat("TLS: record ", state_.sequence - 1, " carries content type ", type,
                     type == kHandshake ? " (a post-handshake message, not supported)" : "")));
  }
  return pos;
}

// ---------------------------------------------------------------------------------------------
// TlsHandshake

TlsHandshake::TlsHandshake(std::shared_ptr<const TlsContext> context, int fd, Role role,
                           std::string expect_peer_sha256)
    : context_(std::move(context)),
      fd_(fd),
      role_(role),
      expect_sha256_(std::move(expect_peer_sha256)) {}

TlsHandshake::~TlsHandshake() {
  SSL_free(ssl_);  // frees both BIOs
  OPENSSL_cleanse(client_secret_.data(), client_secret_.size());
  OPENSSL_cleanse(server_secret_.data(), server_secret_.size());
}

absl::StatusOr<std::unique_ptr<TlsHandshake>> TlsHandshake::Start(
    std::shared_ptr<const TlsContext> context, int fd, Role role, std::string expect_peer_sha256) {
  if (role == Role::kClient && expect_peer_sha256.size() != kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat("TLS: the peer's certificate fingerprint is ",
                                                   expect_peer_sha256.size(), " bytes, want ",
                                                   kSha256Size));
  }
  std::unique_ptr<TlsHandshake> h(
      new TlsHandshake(std::move(context), fd, role, std::move(expect_peer_sha256)));
  h->ssl_ = SSL_new(h->context_->ctx_);
  h->rbio_ = BIO_new(BIO_s_mem());
  h->wbio_ = BIO_new(BIO_s_mem());
  if (h->ssl_ == nullptr || h->rbio_ == nullptr || h->wbio_ == nullptr) {
    BIO_free(h->rbio_);
    BIO_free(h->wbio_);
    h->rbio_ = h->wbio_ = nullptr;
    return absl::InternalError("TLS: SSL_new failed");
  }
  SSL_set_bio(h->ssl_, h->rbio_, h->wbio_);
  SSL_set_app_data(h->ssl_, h.get());
  if (role == Role::kClient) {
    SSL_set_connect_state(h->ssl_);
  } else {
    SSL_set_accept_state(h->ssl_);
  }
  return h;
}

int TlsHandshake::OnVerify(int /*preverify_ok*/, ::x509_store_ctx_st* store) {
  // Self-signed certificates are the rule here: only the fingerprint counts.
  SSL* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* self = static_cast<TlsHandshake*>(SSL_get_app_data(ssl));
  X509* leaf = X509_STORE_CTX_get0_cert(store);
  if (self == nullptr || leaf == nullptr) return 0;
  self->peer_sha256_ = DerSha256(leaf);
  if (self->role_ == Role::kClient && self->peer_sha256_ != self->expect_sha256_) {
    self->pin_mismatch_ = true;
    return 0;
  }
  return 1;
}

void TlsHandshake::OnKeylog(const ssl_st* ssl, const char* line) {
  auto* self = static_cast<TlsHandshake*>(SSL_get_app_data(ssl));
  if (self == nullptr) return;
  const std::string_view text(line);
  const size_t label_end = text.find(' ');
  if (label_end == std::string_view::npos) return;
  const std::string_view label = text.substr(0, label_end);
  std::string* secret = label == "CLIENT_TRAFFIC_SECRET_0"   ? &self->client_secret_
                        : label == "SERVER_TRAFFIC_SECRET_0" ? &self->server_secret_
                                                             : nullptr;
  if (secret == nullptr) return;
  const size_t hex_at = text.rfind(' ');
  absl::StatusOr<std::string> bytes = HexDecode(text.substr(hex_at + 1));
  if (bytes.ok()) *secret = *std::move(bytes);
}

absl::Status TlsHandshake::Failure(std::string_view what) {
  if (pin_mismatch_) {
    ERR_clear_error();
    return absl::UnauthenticatedError(absl::StrCat(
        "TLS: the peer's certificate has SHA-256 ", absl::BytesToHexString(peer_sha256_),
        ", its reservation names ", absl::BytesToHexString(expect_sha256_)));
  }
  return absl::UnavailableError(absl::StrCat("TLS handshake: ", std::string(what)));
}

absl::StatusOr<bool> TlsHandshake::Flush() {
  while (true) {
    if (out_sent_ == out_.size()) {
      out_.clear();
      out_sent_ = 0;
      char chunk[4096];
      const int n = BIO_read(wbio_, chunk, sizeof(chunk));
      if (n <= 0) return true;
      out_.assign(chunk, static_cast<size_t>(n));
    }
    const ssize_t n =
        ::send(fd_, out_.data() + out_sent_, out_.size() - out_sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_sent_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    return Failure(absl::StrCat("send: ", std::strerror(errno)));
  }
}

absl::StatusOr<bool> TlsHandshake::ReadRecord() {
  while (true) {
    size_t need = kTlsRecordHeader;
    if (record_.size() >= kTlsRecordHeader) {
      const auto* h = reinterpret_cast<const unsigned char*>(record_.data());
      const size_t body = (size_t{h[3]} << 8) | h[4];
      if (body > kTlsMaxRecordBody) {
        return Failure(absl::StrCat("a record of ", body, " bytes (over ", kTlsMaxRecordBody,
                                    "; is the peer speaking TLS?)"));
      }
      need = kTlsRecordHeader + body;
    }
    if (record_.size() == need && need > kTlsRecordHeader) {
      if (BIO_write(rbio_, record_.data(), static_cast<int>(record_.size())) !=
          static_cast<int>(record_.size())) {
        return absl::InternalError("TLS: BIO_write failed");
      }
      record_.clear();
      return true;
    }
    char buf[kTlsRecordHeader + kTlsMaxRecordBody];
    const ssize_t n = ::recv(fd_, buf, need - record_.size(), MSG_DONTWAIT);
    if (n > 0) {
      record_.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return Failure("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    return Failure(absl::StrCat("recv: ", std::strerror(errno)));
  }
}

absl::StatusOr<TlsHandshake::Want> TlsHandshake::Step() {
  while (true) {
    TS_ASSIGN_OR_RETURN(bool flushed, Flush());
    if (!flushed) return Want::kWrite;
    if (done_) return Want::kDone;
    ERR_clear_error();
    const int r = SSL_do_handshake(ssl_);
    if (r == 1) {
      done_ = true;
      X509* peer = SSL_get0_peer_certificate(ssl_);
      if (peer == nullptr || DerSha256(peer) != peer_sha256_) {
        return Failure("no peer certificate");
      }
      if (role_ == Role::kClient && peer_sha256_ != expect_sha256_) {
        pin_mismatch_ = true;
        return Failure("pinned certificate");
      }
      if (client_secret_.size() != kSha256Size || server_secret_.size() != kSha256Size) {
        return absl::InternalError("TLS: traffic secrets not derived");
      }
      if (SSL_pending(ssl_) > 0 || BIO_ctrl_pending(rbio_) > 0) {
        return Failure("application data inside the handshake");
      }
      continue;  // the client's last flight still to send
    }
    const int err = SSL_get_error(ssl_, r);
    if (err == SSL_ERROR_WANT_WRITE) continue;
    if (err != SSL_ERROR_WANT_READ) {
      const absl::Status failure = Failure(OpensslReason());
      (void)Flush();  // best effort: the alert tells the peer why
      return failure;
    }
    if (BIO_ctrl_pending(wbio_) > 0) continue;
    TS_ASSIGN_OR_RETURN(bool whole, ReadRecord());
    if (!whole) return Want::kRead;
  }
}

absl::StatusOr<TlsRecordLayer> TlsHandshake::Connect(
    std::shared_ptr<const TlsContext> context, int fd, std::string expect_peer_sha256,
    const std::function<absl::Status(short poll_events)>& wait) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<TlsHandshake> handshake,
                      Start(std::move(context), fd, Role::kClient, std::move(expect_peer_sha256)));
  while (true) {
    TS_ASSIGN_OR_RETURN(Want want, handshake->Step());
    if (want == Want::kDone) return handshake->Finish();
    TS_RETURN_IF_ERROR(wait(want == Want::kRead ? POLLIN : POLLOUT));
  }
}

absl::StatusOr<TlsRecordLayer> TlsHandshake::Finish() {
  if (!done_ || out_sent_ != out_.size() || BIO_ctrl_pending(wbio_) > 0) {
    return absl::FailedPreconditionError("TLS: the handshake is not done");
  }
  if (finished_) return absl::FailedPreconditionError("TLS: the record states were taken");
  finished_ = true;
  const bool client = role_ == Role::kClient;
  TlsRecordLayer layer;
  TS_RETURN_IF_ERROR(layer.sealer.state_.Init(client ? client_secret_ : server_secret_, true));
  TS_RETURN_IF_ERROR(layer.opener.state_.Init(client ? server_secret_ : client_secret_, false));
  return layer;
}

}  // namespace ts::common
