// Test helper: a size-limited tmpfs mounted on a fresh directory, so a test can fill a real
// filesystem (ENOSPC from the kernel, not from a fake) and free it again. Mounting needs root:
// Mount() returns null otherwise and the test skips. Unmounted (lazily, so a process still
// holding a file there cannot keep it) when the object goes. For unit tests only. Not
// thread-safe: one owner.
#ifndef TS_TESTS_UTIL_SMALL_TMPFS_H_
#define TS_TESTS_UTIL_SMALL_TMPFS_H_

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "tests/util/temp_dir.h"

namespace ts::test_util {

class SmallTmpfs {
 public:
  // A tmpfs of `size_bytes` on a new directory under the test's temporary directory; null (and
  // *why set) if it cannot be mounted (not root, no tmpfs).
  static std::unique_ptr<SmallTmpfs> Mount(uint64_t size_bytes, std::string* why) {
    std::unique_ptr<SmallTmpfs> fs(new SmallTmpfs());
    const std::string options = "size=" + std::to_string(size_bytes);
    if (::mount("tmpfs", fs->dir_.str().c_str(), "tmpfs", 0, options.c_str()) != 0) {
      *why = "mount -t tmpfs: " + std::string(std::strerror(errno));
      return nullptr;
    }
    fs->mounted_ = true;
    return fs;
  }
  ~SmallTmpfs() {
    Free();
    if (mounted_) ::umount2(dir_.str().c_str(), MNT_DETACH);
  }
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;

  const std::filesystem::path& path() const { return dir_.path(); }

  // Writes a filler file until the filesystem refuses (ENOSPC); returns the bytes written.
  uint64_t Fill() {
    const std::string filler = (dir_.path() / "filler").string();
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    const std::string block(4096, 'f');
    uint64_t written = 0;
    while (true) {
      const ssize_t n = ::write(fd, block.data(), block.size());
      if (n <= 0) break;
      written += static_cast<uint64_t>(n);
    }
    ::close(fd);
    return written;
  }
  // Removes the filler file, giving its space back.
  void Free() {
    std::error_code ec;
    std::filesystem::remove(dir_.path() / "filler", ec);
  }

 private:
  SmallTmpfs() = default;
  TempDir dir_{"ts_tmpfs_"};
  bool mounted_ = false;
};

}  // namespace ts::test_util

#endif  // TS_TESTS_UTIL_SMALL_TMPFS_H_
