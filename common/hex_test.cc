#include "common/hex.h"

#include <string>

#include "gtest/gtest.h"

namespace ts::common {
namespace {

TEST(HexTest, EncodesLowerAndUpper) {
  EXPECT_EQ(HexEncode(""), "");
  EXPECT_EQ(HexEncode(std::string("\x00\x01\x7f\x80\xab\xff", 6)), "00017f80abff");
  EXPECT_EQ(HexEncodeUpper(std::string("\x00\x01\x7f\x80\xab\xff", 6)), "00017F80ABFF");
}

TEST(HexTest, DecodesEitherCase) {
  EXPECT_EQ(*HexDecode(""), "");
  EXPECT_EQ(*HexDecode("00017f80abff"), std::string("\x00\x01\x7f\x80\xab\xff", 6));
  EXPECT_EQ(*HexDecode("00017F80ABFF"), std::string("\x00\x01\x7f\x80\xab\xff", 6));
  EXPECT_EQ(*HexDecode("aBcD"), "\xab\xcd");
}

TEST(HexTest, RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  EXPECT_EQ(*HexDecode(HexEncode(all)), all);
  EXPECT_EQ(*HexDecode(HexEncodeUpper(all)), all);
  EXPECT_EQ(HexEncode(all).size(), 512u);
}

TEST(HexTest, RejectsOddLengthAndNonHex) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(HexDecode("0").status().code(), kInvalid);
  EXPECT_EQ(HexDecode("abc").status().code(), kInvalid);
  EXPECT_EQ(HexDecode("0g").status().code(), kInvalid);
  EXPECT_EQ(HexDecode("g0").status().code(), kInvalid);
  EXPECT_EQ(HexDecode("0x00").status().code(), kInvalid);
  EXPECT_EQ(HexDecode(" 0").status().code(), kInvalid);
  EXPECT_EQ(HexDecode(std::string("0\0", 2)).status().code(), kInvalid);
  EXPECT_EQ(HexDecode("\xff\xff").status().code(), kInvalid);
  // The message says where.
  EXPECT_NE(HexDecode("00zz").status().message().find("offset 2"), absl::string_view::npos);
  EXPECT_NE(HexDecode("abc").status().message().find("odd length 3"), absl::string_view::npos);
}

}  // namespace
}  // namespace ts::common
