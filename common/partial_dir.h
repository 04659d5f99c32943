// PartialDir: a folder built beside its target and renamed into place at the end, so the target
// is made whole or not at all (an export, a fetched model). The folder is private (mode 0700)
// until Commit, which makes it 0755 and renames it; destroyed uncommitted, it is removed with
// whatever was written in it.
//
// Thread-safety: one owner.
#ifndef TS_COMMON_PARTIAL_DIR_H_
#define TS_COMMON_PARTIAL_DIR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::common {

class PartialDir {
 public:
  // A new folder ".partial-<name>-XXXXXX" beside `target`, which must not exist. `field` names
  // the target in errors: INVALID_ARGUMENT for an empty target, ALREADY_EXISTS when it exists,
  // INTERNAL when the folder cannot be made.
  static absl::StatusOr<PartialDir> Make(const std::string& field, const std::string& target);
  PartialDir(PartialDir&& other) noexcept;
  PartialDir& operator=(PartialDir&&) = delete;
  PartialDir(const PartialDir&) = delete;
  PartialDir& operator=(const PartialDir&) = delete;
  ~PartialDir();  // removes the folder unless committed

  const std::string& path() const { return path_; }  // empty once committed whole
  // Renames `folder` (path() itself when empty, or a folder under it) to the target; the rest of
  // path() is removed at destruction. INTERNAL when the rename fails.
  absl::Status Commit(const std::string& folder = "");

 private:
  PartialDir(std::string path, std::string target);
  std::string path_;
  std::string target_;
};

}  // namespace ts::common

#endif  // TS_COMMON_PARTIAL_DIR_H_
