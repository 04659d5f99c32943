// TLS 1.3 for a host's raw TCP channels — the collective's links (docs/threat-model.md, "TLS
// between hosts"). OpenSSL runs the handshake over the connected socket: both sides present
// their TlsIdentity (tls_identity.h); the dialer accepts only the certificate whose SHA-256 it
// was given (the peer's reservation on chain), the listener reads the dialer's fingerprint for
// its owner to check against the member the dialer then proves to be. After the handshake the
// application-data records are sealed and opened here, one state per direction, from the
// traffic secrets the handshake derived (RFC 8446 §7.1–7.3): one thread may send while another
// receives on the same connection, which an OpenSSL SSL object does not allow, and the channel
// keeps its own non-blocking socket code. The records are TLS 1.3 records of
// TLS_AES_128_GCM_SHA256 (§5.2): a stock TLS 1.3 peer reads and writes them.
//
// Deliberately not supported: session tickets, resumption and 0-RTT (off), post-handshake
// messages (a KeyUpdate or ticket from the peer is refused) and therefore re-keying — each
// direction carries at most kTlsMaxRecords records (the AES-GCM usage limit of §5.5, 256 GiB of
// full records), after which the channel fails and its owner connects anew. No close_notify is
// sent: the channel's own protocol says goodbye; a close_notify received reads as the end.
//
// Thread-safety: TlsContext is immutable and shared. A TlsHandshake is one thread's at a time;
// a TlsSealer and a TlsOpener each one thread's at a time (they share nothing).
#ifndef TS_COMMON_CRYPTO_TLS_SESSION_H_
#define TS_COMMON_CRYPTO_TLS_SESSION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/tls_identity.h"

struct ssl_ctx_st;
struct ssl_st;
struct bio_st;
struct evp_cipher_ctx_st;
struct x509_store_ctx_st;

namespace ts::common {

inline constexpr size_t kTlsMaxPlaintext = 1 << 14;  // per record (RFC 8446 §5.1)
inline constexpr size_t kTlsRecordHeader = 5;
inline constexpr size_t kTlsTagSize = 16;
// Largest record accepted (§5.2: 2^14 + 256 bytes after the header).
inline constexpr size_t kTlsMaxRecordBody = kTlsMaxPlaintext + 256;
inline constexpr uint64_t kTlsMaxRecords = uint64_t{1} << 24;

// A host's identity loaded into OpenSSL once, for every handshake of its channels.
class TlsContext {
 public:
  // INVALID_ARGUMENT when the identity's key or certificate does not load or do not match.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> New(const TlsIdentity& identity);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  const std::string& cert_sha256() const { return cert_sha256_; }

 private:
  friend class TlsHandshake;
  TlsContext(ssl_ctx_st* ctx, std::string cert_sha256);
  ssl_ctx_st* const ctx_;
  const std::string cert_sha256_;
};

namespace tls_internal {

// One direction's AES-128-GCM key, IV and record sequence number (RFC 8446 §5.3).
class RecordState {
 public:
  RecordState() = default;
  RecordState(RecordState&& other) noexcept;
  RecordState& operator=(RecordState&& other) noexcept;
  ~RecordState();
  // Derives key and IV from a traffic secret; the sequence starts at 0.
  absl::Status Init(std::string_view secret, bool encrypt);
  // The next record's nonce (the IV with the sequence number XORed into its end).
  void Nonce(unsigned char* out) const;

  evp_cipher_ctx_st* ctx = nullptr;
  unsigned char iv[12] = {};
  uint64_t sequence = 0;
};

}  // namespace tls_internal

// Protects outgoing application data: one direction's state.
class TlsSealer {
 public:
  // Appends to *out the records that carry `parts` one after another (full records of
  // kTlsMaxPlaintext bytes, the last one shorter; nothing for no bytes). Every record sealed
  // must reach the peer, in order: the peer opens record n with sequence number n.
  // RESOURCE_EXHAUSTED once kTlsMaxRecords have been sealed; INTERNAL if OpenSSL fails.
  absl::Status Seal(std::initializer_list<std::string_view> parts, std::string* out);
  // Bytes on the wire for `plaintext` bytes.
  static size_t SealedSize(size_t plaintext);

