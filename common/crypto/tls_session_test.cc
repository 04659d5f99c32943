#include "common/crypto/tls_session.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace ts::common {
namespace {

using Want = TlsHandshake::Want;
using Role = TlsHandshake::Role;

struct Pair {
  int a = -1;
  int b = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    a = fds[0];
    b = fds[1];
  }
  ~Pair() {
    ::close(a);
    ::close(b);
  }
};

std::shared_ptr<const TlsContext> Context(TlsIdentity* identity_out = nullptr) {
  absl::StatusOr<TlsIdentity> identity = NewTlsIdentity("gonka1test");
  EXPECT_TRUE(identity.ok()) << identity.status();
  if (identity_out != nullptr) *identity_out = *identity;
  absl::StatusOr<std::shared_ptr<const TlsContext>> context = TlsContext::New(*identity);
  EXPECT_TRUE(context.ok()) << context.status();
  return *context;
}

// Steps both sides in turn until both are done or one fails; the failures, if any.
struct Driven {
  absl::Status client;
  absl::Status server;
};
Driven Drive(TlsHandshake& client, TlsHandshake& server) {
  Driven d;
  bool client_done = false;
  bool server_done = false;
  for (int i = 0; i < 1000 && d.client.ok() && d.server.ok() && !(client_done && server_done);
       ++i) {
    if (!client_done) {
      absl::StatusOr<Want> w = client.Step();
      if (!w.ok()) d.client = w.status();
      client_done = w.ok() && *w == Want::kDone;
    }
    if (!server_done && d.client.ok()) {
      absl::StatusOr<Want> w = server.Step();
      if (!w.ok()) d.server = w.status();
      server_done = w.ok() && *w == Want::kDone;
    }
  }
  // One side may fail only on reading the other's alert: let it.
  for (int i = 0; i < 10 && !d.client.ok() && d.server.ok() && !server_done; ++i) {
    absl::StatusOr<Want> w = server.Step();
    if (!w.ok()) d.server = w.status();
  }
  return d;
}

// Reads what has arrived on `fd` (non-blocking), waiting up to 2 s for the first byte.
std::string ReadAvailable(int fd, size_t want) {
  std::string out;
  char buf[65536];
  while (out.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 2000);
  }
}

TEST(TlsSessionTest, HandshakePinsTheServerAndReportsTheClient) {
  Pair pair;
  auto client_ctx = Context();
  auto server_ctx = Context();
  auto client =
      TlsHandshake::Start(client_ctx, pair.a, Role::kClient, server_ctx->cert_sha256()).value();
  auto server = TlsHandshake::Start(server_ctx, pair.b, Role::kServer, "").value();
  const Driven d = Drive(*client, *server);
  ASSERT_TRUE(d.client.ok()) << d.client;
  ASSERT_TRUE(d.server.ok()) << d.server;
  EXPECT_EQ(client->peer_cert_sha256(), server_ctx->cert_sha256());
  EXPECT_EQ(server->peer_cert_sha256(), client_ctx->cert_sha256());

  TlsRecordLayer c = client->Finish().value();
  TlsRecordLayer s = server->Finish().value();
  EXPECT_FALSE(client->Finish().ok());  // once

  // Both directions at once, records across the parts' boundaries, and more than one record.
  const std::string header(32, 'h');
  std::string payload(100000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 + 3);
  std::string wire;
  ASSERT_TRUE(c.sealer.Seal({header, payload}, &wire).ok());
  EXPECT_EQ(wire.size(), TlsSealer::SealedSize(header.size() + payload.size()));
  EXPECT_EQ(wire.find(payload.substr(0, 64)), std::string::npos);  // no plaintext on the wire
  std::string reply_wire;
  ASSERT_TRUE(s.sealer.Seal({"ack"}, &reply_wire).ok());
  std::thread writer([&] { SendAll(pair.a, wire); });
  SendAll(pair.b, reply_wire);
  const std::string got = ReadAvailable(pair.b, wire.size());
  writer.join();
  ASSERT_EQ(got.size(), wire.size());

  // Fed a byte at a time up to the middle, then the rest: a partial record waits.
  std::string plain;
  bool closed = false;
  absl::StatusOr<size_t> used = s.opener.Open(std::string_view(got).substr(0, 10), &plain, &closed);
  ASSERT_TRUE(used.ok());
  EXPECT_EQ(*used, 0u);
  size_t at = 0;
  while (at < got.size()) {
    used = s.opener.Open(std::string_view(got).substr(at, 20000), &plain, &closed);
    ASSERT_TRUE(used.ok()) << used.status();
    ASSERT_GT(*used, 0u);
    at += *used;
  }
  EXPECT_EQ(plain, header + payload);
  EXPECT_FALSE(closed);

  const std::string reply = ReadAvailable(pair.a, reply_wire.size());
  std::string reply_plain;
  ASSERT_TRUE(c.opener.Open(reply, &reply_plain, &closed).ok());
  EXPECT_EQ(reply_plain, "ack");
}

