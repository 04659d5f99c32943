// What the Keeper's source files share and nothing else uses: field errors, the state's typed
// reads (a record that does not parse is DATA_LOSS naming its key), stored amounts, and 128-bit
// sums in messages. Internal to the module (keeper.cc, keeper_shards.cc).
#ifndef TS_CHAIN_BRIDGE_MODULE_KEEPER_UTIL_H_
#define TS_CHAIN_BRIDGE_MODULE_KEEPER_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chain-bridge/module/kv_overlay.h"
#include "chain-bridge/module/str_cat.h"

namespace ts::bridge::keeper_util {

using u128 = unsigned __int128;

inline constexpr uint64_t kPpm = 1'000'000;
inline constexpr uint64_t kBps = 10'000;

// INVALID_ARGUMENT "field: parts...".
absl::Status Invalid(std::string_view field, const auto&... parts) {
  return absl::InvalidArgumentError(Cat(field, ": ", parts...));
}

// A key for messages: its text prefix, then the binary part in hex.
std::string KeyName(std::string_view key);

// The record of type T under `key`, nullopt when absent; DATA_LOSS when it does not parse.
template <typename T>
absl::StatusOr<std::optional<T>> Load(const KvOverlay& kv, std::string_view key) {
  std::optional<std::string> bytes = kv.Get(key);
  if (!bytes.has_value()) return std::optional<T>();
  T record;
  if (!record.ParseFromString(*bytes)) {
    return absl::DataLossError(
        Cat("state key ", KeyName(key), " does not hold a valid ", T::descriptor()->full_name()));
  }
  return std::optional<T>(std::move(record));
}

// The big-endian u64 under `key`, `absent` when there is none.
absl::StatusOr<uint64_t> LoadU64(const KvOverlay& kv, std::string_view key, uint64_t absent);

// Amounts already validated when they were stored; a bad one means corrupted state (DATA_LOSS).
absl::StatusOr<uint64_t> StoredAmount(std::string_view what, std::string_view value);

std::string U128ToString(u128 value);

}  // namespace ts::bridge::keeper_util

#endif  // TS_CHAIN_BRIDGE_MODULE_KEEPER_UTIL_H_
