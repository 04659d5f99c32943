#include "chain-bridge/module/kv_overlay.h"

#include "common/status.h"

namespace ts::bridge {

void KvState::Assign(Map map) {
  index_.clear();
  map_ = std::move(map);
  index_.reserve(map_.size());
  for (auto& [key, value] : map_) index_.emplace(absl::string_view(key), &value);
}

const std::string* KvState::Find(std::string_view key) const {
  auto it = index_.find(absl::string_view(key.data(), key.size()));
  return it == index_.end() ? nullptr : it->second;
}

bool KvState::Apply(const std::string& key, const std::optional<std::string>& value) {
  auto it = index_.find(absl::string_view(key));
  if (!value.has_value()) {
    if (it == index_.end()) return false;
    // The index entry goes first: its key is a view of the node's key.
    index_.erase(it);
    map_.erase(key);
    return true;
  }
  if (it != index_.end()) {
    if (*it->second == *value) return false;
    *it->second = *value;
    return true;
  }
  auto node = map_.emplace(key, *value).first;
  index_.emplace(absl::string_view(node->first), &node->second);
  return true;
}

void KvOverlay::ChargeRead(std::string_view key, const std::string* value) const {
  if (gas_ == nullptr) return;
  size_t bytes = key.size() + (value == nullptr ? 0 : value->size());
  gas_->Consume(gas::kReadFlat + gas::kReadPerByte * bytes, "ReadFlat");
}

std::optional<std::string> KvOverlay::Get(std::string_view key) const {
  const std::string* value = Find(key);
  if (value == nullptr) return std::nullopt;
  return *value;
}

const std::string* KvOverlay::Find(std::string_view key) const {
  const std::string* value = FindUncharged(key);
  ChargeRead(key, value);
  return value;
}

bool KvOverlay::Contains(std::string_view key) const {
  ConsumeGas(gas::kHasFlat, "HasFlat");
  return FindUncharged(key) != nullptr;
}

const std::string* KvOverlay::FindUncharged(std::string_view key) const {
  const KvOverlay* layer = this;
  for (;;) {
    auto it = layer->writes_.find(key);
    if (it != layer->writes_.end()) return it->second.has_value() ? &*it->second : nullptr;
    if (layer->parent_ == nullptr) break;
    layer = layer->parent_;
  }
  return layer->base_->Find(key);
}

void KvOverlay::Set(std::string_view key, std::string value) {
  ConsumeGas(gas::kWriteFlat + gas::kWritePerByte * (key.size() + value.size()), "WriteFlat");
  auto it = writes_.lower_bound(key);
  if (it != writes_.end() && it->first == key) {
    it->second = std::move(value);
  } else {
    writes_.emplace_hint(it, std::string(key), std::move(value));
  }
}

void KvOverlay::Delete(std::string_view key) {
  ConsumeGas(gas::kDeleteFlat, "DeleteFlat");
  auto it = writes_.lower_bound(key);
  if (it != writes_.end() && it->first == key) {
    it->second = std::nullopt;
  } else {
    writes_.emplace_hint(it, std::string(key), std::nullopt);
  }
}

std::vector<std::pair<std::string, std::string>> KvOverlay::Scan(std::string_view prefix,
                                                                 std::string_view start,
                                                                 size_t limit) const {
  auto entries = ScanUncharged(prefix, start, limit);
  if (gas_ != nullptr) {
    gas_->Consume(gas::kReadFlat, "IterFlat");
    for (const auto& [key, value] : entries) {
      gas_->Consume(gas::kIterNextFlat + gas::kReadPerByte * (key.size() + value.size()),
                    "IterNextFlat");
    }
  }
  return entries;
}

std::vector<std::pair<std::string, std::string>> KvOverlay::ScanUncharged(std::string_view prefix,
                                                                          std::string_view start,
                                                                          size_t limit) const {
  std::string from = start.empty() || start < prefix ? std::string(prefix) : std::string(start);
  auto in_range = [&](const std::string& key) {
    return key.size() >= prefix.size() && std::string_view(key).substr(0, prefix.size()) == prefix;
  };
  // Writes in range, so the parent can be asked for enough entries to survive deletions.
  std::vector<std::pair<const std::string*, const std::optional<std::string>*>> mine;
  for (auto it = writes_.lower_bound(from); it != writes_.end() && in_range(it->first); ++it) {
    mine.emplace_back(&it->first, &it->second);
  }
  std::vector<std::pair<std::string, std::string>> below;
  size_t want = limit == SIZE_MAX ? SIZE_MAX : limit + mine.size();
  if (parent_ != nullptr) {
    below = parent_->ScanUncharged(prefix, from, want);
  } else {
    const KvState::Map& base = base_->map();
    for (auto it = base.lower_bound(from); it != base.end() && in_range(it->first); ++it) {
      if (below.size() >= want) break;
      below.emplace_back(it->first, it->second);
    }
  }
  if (mine.empty()) {
    if (below.size() > limit) below.resize(limit);
    return below;
  }
  // Merge: this overlay's writes win over the parent's entries.
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0, j = 0;
  while ((i < below.size() || j < mine.size()) && out.size() < limit) {
    if (j == mine.size() || (i < below.size() && below[i].first < *mine[j].first)) {
      out.push_back(std::move(below[i++]));
      continue;
    }
    if (i < below.size() && below[i].first == *mine[j].first) ++i;
    if (mine[j].second->has_value()) out.emplace_back(*mine[j].first, **mine[j].second);
    ++j;
  }
  return out;
}

void KvOverlay::Commit() {
  TS_CHECK(parent_ != nullptr);
  Writes& into = parent_->writes_;
  if (into.empty()) {
    into.swap(writes_);
    return;
  }
  // Node handles carry key and value over without copying either; a key the parent already
  // holds takes the new value.
  while (!writes_.empty()) {
    auto node = writes_.extract(writes_.begin());
    auto it = into.lower_bound(node.key());
    if (it != into.end() && it->first == node.key()) {
      it->second = std::move(node.mapped());
    } else {
      into.insert(it, std::move(node));
    }
  }
}

}  // namespace ts::bridge