TEST(TlsSessionTest, AServerWithAnotherCertificateIsRefused) {
  Pair pair;
  auto client_ctx = Context();
  auto server_ctx = Context();
  auto expected = Context();  // the reservation names this one
  auto client =
      TlsHandshake::Start(client_ctx, pair.a, Role::kClient, expected->cert_sha256()).value();
  auto server = TlsHandshake::Start(server_ctx, pair.b, Role::kServer, "").value();
  const Driven d = Drive(*client, *server);
  ASSERT_TRUE(absl::IsUnauthenticated(d.client)) << d.client;
  EXPECT_NE(d.client.message().find(absl::BytesToHexString(server_ctx->cert_sha256())),
            std::string::npos)
      << d.client;
  EXPECT_NE(d.client.message().find(absl::BytesToHexString(expected->cert_sha256())),
            std::string::npos)
      << d.client;
  EXPECT_FALSE(client->Finish().ok());
  // The server hears the client's refusal, never completes.
  EXPECT_FALSE(d.server.ok());
  EXPECT_FALSE(server->Finish().ok());
}

TEST(TlsSessionTest, APlaintextPeerFailsTheHandshake) {
  Pair pair;
  auto server = TlsHandshake::Start(Context(), pair.b, Role::kServer, "").value();
  // A collective hello frame in the clear, as a host without TLS would send it.
  SendAll(pair.a, std::string("TSCF\x01\x00\x00\x00") + std::string(24, '\0'));
  absl::StatusOr<Want> w = server->Step();
  ASSERT_FALSE(w.ok());
  EXPECT_TRUE(absl::IsUnavailable(w.status())) << w.status();
  // And a peer that closes at once.
  Pair closed_pair;
  auto server2 = TlsHandshake::Start(Context(), closed_pair.b, Role::kServer, "").value();
  ::shutdown(closed_pair.a, SHUT_WR);
  w = server2->Step();
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("closed"), std::string::npos) << w.status();
}

TEST(TlsSessionTest, AClientFingerprintOfTheWrongSizeIsAnError) {
  Pair pair;
  auto h = TlsHandshake::Start(Context(), pair.a, Role::kClient, "short");
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(h.status()));
}

class RecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto client_ctx = Context();
    auto server_ctx = Context();
    auto client =
        TlsHandshake::Start(client_ctx, pair_.a, Role::kClient, server_ctx->cert_sha256()).value();
    auto server = TlsHandshake::Start(server_ctx, pair_.b, Role::kServer, "").value();
    const Driven d = Drive(*client, *server);
    ASSERT_TRUE(d.client.ok() && d.server.ok()) << d.client << " " << d.server;
    c_ = client->Finish().value();
    s_ = server->Finish().value();
  }
  Pair pair_;
  TlsRecordLayer c_;
  TlsRecordLayer s_;
};

TEST_F(RecordTest, ATamperedRecordFailsAuthenticationAndSpendsTheOpener) {
  std::string wire;
  ASSERT_TRUE(c_.sealer.Seal({"pseudo-gradient bytes"}, &wire).ok());
  wire[kTlsRecordHeader + 3] ^= 1;
  std::string plain;
  bool closed = false;
  absl::StatusOr<size_t> used = s_.opener.Open(wire, &plain, &closed);
  ASSERT_FALSE(used.ok());
  EXPECT_TRUE(absl::IsDataLoss(used.status())) << used.status();
  EXPECT_TRUE(plain.empty());
  std::string good;
  ASSERT_TRUE(c_.sealer.Seal({"next"}, &good).ok());
  EXPECT_FALSE(s_.opener.Open(good, &plain, &closed).ok());
}

TEST_F(RecordTest, ARecordOutOfOrderFails) {
  std::string first;
  std::string second;
  ASSERT_TRUE(c_.sealer.Seal({"one"}, &first).ok());
  ASSERT_TRUE(c_.sealer.Seal({"two"}, &second).ok());
  std::string plain;
  bool closed = false;
  EXPECT_TRUE(absl::IsDataLoss(s_.opener.Open(second, &plain, &closed).status()));
}

TEST_F(RecordTest, AReplayedRecordFails) {
  std::string first;
  ASSERT_TRUE(c_.sealer.Seal({"one"}, &first).ok());
  std::string plain;
  bool closed = false;
  ASSERT_TRUE(s_.opener.Open(first, &plain, &closed).ok());
  EXPECT_TRUE(absl::IsDataLoss(s_.opener.Open(first, &plain, &closed).status()));
}

