// A copy-on-write view of the chain's ordered key-value state: reads fall through to a parent
// (another overlay or the finalized state), writes stay in the overlay until Commit() folds them
// into the parent. This is how a tx runs in a branch that is dropped when it fails, and how a
// block's change set is collected. Internal to the module.
//
// Thread-safety: not thread-safe; an overlay, its parents and the KvState under them have one
// owner thread.
#ifndef TS_CHAIN_BRIDGE_MODULE_KV_OVERLAY_H_
#define TS_CHAIN_BRIDGE_MODULE_KV_OVERLAY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "chain-bridge/module/gas.h"

namespace ts::bridge {

// The finalized state an overlay chain ends in: the ordered map (what scans, the app hash and
// App::state() walk) and a hash index of its entries for point lookups, which the ordered map
// would answer by comparing long shared key prefixes (module prefix, id, "gonka1") at every
// level of the tree. Neither copyable nor movable: the index points into the map's nodes.
class KvState {
 public:
  using Map = std::map<std::string, std::string>;

  KvState() = default;
  KvState(const KvState&) = delete;
  KvState& operator=(const KvState&) = delete;

  // Replaces the whole state.
  void Assign(Map map);
  const Map& map() const { return map_; }
  const std::string* Find(std::string_view key) const;
  // Sets `key` to `value`, or deletes it for nullopt. False when that changes nothing (the same
  // value, or deleting an absent key).
  bool Apply(const std::string& key, const std::optional<std::string>& value);

 private:
  Map map_;
  absl::flat_hash_map<absl::string_view, std::string*> index_;
};

class KvOverlay {
 public:
  using Writes = std::map<std::string, std::optional<std::string>, std::less<>>;

  // A view over the finalized state, which must outlive the overlay and not change under it.
  explicit KvOverlay(const KvState* base) : base_(base) {}
  // A branch of `parent`, which must outlive the overlay. It charges the parent's gas meter.
  explicit KvOverlay(KvOverlay* parent) : parent_(parent), gas_(parent->gas_) {}

  KvOverlay(const KvOverlay&) = delete;
  KvOverlay& operator=(const KvOverlay&) = delete;

  // Charges every read, write, delete and scanned entry to `meter` (gas.h's costs) from now on,
  // and so do branches made of this overlay afterwards; nullptr stops charging. The meter must
  // outlive the overlay.
  void set_gas_meter(GasMeter* meter) { gas_ = meter; }
  GasMeter* gas_meter() const { return gas_; }
  // Charges `amount` to the meter, if there is one (for work that is not a state access, such
  // as a signature check).
  void ConsumeGas(uint64_t amount, std::string_view descriptor) const {
    if (gas_ != nullptr) gas_->Consume(amount, descriptor);
  }

  std::optional<std::string> Get(std::string_view key) const;
  // The value of `key` in the merged view without copying it, or nullptr when absent. The
  // pointer is valid until the next write to this overlay or any of its parents.
  const std::string* Find(std::string_view key) const;
  bool Contains(std::string_view key) const;
  void Set(std::string_view key, std::string value);
  void Delete(std::string_view key);

  // The merged view's entries whose key starts with `prefix` and is >= `start` (when `start`
  // is not empty), in key order, at most `limit` of them.
  std::vector<std::pair<std::string, std::string>> Scan(std::string_view prefix,
                                                        std::string_view start = "",
                                                        size_t limit = SIZE_MAX) const;

  // Folds this overlay's writes into its parent overlay and clears them (values are moved, not
  // copied). Programmer error on an overlay over the finalized state (those are applied by
  // their owner through writes() or TakeWrites()).
  void Commit();

  const Writes& writes() const { return writes_; }
  // Moves the writes out, leaving the overlay empty.
  Writes TakeWrites() { return std::exchange(writes_, Writes()); }
  void Clear() { writes_.clear(); }

 private:
  const std::string* FindUncharged(std::string_view key) const;
  std::vector<std::pair<std::string, std::string>> ScanUncharged(std::string_view prefix,
                                                                 std::string_view start,
                                                                 size_t limit) const;
  void ChargeRead(std::string_view key, const std::string* value) const;

  const KvState* base_ = nullptr;
  KvOverlay* parent_ = nullptr;
  GasMeter* gas_ = nullptr;
  Writes writes_;
};

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_KV_OVERLAY_H_
