// Path safety for artifact files: name validation and a directory handle that resolves names
// relative to itself, one component at a time with O_NOFOLLOW (openat-style), so nothing it opens
// or creates can be outside the directory it was opened on — whatever links, devices or
// concurrent renames sit in the tree. Used for the publish source, the chunk store and export.
//
// What is refused, everywhere: names that fail ValidateArtifactName; symbolic links (as the
// final component or on the way); hard-linked regular files (st_nlink > 1) when reading a
// source; block and character devices, FIFOs and sockets. A FIFO is never opened for reading
// (it would block): the type is checked with fstatat(AT_SYMLINK_NOFOLLOW) before the open, and
// again with fstat on the opened descriptor (same device and inode), so a swap in between is
// caught.
//
// A full filesystem (ENOSPC, EDQUOT) is RESOURCE_EXHAUSTED wherever it shows.
//
// Thread-safety: ValidateArtifactName is pure. A SafeDir may be used from several threads at
// once (every call works on its own descriptors); the caller serialises writes to the same name.
#ifndef TS_SIDECAR_ARTIFACTS_SAFE_FS_H_
#define TS_SIDECAR_ARTIFACTS_SAFE_FS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace ts::sidecar {

inline constexpr size_t kMaxArtifactNameBytes = 1024;
inline constexpr size_t kMaxArtifactNameComponentBytes = 255;
inline constexpr size_t kMaxArtifactNameDepth = 16;

// OK if `name` is a relative artifact file name: '/'-separated components, each 1..255 bytes of
// [A-Za-z0-9._+=@,-], none "." or "..", at most kMaxArtifactNameDepth components and
// kMaxArtifactNameBytes in all. That refuses absolute paths, "..", empty components ("a//b",
// trailing '/'), backslashes, '%' (so no percent-encoded separators), NUL, control characters,
// spaces and non-ASCII. INVALID_ARGUMENT naming `field` and the (escaped) name otherwise.
absl::Status ValidateArtifactName(std::string_view field, std::string_view name);

using UniqueFd = common::UniqueFd;

// A regular file found by SafeDir::ListFiles.
struct SafeFileEntry {
  std::string name;  // relative, '/'-separated, valid per ValidateArtifactName
  uint64_t size = 0;
};

struct SafeListLimits {
  size_t files_max = 100000;
  uint64_t bytes_max = UINT64_MAX;
};

class SafeDir {
 public:
  // Opens an existing directory (an absolute path; the path itself is trusted: it comes from
  // the operator or the configuration). With create = true, creates it (and missing parents,
  // mode 0700) first. NOT_FOUND, FAILED_PRECONDITION (not a directory, or a symlink as the last
  // component), PERMISSION_DENIED, INTERNAL with errno text.
  static absl::StatusOr<SafeDir> Open(const std::string& path, bool create = false);

  SafeDir(SafeDir&&) = default;
  SafeDir& operator=(SafeDir&&) = default;

  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }

  // Opens the subdirectory `name` (validated; every component resolved without following
  // links); with create = true, creates missing components (0700). INVALID_ARGUMENT (bad name),
  // NOT_FOUND, FAILED_PRECONDITION (a component is a symlink or not a directory).
  absl::StatusOr<SafeDir> OpenDir(std::string_view name, bool create = false) const;

  // Opens regular file `name` for reading. Refuses (FAILED_PRECONDITION, naming the file and
  // what it is) symlinks, devices, FIFOs, sockets and directories; with refuse_hardlinks, a file
  // with st_nlink > 1. NOT_FOUND if absent. `size` gets the file size when non-null.
  absl::StatusOr<UniqueFd> OpenRead(std::string_view name, bool refuse_hardlinks,
                                    uint64_t* size = nullptr) const;

  // Lists every regular file under this directory, recursively, sorted by name. Any entry that
  // is not a regular file or a directory (symlink, device, FIFO, socket), any hard-linked file
  // (with refuse_hardlinks), and any name failing ValidateArtifactName is an error naming it
  // (FAILED_PRECONDITION / INVALID_ARGUMENT); more than limits.files_max files or
  // limits.bytes_max bytes is RESOURCE_EXHAUSTED. Nothing is opened for reading.
  absl::StatusOr<std::vector<SafeFileEntry>> ListFiles(bool refuse_hardlinks,
                                                       const SafeListLimits& limits) const;

  // Writes `data` to `name` atomically and durably: a temporary file in the same directory
  // (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600), write, fsync, renameat over `name` (replacing a file
  // or a planted symlink itself, never its target), fsync of the directory. Parent directories
  // of `name` are created (0700) and fsync'd. INVALID_ARGUMENT (bad name), FAILED_PRECONDITION
  // (a parent component is a symlink or not a directory), INTERNAL (I/O, with errno text).
  absl::Status WriteFileAtomic(std::string_view name, std::string_view data) const;

  // Creates `name` exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, 0644), creating parents; ALREADY_EXISTS
  // if anything (a link included) is there. For export: the caller writes, fsyncs and closes.
  absl::StatusOr<UniqueFd> CreateExclusive(std::string_view name) const;

  // Removes regular file `name` (a symlink at `name` is removed itself). NOT_FOUND if absent.
  absl::Status Remove(std::string_view name) const;

  // fsync of this directory.
  absl::Status Sync() const;

  // Whether the directory holds no entries besides "." and "..".
  absl::StatusOr<bool> Empty() const;

 private:
  SafeDir(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
};

// Reads exactly `size` bytes at `offset` (pread loop). OUT_OF_RANGE on a short read (the file
// shrank), INTERNAL on I/O errors.
absl::Status ReadFull(int fd, uint64_t offset, size_t size, std::string* out);
// Writes all of `data` (write loop). RESOURCE_EXHAUSTED when the filesystem is full (ENOSPC,
// EDQUOT), INTERNAL on other I/O errors.
absl::Status WriteFull(int fd, std::string_view data);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_SAFE_FS_H_
