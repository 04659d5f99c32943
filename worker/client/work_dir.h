// Files in the work directory a shard sidecar shares with its worker (docs/worker.md "Worker
// protocol"): the one check of a file name that a request carries, and reads that cap the size
// before reading. Both sides use it: the worker to refuse bad names and sizes, the sidecar to
// refuse them before it asks. No libtorch.
//
// Thread-safety: pure functions and plain file I/O; safe to call from several threads on
// different files.
#ifndef TS_WORKER_CLIENT_WORK_DIR_H_
#define TS_WORKER_CLIENT_WORK_DIR_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::worker {

inline constexpr size_t kWorkFileNameMax = 200;

// OK when `name` is a relative name in the work dir: '/'-separated components of
// [A-Za-z0-9._-], none empty, "." or "..", no leading '/', at most kWorkFileNameMax bytes.
// INVALID_ARGUMENT otherwise, naming `field` and the (escaped) value.
absl::Status ValidateWorkFileName(std::string_view field, std::string_view name);

// Reads work_dir/name. INVALID_ARGUMENT for a bad name, a symlink or non-regular file, or a
// file of more than bytes_max bytes (checked before reading); NOT_FOUND when it does not exist;
// INTERNAL for other I/O errors. Every message names `field` and the file.
absl::StatusOr<std::string> ReadWorkFile(const std::string& work_dir, std::string_view field,
                                         std::string_view name, uint64_t bytes_max);

// Reads work_dir/name, which must hold exactly out.size() bytes, into `out` (no copy in between).
// Errors as ReadWorkFile; INVALID_ARGUMENT naming both sizes for another size.
absl::Status ReadWorkFileInto(const std::string& work_dir, std::string_view field,
                              std::string_view name, std::span<char> out);

// Writes work_dir/name through a temporary file and a rename, so a reader sees the old file or
// the whole new one. The parent directory must exist. INVALID_ARGUMENT for a bad name, INTERNAL
// for I/O errors.
absl::Status WriteWorkFile(const std::string& work_dir, std::string_view field,
                           std::string_view name, std::string_view data);

// A work dir file opened for reading: an owned descriptor of a regular file (not a symlink), its
// size, and "field: \"name\"" for messages.
struct OpenedWorkFile {
  int fd = -1;  // the caller takes it (closes it)
  uint64_t size = 0;
  std::string description;
};
// Errors as ReadWorkFile, without the size cap (the caller checks the size against what the
// file must hold).
absl::StatusOr<OpenedWorkFile> OpenWorkFile(const std::string& work_dir, std::string_view field,
                                            std::string_view name);

// A work dir file being written: a temporary file beside it, renamed over the name by Commit,
// removed by the destructor otherwise, so a reader sees the old file or the whole new one.
class WorkFileCreator {
 public:
  // INVALID_ARGUMENT for a bad name, INTERNAL naming the file when it cannot be created.
  static absl::StatusOr<WorkFileCreator> Create(const std::string& work_dir, std::string_view field,
                                                std::string_view name);
  WorkFileCreator(WorkFileCreator&& other) noexcept;
  WorkFileCreator& operator=(WorkFileCreator&&) = delete;
  ~WorkFileCreator();

  // The temporary file's descriptor; the caller takes it and must close it before Commit.
  int TakeFd();
  const std::string& description() const { return description_; }
  absl::Status Commit();

 private:
  WorkFileCreator(std::string tmp, std::string path, std::string description, int fd)
      : tmp_(std::move(tmp)),
        path_(std::move(path)),
        description_(std::move(description)),
        fd_(fd) {}
  std::string tmp_, path_, description_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace ts::worker

#endif  // TS_WORKER_CLIENT_WORK_DIR_H_
