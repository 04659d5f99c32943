// A copy-on-write view of the chain's ordered key-value state: reads fall through to a parent
// (another overlay or the finalized map), writes stay in the overlay until Commit() folds them
// into the parent. This is how a tx runs in a branch that is dropped when it fails, and how a
// block's change set is collected. Internal to the module.
//
// Thread-safety: not thread-safe; an overlay and its parents have one owner thread.
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

namespace ts::bridge {

class KvOverlay {
 public:
  using Writes = std::map<std::string, std::optional<std::string>, std::less<>>;

  // A view over a finalized map, which must outlive the overlay and not change under it.
  explicit KvOverlay(const std::map<std::string, std::string>* base) : base_(base) {}
  // A branch of `parent`, which must outlive the overlay.
  explicit KvOverlay(KvOverlay* parent) : parent_(parent) {}

  KvOverlay(const KvOverlay&) = delete;
  KvOverlay& operator=(const KvOverlay&) = delete;

  std::optional<std::string> Get(std::string_view key) const;
  void Set(std::string_view key, std::string value);
  void Delete(std::string_view key);

  // The merged view's entries whose key starts with `prefix` and is >= `start` (when `start`
  // is not empty), in key order, at most `limit` of them.
  std::vector<std::pair<std::string, std::string>> Scan(std::string_view prefix,
                                                        std::string_view start = "",
                                                        size_t limit = SIZE_MAX) const;

  // Folds this overlay's writes into its parent overlay and clears them. Programmer error on
  // an overlay over a finalized map (those are applied by their owner through writes()).
  void Commit();

  const Writes& writes() const { return writes_; }
  void Clear() { writes_.clear(); }

 private:
  const std::map<std::string, std::string>* base_ = nullptr;
  KvOverlay* parent_ = nullptr;
  Writes writes_;
};

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_KV_OVERLAY_H_
