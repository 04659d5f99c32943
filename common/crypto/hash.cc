#include "common/crypto/hash.h"

#include <openssl/evp.h>

#include "common/status.h"

namespace ts::common {
namespace {

// RIPEMD-160 lives in OpenSSL 3.0's default provider (it was moved back from the legacy provider
// in 3.0.7, and Debian 12 ships 3.0.x with it there), so EVP_ripemd160() is used first. Builds
// where it is absent from the default provider make the implicit fetch fail; for those the
// algorithm is fetched explicitly by name, which also finds it when the legacy provider is loaded
// by the system configuration. The fetched method is kept for the life of the process.
const EVP_MD* Ripemd160Md() {
  static const EVP_MD* md = [] {
    const EVP_MD* implicit = EVP_ripemd160();
    EVP_MD_CTX* probe = EVP_MD_CTX_new();
    TS_CHECK(probe != nullptr);
    const bool usable = implicit != nullptr && EVP_DigestInit_ex(probe, implicit, nullptr) == 1;
    EVP_MD_CTX_free(probe);
    if (usable) return implicit;
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "RIPEMD160", nullptr);
    TS_CHECK(fetched != nullptr);
    return fetched;
  }();
  return md;
}

std::string Digest(const EVP_MD* md, std::string_view data, size_t size) {
  std::string out(size, '\0');
  unsigned int written = 0;
  TS_CHECK(EVP_Digest(data.data(), data.size(), reinterpret_cast<unsigned char*>(out.data()),
                      &written, md, nullptr) == 1);
  TS_CHECK(written == size);
  return out;
}

}  // namespace

std::string Sha256(std::string_view data) { return Digest(EVP_sha256(), data, kSha256Size); }

std::string Ripemd160(std::string_view data) { return Digest(Ripemd160Md(), data, kRipemd160Size); }

struct Sha256Hasher::Impl {
  EVP_MD_CTX* ctx = nullptr;
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Sha256Hasher::Sha256Hasher() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  TS_CHECK(impl_->ctx != nullptr);
  TS_CHECK(EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1);
}

Sha256Hasher::~Sha256Hasher() = default;

void Sha256Hasher::Update(std::string_view data) {
  TS_CHECK(EVP_DigestUpdate(impl_->ctx, data.data(), data.size()) == 1);
}

std::string Sha256Hasher::Finish() {
  std::string out(kSha256Size, '\0');
  unsigned int written = 0;
  TS_CHECK(EVP_DigestFinal_ex(impl_->ctx, reinterpret_cast<unsigned char*>(out.data()), &written) ==
           1);
  TS_CHECK(written == kSha256Size);
  TS_CHECK(EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1);
  return out;
}

}  // namespace ts::common
