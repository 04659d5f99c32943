#include "common/partial_dir.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ts::common {

namespace fs = std::filesystem;

absl::StatusOr<PartialDir> PartialDir::Make(const std::string& field, const std::string& target) {
  if (target.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty"));
  std::error_code ec;
  if (fs::exists(target, ec) || fs::is_symlink(target, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat(field, " \"", target, "\": exists; name a folder to make"));
  }
  const fs::path absolute = fs::absolute(target, ec);
  std::string path =
      (absolute.parent_path() / (".partial-" + absolute.filename().string() + "-XXXXXX")).string();
  if (::mkdtemp(path.data()) == nullptr) {
    return absl::InternalError(absl::StrCat(
        field, " \"", target, "\": cannot make a folder beside it: ", std::strerror(errno)));
  }
  return PartialDir(std::move(path), absolute.string());
}

PartialDir::PartialDir(std::string path, std::string target)
    : path_(std::move(path)), target_(std::move(target)) {}

PartialDir::PartialDir(PartialDir&& other) noexcept
    : path_(std::exchange(other.path_, "")), target_(std::move(other.target_)) {}

PartialDir::~PartialDir() {
  std::error_code ec;
  if (!path_.empty()) fs::remove_all(path_, ec);
}

absl::Status PartialDir::Commit(const std::string& folder) {
  const std::string from = folder.empty() ? path_ : folder;
  ::chmod(from.c_str(), 0755);
  if (::rename(from.c_str(), target_.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename into ", target_, ": ", std::strerror(errno)));
  }
  if (folder.empty()) path_.clear();  // it is the target now
  return absl::OkStatus();
}

}  // namespace ts::common
