#include "common/amount.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace ts::common {
namespace {

TEST(AmountTest, ParsesCanonicalDecimal) {
  EXPECT_EQ(*ParseAmount("amount", "0"), 0u);
  EXPECT_EQ(*ParseAmount("amount", "1"), 1u);
  EXPECT_EQ(*ParseAmount("amount", "1000000000"), 1000000000u);
  EXPECT_EQ(*ParseAmount("amount", "18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(*ParseAmount("amount", "18446744073709551614"), UINT64_MAX - 1);
  EXPECT_EQ(*ParseAmount("amount", "9999999999999999999"), 9999999999999999999ULL);
}

TEST(AmountTest, RejectsNonCanonicalOrOverflowing) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  for (const char* bad :
       {"", "-1", "+1", "01", "00", " 1", "1 ", "1.0", "1e3", "0x10", "abc", "18446744073709551616",
        "99999999999999999999", "100000000000000000000", "1ngonka"}) {
    EXPECT_EQ(ParseAmount("amount", bad).status().code(), kInvalid) << "'" << bad << "'";
  }
  EXPECT_EQ(ParseAmount("amount", std::string("1\0", 2)).status().code(), kInvalid);
}

TEST(AmountTest, ErrorNamesFieldAndValue) {
  const absl::Status st = ParseAmount("escrow.amount", "12x").status();
  EXPECT_NE(st.message().find("escrow.amount"), absl::string_view::npos);
  EXPECT_NE(st.message().find("12x"), absl::string_view::npos);
  // A huge value is truncated in the message rather than copied whole.
  const std::string huge(100000, '7');
  EXPECT_LT(ParseAmount("f", huge).status().message().size(), 200u);
}

TEST(AmountTest, FormatRoundTrips) {
  for (uint64_t v : {uint64_t{0}, uint64_t{7}, uint64_t{1234567890}, UINT64_MAX}) {
    EXPECT_EQ(*ParseAmount("v", FormatAmount(v)), v);
  }
  EXPECT_EQ(FormatAmount(UINT64_MAX), "18446744073709551615");
}

TEST(AmountTest, CheckedAdd) {
  EXPECT_EQ(*CheckedAdd("total", 1, 2), 3u);
  EXPECT_EQ(*CheckedAdd("total", UINT64_MAX - 1, 1), UINT64_MAX);
  EXPECT_EQ(*CheckedAdd("total", 0, UINT64_MAX), UINT64_MAX);
  const absl::Status st = CheckedAdd("escrow.total", UINT64_MAX, 1).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("escrow.total"), absl::string_view::npos);
  EXPECT_EQ(CheckedAdd("t", UINT64_MAX, UINT64_MAX).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::common
