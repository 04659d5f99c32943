#include "common/key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hex.h"
#include "common/regular_file.h"

namespace ts::common {
namespace {

// Larger files are refused before reading: a key file is 65 bytes.
constexpr size_t kKeyFileBytesMax = 4096;

std::string ErrnoText(int err) { return std::strerror(err); }

absl::Status IoError(const std::string& call, const std::string& path, int err) {
  std::string message = absl::StrCat(call, " ", path, ": ", ErrnoText(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  if (err == EEXIST) return absl::AlreadyExistsError(message);
  return absl::InternalError(message);
}

// Closes the descriptor on every path out of a function.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the error a delayed write may surface only here.
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string DirectoryOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<PrivateKey> ReadKeyFile(const std::string& path) {
  // Opened without blocking and checked on the open descriptor, so the checks and the read see
  // the same file, and a FIFO under the name is refused instead of waited on.
  absl::StatusOr<RegularFile> file = OpenRegularFile("key file", path);
  if (!file.ok()) return file.status();
  const struct stat& st = file->stat();
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("key file %s: mode %04o lets group or others access it; run chmod 600 %s",
                        path, st.st_mode & 07777, path));
  }
  if (static_cast<uint64_t>(st.st_size) > kKeyFileBytesMax) {
    return absl::FailedPreconditionError(absl::StrCat("key file ", path, ": ", st.st_size,
                                                      " bytes is larger than ", kKeyFileBytesMax));
  }
  absl::StatusOr<std::string> read = file->ReadAll("key file", path, kKeyFileBytesMax);
  if (!read.ok()) return read.status();
  std::string content = *std::move(read);
  size_t begin = 0;
  size_t end = content.size();
  while (begin < end && IsSpace(content[begin])) ++begin;
  while (end > begin && IsSpace(content[end - 1])) --end;
  std::string hex = content.substr(begin, end - begin);
  // Say what is wrong with the content without echoing any of it: it may be a secret.
  if (hex.size() != 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key file ", path, ": expected 64 hex characters of a secret, found ", hex.size()));
  }
  auto secret = HexDecode(hex);
  if (!secret.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key file ", path, ": content is not hexadecimal"));
  }
  auto key = PrivateKey::FromBytes(*secret);
  if (!key.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key file ", path, ": not a valid secp256k1 secret"));
  }
  return std::move(key).value();
}

absl::Status WriteNewKeyFile(const std::string& path, const PrivateKey& key) {
  if (path.empty()) return absl::InvalidArgumentError("key file path is empty");
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("key file ", path, " already exists; refusing to overwrite it"));
  }
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 16 && raw_fd < 0; ++attempt) {
    tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
    raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (raw_fd < 0 && errno != EEXIST) return IoError("create key file", tmp, errno);
  }
  if (raw_fd < 0) return IoError("create key file", tmp, EEXIST);
  Fd fd(raw_fd);
  auto fail = [&](const std::string& call, int err) {
    ::unlink(tmp.c_str());
    return IoError(call, tmp, err);
  };
  // The umask may only remove bits; set the mode exactly in case the file system added some.
  if (::fchmod(fd.get(), 0600) != 0) return fail("chmod key file", errno);
  std::string content = HexEncode(key.secret()) + "\n";
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write key file", errno);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("sync key file", errno);
  if (fd.Close() != 0) return fail("close key file", errno);
  // link() refuses an existing target, so a file created meanwhile is never replaced.
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    if (err == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat("key file ", path, " already exists; refusing to overwrite it"));
    }
    return IoError("link key file", path, err);
  }
  ::unlink(tmp.c_str());
  std::string dir = DirectoryOf(path);
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() >= 0) ::fsync(dir_fd.get());
  return absl::OkStatus();
}

}  // namespace ts::common
