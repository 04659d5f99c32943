#include "worker/client/work_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"

namespace ts::worker {
namespace {

using ::ts::common::AsAbsl;

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

std::string Quoted(std::string_view name) {
  return absl::StrCat("\"", absl::CHexEscape(absl::string_view(name.data(), name.size())), "\"");
}

absl::Status BadName(std::string_view field, std::string_view name, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      AsAbsl(field), ": ", Quoted(name), " is not a work dir file name (", AsAbsl(why), ")"));
}

std::string Errno() { return std::strerror(errno); }

}  // namespace

absl::Status ValidateWorkFileName(std::string_view field, std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(AsAbsl(field), ": missing"));
  if (name.size() > kWorkFileNameMax) {
    return BadName(field, name.substr(0, 40),
                   absl::StrCat(name.size(), " bytes, more than ", kWorkFileNameMax));
  }
  if (name.front() == '/') return BadName(field, name, "absolute");
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view part = name.substr(start, end - start);
    if (part.empty()) return BadName(field, name, "empty component");
    if (part == "." || part == "..") return BadName(field, name, "\".\" or \"..\" component");
    for (char c : part) {
      if (!NameChar(c)) return BadName(field, name, "characters outside [A-Za-z0-9._-]");
    }
    start = end + 1;
  }
  return absl::OkStatus();
}

absl::StatusOr<OpenedWorkFile> OpenWorkFile(const std::string& work_dir, std::string_view field,
                                            std::string_view name) {
  if (absl::Status s = ValidateWorkFileName(field, name); !s.ok()) return s;
  const std::string path = absl::StrCat(work_dir, "/", AsAbsl(name));
  const std::string what = absl::StrCat(AsAbsl(field), ": ", Quoted(name));
  // O_NONBLOCK: a FIFO planted under the name is refused below instead of waited on.
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(what, " not found in work dir"));
    if (errno == ELOOP) return absl::InvalidArgumentError(absl::StrCat(what, " is a symlink"));
    return absl::InternalError(absl::StrCat(what, ": open: ", Errno()));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string e = Errno();
    ::close(fd);
    return absl::InternalError(absl::StrCat(what, ": stat: ", e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a regular file"));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return OpenedWorkFile{fd, static_cast<uint64_t>(st.st_size), what};
}

absl::StatusOr<WorkFileCreator> WorkFileCreator::Create(const std::string& work_dir,
                                                        std::string_view field,
                                                        std::string_view name) {
  if (absl::Status s = ValidateWorkFileName(field, name); !s.ok()) return s;
  std::string path = absl::StrCat(work_dir, "/", AsAbsl(name));
  std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  std::string what = absl::StrCat(AsAbsl(field), ": ", Quoted(name));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat(what, ": create: ", Errno()));
  return WorkFileCreator(std::move(tmp), std::move(path), std::move(what), fd);
}

WorkFileCreator::WorkFileCreator(WorkFileCreator&& other) noexcept
    : tmp_(std::move(other.tmp_)),
      path_(std::move(other.path_)),
      description_(std::move(other.description_)),
      fd_(std::exchange(other.fd_, -1)),
      committed_(std::exchange(other.committed_, true)) {}

WorkFileCreator::~WorkFileCreator() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

int WorkFileCreator::TakeFd() { return std::exchange(fd_, -1); }

absl::Status WorkFileCreator::Commit() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat(description_, ": rename: ", Errno()));
  }
  committed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWorkFile(const std::string& work_dir, std::string_view field,
                                         std::string_view name, uint64_t bytes_max) {
  auto opened = OpenWorkFile(work_dir, field, name);
  if (!opened.ok()) return opened.status();
  const int fd = opened->fd;
  const std::string& what = opened->description;
  const uint64_t size = opened->size;
  if (size > bytes_max) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", size, " bytes, more than the cap of ", bytes_max));
  }
  std::string data(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, data.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string e = n < 0 ? Errno() : "file shrank while reading";
      ::close(fd);
      return absl::InternalError(absl::StrCat(what, ": read: ", e));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

absl::Status ReadWorkFileInto(const std::string& work_dir, std::string_view field,
                              std::string_view name, std::span<char> out) {
  auto opened = OpenWorkFile(work_dir, field, name);
  if (!opened.ok()) return opened.status();
  const int fd = opened->fd;
  if (opened->size != out.size()) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(opened->description, " holds ", opened->size, " bytes, not ", out.size()));
  }
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string e = n < 0 ? Errno() : "file shrank while reading";
      ::close(fd);
      return absl::InternalError(absl::StrCat(opened->description, ": read: ", e));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::Status WriteWorkFile(const std::string& work_dir, std::string_view field,
                           std::string_view name, std::string_view data) {
  if (absl::Status s = ValidateWorkFileName(field, name); !s.ok()) return s;
  const std::string path = absl::StrCat(work_dir, "/", AsAbsl(name));
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid());
  const std::string what = absl::StrCat(AsAbsl(field), ": ", Quoted(name));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat(what, ": create: ", Errno()));
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string e = Errno();
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat(what, ": write: ", e));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  if (::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string e = Errno();
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(what, ": write: ", e));
  }
  return absl::OkStatus();
}

}  // namespace ts::worker
