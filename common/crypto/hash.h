// Hash functions (OpenSSL behind this header): SHA-256 and RIPEMD-160. Digests are returned as
// raw byte strings. Pure functions and a single-owner incremental hasher; thread-safe.
#ifndef TS_COMMON_CRYPTO_HASH_H_
#define TS_COMMON_CRYPTO_HASH_H_

#include <memory>
#include <string>
#include <string_view>

namespace ts::common {

inline constexpr size_t kSha256Size = 32;
inline constexpr size_t kRipemd160Size = 20;

std::string Sha256(std::string_view data);     // 32 bytes
std::string Ripemd160(std::string_view data);  // 20 bytes

// Incremental SHA-256. Not thread-safe: one owner.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(std::string_view data);
  // Returns the 32-byte digest; the hasher is then reset and may be reused.
  std::string Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::common

#endif  // TS_COMMON_CRYPTO_HASH_H_