TEST_F(RecordTest, MalformedHeadersAreRefusedByField) {
  std::string plain;
  bool closed = false;
  // A refused record spends the opener: each case gets a fresh connection (SetUp).
  const auto open = [&](std::string bytes) {
    return s_.opener.Open(bytes, &plain, &closed).status();
  };
  absl::Status type = open(std::string("\x16\x03\x03\x00\x20", 5) + std::string(32, 'x'));
  EXPECT_TRUE(absl::IsInvalidArgument(type));
  EXPECT_NE(type.message().find("outer type 22"), std::string::npos) << type;
  SetUp();
  absl::Status version = open(std::string("\x17\x03\x01\x00\x20", 5) + std::string(32, 'x'));
  EXPECT_NE(version.message().find("version 3.1"), std::string::npos) << version;
  SetUp();
  absl::Status length = open(std::string("\x17\x03\x03\x50\x00", 5));
  EXPECT_NE(length.message().find("20480 bytes"), std::string::npos) << length;
}

TEST_F(RecordTest, SealingNothingWritesNothing) {
  std::string wire;
  ASSERT_TRUE(c_.sealer.Seal({"", ""}, &wire).ok());
  EXPECT_TRUE(wire.empty());
  EXPECT_EQ(TlsSealer::SealedSize(0), 0u);
  EXPECT_EQ(TlsSealer::SealedSize(kTlsMaxPlaintext + 1), kTlsMaxPlaintext + 1 + 2 * 22);
}

// A stock OpenSSL TLS 1.3 client (its own record layer, SSL_read / SSL_write on the socket)
// against this server: the records are TLS's own, both ways, and its close_notify reads as the
// end.
TEST(TlsSessionTest, AStockOpenSslPeerReadsAndWritesTheRecords) {
  Pair pair;
  TlsIdentity client_identity;
  auto client_ctx = Context(&client_identity);
  auto server_ctx = Context();
  SSL_CTX* stock_ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(stock_ctx, nullptr);
  SSL_CTX_set_min_proto_version(stock_ctx, TLS1_3_VERSION);
  BIO* cb = BIO_new_mem_buf(client_identity.cert_pem.data(), -1);
  X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  BIO* kb = BIO_new_mem_buf(client_identity.key_pem.data(), -1);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  ASSERT_EQ(SSL_CTX_use_certificate(stock_ctx, cert), 1);
  ASSERT_EQ(SSL_CTX_use_PrivateKey(stock_ctx, key), 1);
  X509_free(cert);
  EVP_PKEY_free(key);
  BIO_free(cb);
  BIO_free(kb);
  SSL_CTX_set_verify(stock_ctx, SSL_VERIFY_NONE, nullptr);

  const std::string to_server(50000, 's');
  std::string from_server;
  bool stock_ok = false;
  std::thread stock([&] {
    const int fd = pair.a;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    SSL* ssl = SSL_new(stock_ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
      SSL_free(ssl);
      return;
    }
    SSL_write(ssl, to_server.data(), static_cast<int>(to_server.size()));
    char buf[4096];
    while (from_server.size() < 6) {
      const int n = SSL_read(ssl, buf, sizeof(buf));
      if (n <= 0) break;
      from_server.append(buf, static_cast<size_t>(n));
    }
    SSL_shutdown(ssl);
    stock_ok = true;
    SSL_free(ssl);
  });
  auto server = TlsHandshake::Start(server_ctx, pair.b, Role::kServer, "").value();
  absl::StatusOr<Want> w;
  for (int i = 0; i < 2000; ++i) {
    w = server->Step();
    if (!w.ok() || *w == Want::kDone) break;
    pollfd p{pair.b, static_cast<short>(*w == Want::kRead ? POLLIN : POLLOUT), 0};
    ::poll(&p, 1, 1000);
  }
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(*w, Want::kDone);
  EXPECT_EQ(server->peer_cert_sha256(), client_ctx->cert_sha256());
  TlsRecordLayer s = server->Finish().value();
  std::string wire;
  ASSERT_TRUE(s.sealer.Seal({"reply!"}, &wire).ok());
  SendAll(pair.b, wire);

  std::string in;
  std::string plain;
  bool closed = false;
  char buf[65536];
  while (!closed) {
    pollfd p{pair.b, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    const ssize_t n = ::recv(pair.b, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    absl::StatusOr<size_t> used = s.opener.Open(in, &plain, &closed);
    ASSERT_TRUE(used.ok()) << used.status();
    in.erase(0, *used);
  }
  stock.join();
  SSL_CTX_free(stock_ctx);
  EXPECT_TRUE(stock_ok);
  EXPECT_EQ(plain, to_server);
  EXPECT_TRUE(closed);
  EXPECT_EQ(from_server, "reply!");
}

}  // namespace
}  // namespace ts::common
