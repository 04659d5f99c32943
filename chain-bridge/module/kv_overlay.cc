#include "chain-bridge/module/kv_overlay.h"

#include "common/status.h"

namespace ts::bridge {

std::optional<std::string> KvOverlay::Get(std::string_view key) const {
  auto it = writes_.find(key);
  if (it != writes_.end()) return it->second;
  if (parent_ != nullptr) return parent_->Get(key);
  auto base_it = base_->find(std::string(key));
  if (base_it == base_->end()) return std::nullopt;
  return base_it->second;
}

void KvOverlay::Set(std::string_view key, std::string value) {
  auto it = writes_.find(key);
  if (it != writes_.end()) {
    it->second = std::move(value);
  } else {
    writes_.emplace(std::string(key), std::move(value));
  }
}

void KvOverlay::Delete(std::string_view key) {
  auto it = writes_.find(key);
  if (it != writes_.end()) {
    it->second = std::nullopt;
  } else {
    writes_.emplace(std::string(key), std::nullopt);
  }
}

std::vector<std::pair<std::string, std::string>> KvOverlay::Scan(std::string_view prefix,
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
    below = parent_->Scan(prefix, from, want);
  } else {
    for (auto it = base_->lower_bound(from); it != base_->end() && in_range(it->first); ++it) {
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
  for (auto& [key, value] : writes_) {
    auto it = parent_->writes_.find(key);
    if (it != parent_->writes_.end()) {
      it->second = std::move(value);
    } else {
      parent_->writes_.emplace(key, std::move(value));
    }
  }
  writes_.clear();
}

}  // namespace ts::bridge
