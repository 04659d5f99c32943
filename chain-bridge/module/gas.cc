#include "chain-bridge/module/gas.h"

#include "chain-bridge/module/str_cat.h"
#include "chain-bridge/module/tx_errors.h"

namespace ts::bridge {
namespace {

using u128 = unsigned __int128;
constexpr int kIntegerDigitsMax = 9;
constexpr int kFractionDigits = 18;

constexpr u128 Pow10(int n) {
  u128 value = 1;
  for (int i = 0; i < n; ++i) value *= 10;
  return value;
}

}  // namespace

void GasMeter::Consume(uint64_t amount, std::string_view descriptor) {
  bool was_exhausted = exhausted();
  consumed_ = amount > UINT64_MAX - consumed_ ? UINT64_MAX : consumed_ + amount;
  if (!was_exhausted && exhausted()) exhausted_at_ = std::string(descriptor);
}

absl::Status GasMeter::OutOfGas() const {
  return SdkError(SdkCode::kOutOfGas, Cat("out of gas in location: ", exhausted_at_,
                                          "; gasWanted: ", limit_, ", gasUsed: ", consumed_));
}

absl::StatusOr<GasPrice> ParseGasPrice(std::string_view field, std::string_view text) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(Cat(field, ": '", text.substr(0, 64), "' ", why));
  };
  if (text.empty()) return GasPrice{};
  size_t dot = text.find('.');
  std::string_view integer = text.substr(0, dot);
  std::string_view fraction = dot == std::string_view::npos ? "" : text.substr(dot + 1);
  if (integer.empty() || (dot != std::string_view::npos && fraction.empty())) {
    return bad("is not a decimal number (digits, optionally '.' and more digits)");
  }
  if (integer.size() > kIntegerDigitsMax) {
    return bad(Cat("has more than ", kIntegerDigitsMax, " integer digits"));
  }
  if (fraction.size() > kFractionDigits) {
    return bad(Cat("has more than ", kFractionDigits, " fraction digits"));
  }
  GasPrice price;
  for (std::string_view part : {integer, fraction}) {
    for (char c : part) {
      if (c < '0' || c > '9') return bad("is not a decimal number");
      price.atto = price.atto * 10 + static_cast<u128>(c - '0');
    }
  }
  price.atto *= Pow10(kFractionDigits - static_cast<int>(fraction.size()));
  return price;
}

uint64_t RequiredFee(GasPrice price, uint64_t gas_limit) {
  constexpr u128 kUnit = Pow10(kFractionDigits);
  u128 product = price.atto * gas_limit;
  return static_cast<uint64_t>((product + kUnit - 1) / kUnit);
}

}  // namespace ts::bridge
