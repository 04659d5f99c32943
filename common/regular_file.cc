#include "common/regular_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ts::common {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a file";
}

absl::Status OpenError(const std::string& what, const std::string& path, int err) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  // ENXIO: a FIFO opened for writing without a reader, or a socket; ELOOP, EISDIR and the like
  // say the name is not something to read.
  if (err == ENXIO || err == ELOOP || err == EISDIR || err == ENODEV) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path, ": not a regular file (", std::strerror(err), ")"));
  }
  return absl::InternalError(message);
}

}  // namespace

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), stat_(other.stat_) {}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    stat_ = other.stat_;
  }
  return *this;
}

absl::StatusOr<std::string> RegularFile::ReadAll(const std::string& what, const std::string& path,
                                                 size_t bytes_max) {
  std::string content;
  // One byte more than allowed tells a file that grew after fstat from one that did not.
  const size_t expected = static_cast<size_t>(stat_.st_size);
  content.resize(std::min(expected, bytes_max) + 1);
  size_t used = 0;
  while (true) {
    if (used == content.size()) {
      if (content.size() > bytes_max) break;
      content.resize(std::min(content.size() * 2, bytes_max + 1));
    }
    const ssize_t n = ::read(fd_, content.data() + used, content.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat(what, " ", path, ": read: ", std::strerror(errno)));
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  if (used > bytes_max) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path, ": larger than ", bytes_max, " bytes"));
  }
  content.resize(used);
  return content;
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& what, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return OpenError(what, path, errno);
  struct stat st = {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(what, " ", path, ": stat: ", std::strerror(err)));
  }
  RegularFile file(fd, st);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path, ": not a regular file (", KindOf(st.st_mode), ")"));
  }
  // Reads of a regular file never block; clearing the flag keeps later reads plain.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return file;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& what, const std::string& path,
                                            size_t bytes_max) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(what, path);
  if (!file.ok()) return file.status();
  if (static_cast<uint64_t>(file->stat().st_size) > bytes_max) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " ", path, ": ", file->stat().st_size, " bytes, more than ", bytes_max));
  }
  return file->ReadAll(what, path, bytes_max);
}

}  // namespace ts::common
