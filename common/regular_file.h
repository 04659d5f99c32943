// Opening and reading files named by a user (key files, configs, specs, genesis documents)
// without trusting what the name points at. A name may be a FIFO, a device or a socket: opening a
// FIFO for reading blocks until some writer appears, so a plain open() followed by a type check
// hangs forever on one. These functions open with O_NONBLOCK (which makes such an open return at
// once), check the opened descriptor's type with fstat, and only then read, so the check and the
// read see the same file whatever is renamed in between.
//
// Thread-safety: free functions without shared state; safe to call from any thread.
#ifndef TS_COMMON_REGULAR_FILE_H_
#define TS_COMMON_REGULAR_FILE_H_

#include <sys/stat.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::common {

// An open regular file and what fstat said of it. The descriptor is closed on destruction.
class RegularFile {
 public:
  RegularFile() = default;
  RegularFile(int fd, const struct stat& st) : fd_(fd), stat_(st) {}
  ~RegularFile();
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  const struct stat& stat() const { return stat_; }

  // Reads the whole file (from the current offset). FAILED_PRECONDITION "<what> <path>: larger
  // than <bytes_max> bytes" when it holds more; INTERNAL for a read error.
  absl::StatusOr<std::string> ReadAll(const std::string& what, const std::string& path,
                                      size_t bytes_max);

 private:
  int fd_ = -1;
  struct stat stat_ = {};
};

// Opens `path` for reading without blocking and checks it is a regular file. Errors name `what`
// ("key file", "--spec") and the path: NOT_FOUND (no such file), PERMISSION_DENIED (cannot be
// opened for lack of rights), FAILED_PRECONDITION "<what> <path>: not a regular file (a FIFO)"
// for anything else than a regular file, INTERNAL for other errors.
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& what, const std::string& path);

// OpenRegularFile, then ReadAll with the size checked against `bytes_max` before reading.
absl::StatusOr<std::string> ReadRegularFile(const std::string& what, const std::string& path,
                                            size_t bytes_max);

}  // namespace ts::common

#endif  // TS_COMMON_REGULAR_FILE_H_
