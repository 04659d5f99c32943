// Gas: what executing a tx costs, metered deterministically as the Cosmos SDK meters it (its
// default KVStore and auth costs), and the fee a gas limit needs at the chain's minimum gas
// price. docs/chain-module.md, "Fees and gas", lists the costs. Internal to the module.
//
// Thread-safety: a GasMeter has one owner thread (the App's); the free functions are pure.
#ifndef TS_CHAIN_BRIDGE_MODULE_GAS_H_
#define TS_CHAIN_BRIDGE_MODULE_GAS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::bridge {

// The SDK's default costs (x/auth params and storetypes.KVGasConfig).
namespace gas {
inline constexpr uint64_t kTxSizePerByte = 10;
inline constexpr uint64_t kSigVerifySecp256k1 = 1000;
inline constexpr uint64_t kHasFlat = 1000;
inline constexpr uint64_t kReadFlat = 1000;
inline constexpr uint64_t kReadPerByte = 3;
inline constexpr uint64_t kWriteFlat = 2000;
inline constexpr uint64_t kWritePerByte = 30;
inline constexpr uint64_t kDeleteFlat = 1000;
inline constexpr uint64_t kIterNextFlat = 30;
// Paying the fee, charged flat in every tx (with or without a fee, simulated or not) instead
// of metering its state accesses: a simulation carries no fee, and would otherwise measure less
// than the paid tx uses.
inline constexpr uint64_t kDeductFee = 20000;
}  // namespace gas

// The largest gas limit a tx may ask for (a block has no gas limit of its own on the devnet; its
// byte and tx caps bound it).
inline constexpr uint64_t kMaxTxGas = 100'000'000;

// Counts the gas a tx consumes against its limit. Consumption past the limit does not stop the
// caller (state reads return as usual); the App checks exhausted() after the ante step and after
// every message and refuses the tx with OutOfGas(), as the SDK's meter panics and recovers.
class GasMeter {
 public:
  explicit GasMeter(uint64_t limit) : limit_(limit) {}

  void Consume(uint64_t amount, std::string_view descriptor);

  uint64_t limit() const { return limit_; }
  // Saturates at UINT64_MAX.
  uint64_t consumed() const { return consumed_; }
  bool exhausted() const { return consumed_ > limit_; }
  // SDK code 11: "out of gas in location: <where it ran out>; gasWanted: L, gasUsed: C".
  absl::Status OutOfGas() const;

 private:
  uint64_t limit_;
  uint64_t consumed_ = 0;
  std::string exhausted_at_;
};

// A minimum gas price: ngonka per unit of gas, held as an integer number of 10^-18 ngonka.
struct GasPrice {
  unsigned __int128 atto = 0;
  bool zero() const { return atto == 0; }
};

// Parses a non-negative decimal ("0", "0.0025", "1.5"): at most 9 integer digits and 18
// fraction digits, no sign or exponent. The empty string is a price of zero. INVALID_ARGUMENT
// naming `field` and the value otherwise.
absl::StatusOr<GasPrice> ParseGasPrice(std::string_view field, std::string_view text);

// ceil(price * gas_limit) in ngonka; fits in uint64 for every price ParseGasPrice accepts and
// gas_limit <= kMaxTxGas.
uint64_t RequiredFee(GasPrice price, uint64_t gas_limit);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_GAS_H_
