#include "sidecar/artifacts/file_policy.h"

#include <climits>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"

namespace ts::sidecar {
namespace {

// `inner` is `outer` or below it. Both resolved.
bool Within(std::string_view inner, std::string_view outer) {
  if (outer == "/") return true;
  return inner == outer || (inner.size() > outer.size() && inner.substr(0, outer.size()) == outer &&
                            inner[outer.size()] == '/');
}

absl::Status Denied(std::string_view field, const std::string& path, std::string_view why) {
  return absl::PermissionDeniedError(
      absl::StrCat(common::AsAbsl(field), ": ", path, " ", common::AsAbsl(why)));
}

}  // namespace

std::string ResolvePath(const std::string& path) {
  std::filesystem::path normal = std::filesystem::path(path).lexically_normal();
  // Walk up to the longest prefix that exists, resolve it, and put the rest back.
  std::filesystem::path existing = normal;
  std::filesystem::path rest;
  while (true) {
    char resolved[PATH_MAX];
    if (::realpath(existing.c_str(), resolved) != nullptr) {
      std::filesystem::path out = std::filesystem::path(resolved) / rest;
      std::string text = out.lexically_normal().string();
      while (text.size() > 1 && text.back() == '/') text.pop_back();
      return text;
    }
    if (!existing.has_relative_path()) break;  // "/" itself did not resolve
    rest = existing.filename() / rest;
    existing = existing.parent_path();
  }
  std::string text = normal.string();
  while (text.size() > 1 && text.back() == '/') text.pop_back();
  return text;
}

absl::Status CheckOperatorPath(const OperatorFilePolicy& policy, std::string_view field,
                               const std::string& path, uint64_t shard_id) {
  const std::string resolved = ResolvePath(path);
  bool in_shard_folder = false;
  if (!policy.shards_dir.empty() && shard_id != 0) {
    const std::string shard_folder = ResolvePath(absl::StrCat(policy.shards_dir, "/", shard_id));
    if (Within(resolved, shard_folder) && resolved != shard_folder) {
      if (Within(resolved, shard_folder + "/state")) {
        return Denied(field, path, absl::StrCat("is inside shard ", shard_id, "'s records"));
      }
      in_shard_folder = true;
    }
  }
  const std::string root = policy.files_root.empty() ? "" : ResolvePath(policy.files_root);
  if (!in_shard_folder && (root.empty() || !Within(resolved, root))) {
    return Denied(field, path,
                  root.empty() ? "is not a folder the operator API may use: set files_root in "
                                 "the host's config to the folder for artifact files"
                               : absl::StrCat("is outside files_root (", root, ")"));
  }
  for (const ProtectedPath& p : policy.protected_paths) {
    if (p.path.empty()) continue;
    const std::string guarded = ResolvePath(p.path);
    if (Within(guarded, resolved)) {
      return Denied(field, path, absl::StrCat("holds ", p.what, " (", guarded, ")"));
    }
    // The shard's own folder lies inside the data dir by design.
    if (!in_shard_folder && Within(resolved, guarded)) {
      return Denied(field, path, absl::StrCat("is inside ", p.what, " (", guarded, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ts::sidecar
