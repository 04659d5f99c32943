#include "common/crypto/bech32.h"

#include <string>
#include <vector>

#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/hex.h"
#include "gtest/gtest.h"

namespace ts::common {
namespace {

std::string Unhex(std::string_view hex) {
  auto bytes = HexDecode(hex);
  EXPECT_TRUE(bytes.ok()) << hex;
  return bytes.ok() ? *bytes : std::string();
}

std::string Lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

// 5-bit groups to bytes, for reading a segwit program out of decoded raw values.
std::string FiveToEight(const std::vector<uint8_t>& values, size_t from) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = from; i < values.size(); ++i) {
    acc = (acc << 5) | values[i];
    bits += 5;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// BIP-173 "Test vectors": strings with a valid Bech32 checksum.
TEST(Bech32Test, Bip173ValidChecksums) {
  const std::vector<std::string> valid = {
      "A12UEL5L",
      "a12uel5l",
      "an83characterlonghumanreadablepartthatcontainsthenumber1andtheexcludedcharactersbio1tt5tgs",
      "abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw",
      "11qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqc8247j",
      "split1checkupstagehandshakeupstreamerranterredcaperred2y9e3w",
      "?1ezyfcl",
  };
  for (const std::string& text : valid) {
    SCOPED_TRACE(text);
    auto decoded = Bech32DecodeRaw(text);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    // Re-encoding gives the lower-case form back.
    EXPECT_EQ(Bech32EncodeRaw(decoded->hrp, decoded->values), Lower(text));
  }
}

TEST(Bech32Test, Bip173ValidVectorsDecodeToTheirParts) {
  auto a = Bech32DecodeRaw("A12UEL5L");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->hrp, "a");
  EXPECT_TRUE(a->values.empty());

  auto abcdef = Bech32DecodeRaw("abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw");
  ASSERT_TRUE(abcdef.ok());
  EXPECT_EQ(abcdef->hrp, "abcdef");
  // The data part is the whole alphabet in order, i.e. the values 0..31.
  std::vector<uint8_t> all(32);
  for (int i = 0; i < 32; ++i) all[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(abcdef->values, all);

  auto ones = Bech32DecodeRaw(
      "11qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqc8247j");
  ASSERT_TRUE(ones.ok());
  EXPECT_EQ(ones->hrp, "1");
  EXPECT_EQ(ones->values, std::vector<uint8_t>(82, 0));
}

struct InvalidVector {
  std::string text;
  const char* reason;
};

// BIP-173 "Test vectors": strings that are not valid Bech32, with the reason BIP-173 gives.
TEST(Bech32Test, Bip173InvalidStrings) {
  const std::vector<InvalidVector> invalid = {
      {std::string("\x20") + "1nwldj5", "HRP character out of range"},
      {std::string("\x7f") + "1axkwrx", "HRP character out of range"},
      {std::string("\x80") + "1eym55h", "HRP character out of range"},
      {"an84characterslonghumanreadablepartthatcontainsthenumber1andtheexcludedcharactersbio1569pv"
       "x",
       "overall max length exceeded"},
      {"pzry9x0s0muk", "No separator character"},
      {"1pzry9x0s0muk", "Empty HRP"},
      {"x1b4n0q5v", "Invalid data character"},
      {"li1dgmt3", "Too short checksum"},
      {std::string("de1lg7wt") + "\xff", "Invalid character in checksum"},
      {"A1G7SGD8", "checksum calculated with uppercase form of HRP"},
      {"10a06t8", "empty HRP"},
      {"1qzzfhee", "empty HRP"},
  };
  for (const auto& v : invalid) {
    SCOPED_TRACE(v.reason);
    auto decoded = Bech32DecodeRaw(v.text);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(Bech32Test, ErrorsNameTheProblem) {
  EXPECT_NE(Bech32DecodeRaw("pzry9x0s0muk").status().message().find("separator"),
            absl::string_view::npos);
  EXPECT_NE(Bech32DecodeRaw("A1G7SGD8").status().message().find("checksum"),
            absl::string_view::npos);
  EXPECT_NE(Bech32DecodeRaw("x1b4n0q5v").status().message().find("data character"),
            absl::string_view::npos);
  EXPECT_NE(Bech32DecodeRaw("tb1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3q0sL5k7")
                .status()
                .message()
                .find("mixed case"),
            absl::string_view::npos);
}

// BIP-173 segwit examples decoded at the raw level: the first 5-bit value is the witness
// version, the rest regroup to the witness program.
TEST(Bech32Test, Bip173SegwitExamplesAsRawData) {
  struct Segwit {
    const char* address;
    const char* hrp;
    int version;
    const char* program;
  };
  const Segwit examples[] = {
      {"BC1QW508D6QEJXTDG4Y5R3ZARVARY0C5XW7KV8F3T4", "bc", 0,
       "751e76e8199196d454941c45d1b3a323f1433bd6"},
      {"tb1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3q0sl5k7", "tb", 0,
       "1863143c14c5166804bd19203356da136c985678cd4d27a1b8c6329604903262"},
      {"bc1pw508d6qejxtdg4y5r3zarvary0c5xw7kw508d6qejxtdg4y5r3zarvary0c5xw7k7grplx", "bc", 1,
       "751e76e8199196d454941c45d1b3a323f1433bd6751e76e8199196d454941c45d1b3a323f1433bd6"},
      {"BC1SW50QA3JX3S", "bc", 16, "751e"},
      {"bc1zw508d6qejxtdg4y5r3zarvaryvg6kdaj", "bc", 2, "751e76e8199196d454941c45d1b3a323"},
      {"tb1qqqqqp399et2xygdj5xreqhjjvcmzhxw4aywxecjdzew6hylgvsesrxh6hy", "tb", 0,
       "000000c4a5cad46221b2a187905e5266362b99d5e91c6ce24d165dab93e86433"},
  };
  for (const auto& e : examples) {
    SCOPED_TRACE(e.address);
    auto decoded = Bech32DecodeRaw(e.address);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->hrp, e.hrp);
    ASSERT_FALSE(decoded->values.empty());
    EXPECT_EQ(decoded->values[0], e.version);
    EXPECT_EQ(HexEncode(FiveToEight(decoded->values, 1)), e.program);
    EXPECT_EQ(Bech32EncodeRaw(decoded->hrp, decoded->values), Lower(e.address));
  }
  // "Invalid checksum" from the invalid segwit list fails at the Bech32 level too.
  EXPECT_FALSE(Bech32DecodeRaw("bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t5").ok());
}

TEST(Bech32Test, ByteRoundTrips) {
  for (size_t n : {0u, 1u, 5u, 20u, 32u, 40u}) {
    std::string bytes;
    for (size_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(i * 37 + 11));
    const std::string text = Bech32Encode("gonka", bytes);
    auto back = Bech32Decode("gonka", text);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, bytes);
  }
}

TEST(Bech32Test, DecodeChecksPrefixAndPadding) {
  const std::string text = Bech32Encode("gonka", std::string(20, '\x01'));
  EXPECT_EQ(Bech32Decode("cosmos", text).status().code(), absl::StatusCode::kInvalidArgument);
  // Non-zero padding bits: one 5-bit value 0b00001 after 8 full bits is not canonical.
  EXPECT_EQ(Bech32Decode("gonka", Bech32EncodeRaw("gonka", {0, 0, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A lone 5-bit value is a whole spare group, also not canonical.
  EXPECT_EQ(Bech32Decode("gonka", Bech32EncodeRaw("gonka", {0})).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The BIP-173 "zero padding of more than 4 bits" and "non-zero padding" examples, read as
  // plain 8-bit payloads after their witness version.
  auto more_than_4 = Bech32DecodeRaw("bc1zw508d6qejxtdg4y5r3zarvaryvqyzf3du");
  ASSERT_TRUE(more_than_4.ok());
  std::vector<uint8_t> program(more_than_4->values.begin() + 1, more_than_4->values.end());
  EXPECT_FALSE(Bech32Decode("bc", Bech32EncodeRaw("bc", program)).ok());
  auto nonzero = Bech32DecodeRaw("tb1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3pjxtptv");
  ASSERT_TRUE(nonzero.ok());
  program.assign(nonzero->values.begin() + 1, nonzero->values.end());
  EXPECT_FALSE(Bech32Decode("tb", Bech32EncodeRaw("tb", program)).ok());
}

// Module accounts of the Cosmos Hub, as published in its genesis and documentation
// (authtypes.NewModuleAddress).
TEST(AddressTest, CosmosModuleAddresses) {
  EXPECT_EQ(ModuleAddress("gov", "cosmos"), "cosmos10d07y265gmmuvt4z0w9aw880jnsr700j6zn9kn");
  EXPECT_EQ(ModuleAddress("fee_collector", "cosmos"),
            "cosmos17xpfvakm2amg962yls6f84z3kell8c5lserqta");
  EXPECT_EQ(ModuleAddress("bonded_tokens_pool", "cosmos"),
            "cosmos1fl48vsnmsdzcv85q5d2q4z5ajdha8yu34mf0eh");
  EXPECT_EQ(ModuleAddress("not_bonded_tokens_pool", "cosmos"),
            "cosmos1tygms3xhhs3yv487phx3dw4a95jn7t7lpm470r");
  auto gov = ParseAddress("authority", "cosmos10d07y265gmmuvt4z0w9aw880jnsr700j6zn9kn", "cosmos");
  ASSERT_TRUE(gov.ok()) << gov.status();
  EXPECT_EQ(*gov, Sha256("gov").substr(0, 20));
}

// The generator's compressed key hashes to 751e76e8...3bd6, the program of BIP-173's first
// segwit example, so its account address carries the same 20 bytes under a Cosmos prefix.
TEST(AddressTest, GeneratorKeyAddress) {
  auto key = PrivateKey::FromBytes(
      Unhex("0000000000000000000000000000000000000000000000000000000000000001"));
  ASSERT_TRUE(key.ok());
  const std::string id = Unhex("751e76e8199196d454941c45d1b3a323f1433bd6");
  EXPECT_EQ(Ripemd160(Sha256(key->public_key())), id);
  const std::string cosmos = AddressFromPublicKey(key->public_key(), "cosmos");
  EXPECT_EQ(cosmos, AddressFromBytes(id, "cosmos"));
  // Same 5-bit data as the segwit address without its version character.
  EXPECT_EQ(cosmos.substr(0, 39), "cosmos1w508d6qejxtdg4y5r3zarvary0c5xw7k");
  auto parsed = ParseAddress("signer", cosmos, "cosmos");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, id);
  const std::string gonka = AddressFromPublicKey(key->public_key());
  EXPECT_EQ(gonka.substr(0, 6), "gonka1");
  EXPECT_EQ(*ParseAddress("signer", gonka), id);
}

TEST(AddressTest, ParseAddressRejects) {
  const std::string id(20, '\x07');
  const std::string good = AddressFromBytes(id);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  // Wrong prefix.
  EXPECT_EQ(ParseAddress("to", AddressFromBytes(id, "cosmos")).status().code(), kInvalid);
  // Wrong payload size.
  EXPECT_EQ(ParseAddress("to", Bech32Encode("gonka", std::string(32, '\x07'))).status().code(),
            kInvalid);
  EXPECT_EQ(ParseAddress("to", Bech32Encode("gonka", std::string(19, '\x07'))).status().code(),
            kInvalid);
  // Changed character.
  std::string typo = good;
  typo[10] = typo[10] == 'q' ? 'p' : 'q';
  EXPECT_EQ(ParseAddress("to", typo).status().code(), kInvalid);
  EXPECT_EQ(ParseAddress("to", "").status().code(), kInvalid);
  // The message names the field and the value.
  const absl::Status st = ParseAddress("msg.recipient", typo).status();
  EXPECT_NE(st.message().find("msg.recipient"), absl::string_view::npos);
  EXPECT_NE(st.message().find(typo), absl::string_view::npos);
  // Upper case is a valid spelling of the same address.
  std::string upper = good;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(*ParseAddress("to", upper), id);
}

}  // namespace
}  // namespace ts::common
