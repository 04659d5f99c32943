#include "common/crypto/hash.h"

#include <string>

#include "common/hex.h"
#include "gtest/gtest.h"

namespace ts::common {
namespace {

// NIST FIPS 180-2, Appendix B (SHA-256 examples).
TEST(Sha256Test, Fips180Examples) {
  EXPECT_EQ(HexEncode(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HexEncode(Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(HexEncode(Sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, EmptyInput) {
  EXPECT_EQ(HexEncode(Sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256Test, IncrementalMatchesOneShotAndResets) {
  const std::string million(1000000, 'a');
  Sha256Hasher hasher;
  // Uneven pieces cross the 64-byte block boundary at different offsets.
  size_t pos = 0;
  for (size_t piece = 1; pos < million.size(); piece = piece * 3 + 1) {
    const size_t n = std::min(piece, million.size() - pos);
    hasher.Update(std::string_view(million).substr(pos, n));
    pos += n;
  }
  EXPECT_EQ(HexEncode(hasher.Finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // After Finish the hasher starts over.
  hasher.Update("a");
  hasher.Update("bc");
  EXPECT_EQ(hasher.Finish(), Sha256("abc"));
  EXPECT_EQ(hasher.Finish(), Sha256(""));
}

// The test vectors of the RIPEMD-160 page (A. Bosselaers, KU Leuven).
TEST(Ripemd160Test, PublishedVectors) {
  EXPECT_EQ(HexEncode(Ripemd160("")), "9c1185a5c5e9fc54612808977ee8f548b2258d31");
  EXPECT_EQ(HexEncode(Ripemd160("a")), "0bdc9d2d256b3ee9daae347be6f4dc835a467ffe");
  EXPECT_EQ(HexEncode(Ripemd160("abc")), "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc");
  EXPECT_EQ(HexEncode(Ripemd160("message digest")), "5d0689ef49d2fae572b881b123a85ffa21595f36");
  EXPECT_EQ(HexEncode(Ripemd160("abcdefghijklmnopqrstuvwxyz")),
            "f71c27109c692c1b56bbdceb5b9d2865b3708dbc");
  EXPECT_EQ(HexEncode(Ripemd160("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "12a053384a9c0c88e405a06c27dcf49ada62eb2b");
  EXPECT_EQ(HexEncode(Ripemd160("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")),
            "b0e20b6e3116640286ed3a87a5713079b21f5189");
  std::string eight_times;
  for (int i = 0; i < 8; ++i) eight_times += "1234567890";
  EXPECT_EQ(HexEncode(Ripemd160(eight_times)), "9b752e45573d4b39f4dbd3323cab82bf63326bfb");
  EXPECT_EQ(HexEncode(Ripemd160(std::string(1000000, 'a'))),
            "52783243c1697bdbe16d37f97f68f08325dc1528");
}

TEST(HashTest, DigestSizes) {
  EXPECT_EQ(Sha256("x").size(), kSha256Size);
  EXPECT_EQ(Ripemd160("x").size(), kRipemd160Size);
}

}  // namespace
}  // namespace ts::common