 private:
  friend class TlsHandshake;
  tls_internal::RecordState state_;
};

// Opens incoming records: the other direction's state.
class TlsOpener {
 public:
  // Opens the whole records at the front of `in`, appending their plaintext to *out, and
  // returns how many bytes of `in` they took (a record not yet whole is left for the next
  // call). *closed is set when the peer's close_notify arrives (nothing after it is read).
  // DATA_LOSS naming the record's sequence number when it fails authentication;
  // INVALID_ARGUMENT for a malformed record (type, version, length, padding) or a
  // post-handshake message; UNAVAILABLE naming the peer's alert; RESOURCE_EXHAUSTED past
  // kTlsMaxRecords. After an error the opener is spent.
  absl::StatusOr<size_t> Open(std::string_view in, std::string* out, bool* closed);

 private:
  friend class TlsHandshake;
  tls_internal::RecordState state_;
  bool failed_ = false;
};

struct TlsRecordLayer {
  TlsSealer sealer;
  TlsOpener opener;
};

// One handshake over a connected non-blocking socket, driven by its owner's poll loop.
class TlsHandshake {
 public:
  enum class Role { kClient, kServer };
  enum class Want { kDone, kRead, kWrite };

  // `fd` is not owned and must stay open until the handshake is done with. A client pins the
  // server to `expect_peer_sha256` (32 bytes); a server takes any client certificate and
  // reports its fingerprint (peer_cert_sha256) for its owner to check.
  static absl::StatusOr<std::unique_ptr<TlsHandshake>> Start(
      std::shared_ptr<const TlsContext> context, int fd, Role role, std::string expect_peer_sha256);
  // A client's whole handshake on `fd`, pinned to `expect_peer_sha256`: Start, then Step until
  // done, calling `wait` with the poll events to wait for between steps (its error ends the
  // handshake and is returned as is), then Finish.
  static absl::StatusOr<TlsRecordLayer> Connect(
      std::shared_ptr<const TlsContext> context, int fd, std::string expect_peer_sha256,
      const std::function<absl::Status(short poll_events)>& wait);
  ~TlsHandshake();
  TlsHandshake(const TlsHandshake&) = delete;
  TlsHandshake& operator=(const TlsHandshake&) = delete;

  // Goes as far as the socket allows without blocking: kDone when the handshake is complete,
  // else what to poll the socket for. UNAUTHENTICATED naming both fingerprints when the
  // server's certificate is not the pinned one; UNAVAILABLE for the peer closing, a socket
  // error or a TLS failure (OpenSSL's reason: no TLS 1.3, no common cipher, no certificate,
  // a record over kTlsMaxRecordBody).
  absl::StatusOr<Want> Step();

  // After kDone: SHA-256 of the peer certificate's DER encoding.
  const std::string& peer_cert_sha256() const { return peer_sha256_; }
  // After kDone, once: this side's record states. The handshake read exactly its own records
  // from the socket: the next byte there is the peer's first application record.
  absl::StatusOr<TlsRecordLayer> Finish();

 private:
  friend class TlsContext;
  TlsHandshake(std::shared_ptr<const TlsContext> context, int fd, Role role,
               std::string expect_peer_sha256);
  static int OnVerify(int preverify_ok, ::x509_store_ctx_st* store);
  static void OnKeylog(const ssl_st* ssl, const char* line);
  absl::Status Failure(std::string_view what);
  // Sends what OpenSSL wrote; false when the socket is full (the rest waits).
  absl::StatusOr<bool> Flush();
  // Reads at most the rest of one record; true once a whole record went to OpenSSL.
  absl::StatusOr<bool> ReadRecord();

  const std::shared_ptr<const TlsContext> context_;
  const int fd_;
  const Role role_;
  const std::string expect_sha256_;
  ssl_st* ssl_ = nullptr;
  bio_st* rbio_ = nullptr;  // owned by ssl_
  bio_st* wbio_ = nullptr;  // owned by ssl_
  std::string out_;         // written by OpenSSL, not yet sent
  size_t out_sent_ = 0;
  std::string record_;  // the record being read
  bool done_ = false;
  bool finished_ = false;
  bool pin_mismatch_ = false;
  std::string peer_sha256_;
  std::string client_secret_;
  std::string server_secret_;
};

}  // namespace ts::common

#endif  // TS_COMMON_CRYPTO_TLS_SESSION_H_
