// Fuzz target: bech32 decoding and account address parsing on arbitrary text (addresses arrive
// in transactions, chain queries, configuration and peer requests). Checks that whatever decodes
// re-encodes to the same (lower-case) text, and that encoding any bytes decodes back.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/crypto/bech32.h"
#include "common/status.h"

namespace {

constexpr size_t kBech32LengthMax = 90;
constexpr size_t kAccountIdSize = 20;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

void CheckText(std::string_view text) {
  using ts::common::Bech32DecodeRaw;
  auto raw = Bech32DecodeRaw(text);
  auto default_prefix = ts::common::ParseAddress("address", text);
  if (!raw.ok()) {
    TS_CHECK(raw.status().code() == absl::StatusCode::kInvalidArgument);
    // Nothing the raw decoder refuses is an address under any prefix.
    TS_CHECK(!default_prefix.ok());
    TS_CHECK(default_prefix.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  TS_CHECK(text.size() <= kBech32LengthMax);
  TS_CHECK(!raw->hrp.empty());
  for (uint8_t v : raw->values) TS_CHECK(v < 32);
  const std::string lower = Lower(text);
  TS_CHECK(ts::common::Bech32EncodeRaw(raw->hrp, raw->values) == lower);

  auto bytes = ts::common::Bech32Decode(raw->hrp, text);
  if (bytes.ok()) {
    TS_CHECK(ts::common::Bech32Encode(raw->hrp, *bytes) == lower);
  } else {
    TS_CHECK(bytes.status().code() == absl::StatusCode::kInvalidArgument);
  }

  auto id = ts::common::ParseAddress("address", text, raw->hrp);
  TS_CHECK(id.ok() == (bytes.ok() && bytes->size() == kAccountIdSize));
  if (id.ok()) {
    TS_CHECK(*id == *bytes);
    TS_CHECK(ts::common::AddressFromBytes(*id, raw->hrp) == lower);
  }
  TS_CHECK(default_prefix.ok() == (id.ok() && raw->hrp == ts::common::kAddressPrefix));
}

// Any bytes encode; the result decodes back exactly when it fits BIP-173's length limit.
void CheckBytes(std::string_view bytes) {
  const std::string text = ts::common::Bech32Encode(ts::common::kAddressPrefix, bytes);
  auto back = ts::common::Bech32Decode(ts::common::kAddressPrefix, text);
  TS_CHECK(back.ok() == (text.size() <= kBech32LengthMax));
  if (back.ok()) TS_CHECK(*back == bytes);
  if (bytes.size() == kAccountIdSize) {
    auto id = ts::common::ParseAddress("address", ts::common::AddressFromBytes(bytes));
    TS_CHECK(id.ok() && *id == bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  CheckText(input);
  CheckBytes(input);
  return 0;
}
