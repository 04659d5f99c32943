#include "sidecar/host/key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/hex.h"

namespace ts::sidecar {
namespace {

// A key file is 64 hex digits and a newline; anything much larger is not one.
constexpr size_t kMaxKeyFileBytes = 256;

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

absl::StatusOr<common::PrivateKey> LoadKeyFile(const std::string& path) {
  // Open first and check the opened file, so the mode checked is the mode of what is read.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("key file ", path, ": not found"));
    return absl::PermissionDeniedError(
        absl::StrCat("key file ", path, ": cannot be opened: ", strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("key file ", path, ": stat: ", strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("key file ", path, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "key file ", path, ": mode ", Octal(st.st_mode),
        " allows group/other access; it must be 0600 or stricter (chmod 600 ", path, ")"));
  }
  std::string text(kMaxKeyFileBytes + 1, '\0');
  size_t total = 0;
  while (total < text.size()) {
    ssize_t n = ::read(fd, text.data() + total, text.size() - total);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("key file ", path, ": read: ", strerror(err)));
    }
    if (n == 0) break;
    total += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(total);
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("key file ", path, ": ", absl::string_view(why.data(), why.size()),
                     " (expected one line of 64 hex digits, the 32-byte secret)"));
  };
  if (total > kMaxKeyFileBytes) return bad("too large");
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (text.size() != 64) return bad(absl::StrCat(text.size(), " characters"));
  auto secret = common::HexDecode(text);
  if (!secret.ok()) return bad("not hex");
  auto key = common::PrivateKey::FromBytes(*secret);
  if (!key.ok()) return bad("not a valid secp256k1 secret");
  return *std::move(key);
}

}  // namespace ts::sidecar
