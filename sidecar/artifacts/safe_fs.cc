#include "sidecar/artifacts/safe_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/hex.h"
#include "common/status.h"

namespace ts::sidecar {
namespace {

// How much of a refused name an error message quotes: enough to recognise it, without letting
// a 1 MiB name from a peer turn into a 4 MiB log line.
constexpr size_t kQuotedNameBytesMax = 128;

std::string Quote(std::string_view name) {
  if (name.size() <= kQuotedNameBytesMax)
    return absl::StrCat("\"", absl::CHexEscape(common::AsAbsl(name)), "\"");
  return absl::StrCat("\"", absl::CHexEscape(common::AsAbsl(name.substr(0, kQuotedNameBytesMax))),
                      "\"... (", name.size(), " bytes)");
}

bool AllowedNameByte(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '+' || c == '=' || c == '@' || c == ',' || c == '-';
}

// What a refused byte is, for the error message: the classes an attack uses get their own words.
std::string DescribeByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (c == '\0') return "a NUL byte";
  if (c == '\\') return "a backslash";
  if (c == '%') return "'%' (percent-encoding is not decoded, so it is refused)";
  if (c == ' ') return "a space";
  if (u < 0x20 || u == 0x7f) return absl::StrCat("control character 0x", absl::Hex(u));
  if (u >= 0x80) return absl::StrCat("non-ASCII byte 0x", absl::Hex(u));
  return absl::StrCat("'", std::string(1, c), "'");
}

std::string Errno(int err) { return std::strerror(err); }

// The status code an errno from open/mkdir/stat on a name maps to.
absl::Status ErrnoStatus(int err, std::string_view what) {
  const std::string message = absl::StrCat(common::AsAbsl(what), ": ", Errno(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOTDIR:
    case ELOOP:
      return absl::FailedPreconditionError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

const char* TypeName(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a regular file";
  return "of an unknown file type";
}

int OpenDirAt(int dirfd, const char* name) {
  int fd;
  do {
    fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

absl::Status FsyncFd(int fd, std::string_view what) {
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("fsync ", common::AsAbsl(what), ": ", Errno(errno)));
  return absl::OkStatus();
}

// Splits a validated name into its directory components and the last component.
struct SplitName {
  std::vector<std::string_view> dirs;
  std::string_view base;
};

std::vector<std::string_view> Components(std::string_view name) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t slash = name.find('/', start);
    if (slash == std::string_view::npos) {
      parts.push_back(name.substr(start));
      return parts;
    }
    parts.push_back(name.substr(start, slash - start));
    start = slash + 1;
  }
}

SplitName Split(std::string_view name) {
  SplitName out;
  std::vector<std::string_view> parts = Components(name);
  out.base = parts.back();
  parts.pop_back();
  out.dirs = std::move(parts);
  return out;
}

// Why opening component `comp` under `dirfd` as a directory failed, in words.
absl::Status DescribeDirFailure(int dirfd, const std::string& comp, int err,
                                std::string_view what) {
  if (err == ENOENT)
    return absl::NotFoundError(absl::StrCat(common::AsAbsl(what), " does not exist"));
  if (err == ELOOP || err == ENOTDIR) {
    struct stat st;
    if (::fstatat(dirfd, comp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(common::AsAbsl(what), " is ", TypeName(st.st_mode), ", not a directory"));
    }
  }
  return ErrnoStatus(err, what);
}

// Walks `dirs` from `base_fd` without following links; creates missing components (0700, each
// creation made durable by an fsync of its parent) when `create`. `full_name` (the validated
// name being resolved) and `dir_path` name the file in errors.
absl::StatusOr<UniqueFd> WalkDirs(int base_fd, const std::vector<std::string_view>& dirs,
                                  bool create, const std::string& dir_path,
                                  std::string_view full_name) {
  UniqueFd current;
  int cur = base_fd;
  std::string walked;
  for (std::string_view comp_view : dirs) {
    const std::string comp(comp_view);
    walked = walked.empty() ? comp : absl::StrCat(walked, "/", comp);
    const std::string what = absl::StrCat("\"", common::AsAbsl(full_name), "\" in ", dir_path,
                                          ": directory \"", walked, "\"");
    int fd = OpenDirAt(cur, comp.c_str());
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(cur, comp.c_str(), 0700) != 0 && errno != EEXIST) {
        return ErrnoStatus(errno, absl::StrCat(what, ": mkdir"));
      }
      TS_RETURN_IF_ERROR(FsyncFd(cur, what));
      fd = OpenDirAt(cur, comp.c_str());
    }
    if (fd < 0) return DescribeDirFailure(cur, comp, errno, what);
    current = UniqueFd(fd);
    cur = fd;
  }
  if (!current.valid()) {
    const int fd = ::fcntl(base_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("dup ", dir_path, ": ", Errno(errno)));
    current = UniqueFd(fd);
  }
  return current;
}

absl::Status RandomHex(size_t bytes, std::string* out) {
  std::string buf(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", Errno(errno)));
    }
    got += static_cast<size_t>(n);
  }
  *out = common::HexEncode(buf);
  return absl::OkStatus();
}

// Reads the entry names of a directory descriptor, skipping "." and "..". It reads through a
// new open file description of the same directory (openat "."), not a dup: a dup would share
// the read offset, and another thread listing the same SafeDir would see half the entries.
absl::Status ReadDirNames(int dirfd, const std::string& what, size_t names_max,
                          std::vector<std::string>* names) {
  int own_fd;
  do {
    own_fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (own_fd < 0 && errno == EINTR);
  if (own_fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", what));
  DIR* dir = ::fdopendir(own_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(own_fd);
    return absl::InternalError(absl::StrCat("fdopendir ", what, ": ", Errno(err)));
  }
  absl::Status status;
  while (true) {
    errno = 0;
    const struct dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      if (errno != 0)
        status = absl::InternalError(absl::StrCat("readdir ", what, ": ", Errno(errno)));
      break;
    }
    const std::string_view name(entry->d_name);
    if (name == "." || name == "..") continue;
    if (names->size() >= names_max) {
      status =
          absl::ResourceExhaustedError(absl::StrCat(what, ": more than ", names_max, " entries"));
      break;
    }
    names->emplace_back(name);
  }
  ::closedir(dir);
  return status;
}

struct ListState {
  bool refuse_hardlinks;
  const SafeListLimits* limits;
  const std::string* root_path;
  uint64_t bytes = 0;
  // Directories count too, so a tree of empty directories cannot make a walk unbounded.
  size_t entries = 0;
  size_t entries_max = 0;
  std::vector<SafeFileEntry> files;
};

absl::Status ListRecursive(int dirfd, const std::string& prefix, ListState* state) {
  std::vector<std::string> names;
  const std::string what =
      prefix.empty() ? *state->root_path : absl::StrCat("\"", prefix, "\" in ", *state->root_path);
  TS_RETURN_IF_ERROR(ReadDirNames(dirfd, what, state->entries_max - state->entries, &names));
  std::sort(names.begin(), names.end());
  for (const std::string& entry_name : names) {
    if (++state->entries > state->entries_max) {
      return absl::ResourceExhaustedError(absl::StrCat(
          *state->root_path, ": more than ", state->entries_max, " files and directories"));
    }
    const std::string rel = prefix.empty() ? entry_name : absl::StrCat(prefix, "/", entry_name);
    TS_RETURN_IF_ERROR(ValidateArtifactName(absl::StrCat("file in ", *state->root_path), rel));
    struct stat st;
    if (::fstatat(dirfd, entry_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoStatus(errno, absl::StrCat("\"", rel, "\" in ", *state->root_path));
    }
    if (S_ISDIR(st.st_mode)) {
      const int fd = OpenDirAt(dirfd, entry_name.c_str());
      if (fd < 0) {
        return DescribeDirFailure(dirfd, entry_name, errno,
                                  absl::StrCat("\"", rel, "\" in ", *state->root_path));
      }
      UniqueFd sub(fd);
      struct stat sub_st;
      if (::fstat(sub.get(), &sub_st) != 0) {
        return absl::InternalError(absl::StrCat("fstat \"", rel, "\": ", Errno(errno)));
      }
      if (sub_st.st_dev != st.st_dev || sub_st.st_ino != st.st_ino) {
        return absl::FailedPreconditionError(absl::StrCat("\"", rel, "\" in ", *state->root_path,
                                                          " was replaced while it was listed"));
      }
      TS_RETURN_IF_ERROR(ListRecursive(sub.get(), rel, state));
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("\"", rel, "\" in ", *state->root_path, " is ", TypeName(st.st_mode)));
    }
    if (state->refuse_hardlinks && st.st_nlink > 1) {
      return absl::FailedPreconditionError(absl::StrCat("\"", rel, "\" in ", *state->root_path,
                                                        " has ", st.st_nlink, " hard links"));
    }
    if (state->files.size() >= state->limits->files_max) {
      return absl::ResourceExhaustedError(absl::StrCat(
          *state->root_path, ": more than ", state->limits->files_max, " files (files_max)"));
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size > state->limits->bytes_max - state->bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(*state->root_path, ": more than ",
                                                       state->limits->bytes_max,
                                                       " bytes (bytes_max) at \"", rel, "\""));
    }
    state->bytes += size;
    state->files.push_back(SafeFileEntry{rel, size});
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateArtifactName(std::string_view field, std::string_view name) {
  auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(field), ": ", Quote(name), " ", common::AsAbsl(why)));
  };
  if (name.empty()) return refuse("is empty");
  if (name.size() > kMaxArtifactNameBytes) {
    return refuse(absl::StrCat("is longer than ", kMaxArtifactNameBytes, " bytes"));
  }
  if (name.front() == '/') return refuse("is an absolute path");
  size_t depth = 0;
  size_t start = 0;
  while (true) {
    const size_t slash = name.find('/', start);
    const std::string_view comp = name.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    ++depth;
    if (depth > kMaxArtifactNameDepth) {
      return refuse(absl::StrCat("has more than ", kMaxArtifactNameDepth, " components"));
    }
    if (comp.empty()) {
      return refuse(slash == std::string_view::npos ? "ends with '/'" : "has an empty component");
    }
    if (comp == "." || comp == "..") {
      return refuse(absl::StrCat("has a \"", common::AsAbsl(comp), "\" component"));
    }
    if (comp.size() > kMaxArtifactNameComponentBytes) {
      return refuse(
          absl::StrCat("has a component longer than ", kMaxArtifactNameComponentBytes, " bytes"));
    }
    for (size_t i = 0; i < comp.size(); ++i) {
      if (!AllowedNameByte(comp[i])) {
        return refuse(absl::StrCat("contains ", DescribeByte(comp[i]), " at byte ", start + i,
                                   " (allowed: [A-Za-z0-9._+=@,-] and '/')"));
      }
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return absl::OkStatus();
}

absl::StatusOr<SafeDir> SafeDir::Open(const std::string& path, bool create) {
  if (path.empty()) return absl::InvalidArgumentError("directory path is empty");
  if (create) {
    // The path is trusted, so its parents are created by name; only the final open is
    // checked for links.
    for (size_t pos = path.find('/', 1);; pos = path.find('/', pos + 1)) {
      const std::string prefix = path.substr(0, pos);
      if (!prefix.empty() && ::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
        return ErrnoStatus(errno, absl::StrCat("mkdir ", prefix));
      }
      if (pos == std::string::npos) break;
    }
  }
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    if (err == ELOOP || err == ENOTDIR) {
      struct stat st;
      if (::lstat(path.c_str(), &st) == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " is ", TypeName(st.st_mode), ", not a directory"));
      }
    }
    return ErrnoStatus(err, path);
  }
  return SafeDir(path, UniqueFd(fd));
}

absl::StatusOr<SafeDir> SafeDir::OpenDir(std::string_view name, bool create) const {
  TS_RETURN_IF_ERROR(ValidateArtifactName("directory name", name));
  const std::vector<std::string_view> dirs = Components(name);
  TS_ASSIGN_OR_RETURN(UniqueFd fd, WalkDirs(fd_.get(), dirs, create, path_, name));
  std::string sub_path = path_;
  if (sub_path.empty() || sub_path.back() != '/') sub_path += '/';
  sub_path += name;
  return SafeDir(std::move(sub_path), std::move(fd));
}

absl::StatusOr<UniqueFd> SafeDir::OpenRead(std::string_view name, bool refuse_hardlinks,
                                           uint64_t* size) const {
  TS_RETURN_IF_ERROR(ValidateArtifactName("file name", name));
  const SplitName split = Split(name);
  TS_ASSIGN_OR_RETURN(UniqueFd dir, WalkDirs(fd_.get(), split.dirs, /*create=*/false, path_, name));
  const std::string base(split.base);
  const std::string what = absl::StrCat("\"", common::AsAbsl(name), "\" in ", path_);

  // The type is checked before the open: opening a FIFO for reading would block (or, with
  // O_NONBLOCK, succeed), and opening a device can have side effects.
  struct stat before;
  if (::fstatat(dir.get(), base.c_str(), &before, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(common::AsAbsl(what), " does not exist"));
    return ErrnoStatus(errno, what);
  }
  if (!S_ISREG(before.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is ", TypeName(before.st_mode), ", not a regular file"));
  }
  if (refuse_hardlinks && before.st_nlink > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has ", before.st_nlink, " hard links"));
  }
  int raw;
  do {
    raw = ::openat(dir.get(), base.c_str(),
                   O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  } while (raw < 0 && errno == EINTR);
  if (raw < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrCat(what, " is a symbolic link"));
    }
    return ErrnoStatus(errno, what);
  }
  UniqueFd fd(raw);
  struct stat after;
  if (::fstat(fd.get(), &after) != 0) {
    return absl::InternalError(absl::StrCat("fstat ", what, ": ", Errno(errno)));
  }
  if (after.st_dev != before.st_dev || after.st_ino != before.st_ino) {
    return absl::FailedPreconditionError(absl::StrCat(what, " was replaced while it was opened"));
  }
  if (!S_ISREG(after.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is ", TypeName(after.st_mode), ", not a regular file"));
  }
  if (refuse_hardlinks && after.st_nlink > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has ", after.st_nlink, " hard links"));
  }
  // O_NONBLOCK only guarded the open; reads of a regular file ignore it, but the caller gets a
  // plain descriptor.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  if (size != nullptr) *size = static_cast<uint64_t>(after.st_size);
  return fd;
}

absl::StatusOr<std::vector<SafeFileEntry>> SafeDir::ListFiles(bool refuse_hardlinks,
                                                              const SafeListLimits& limits) const {
  ListState state;
  state.refuse_hardlinks = refuse_hardlinks;
  state.limits = &limits;
  state.root_path = &path_;
  // Room for every allowed file plus as many directories.
  state.entries_max = limits.files_max > SIZE_MAX / 2 ? SIZE_MAX : 2 * limits.files_max + 1024;
  TS_RETURN_IF_ERROR(ListRecursive(fd_.get(), "", &state));
  std::sort(state.files.begin(), state.files.end(),
            [](const SafeFileEntry& a, const SafeFileEntry& b) { return a.name < b.name; });
  return std::move(state.files);
}

absl::Status SafeDir::WriteFileAtomic(std::string_view name, std::string_view data) const {
  TS_RETURN_IF_ERROR(ValidateArtifactName("file name", name));
  const SplitName split = Split(name);
  TS_ASSIGN_OR_RETURN(UniqueFd dir, WalkDirs(fd_.get(), split.dirs, /*create=*/true, path_, name));
  const std::string base(split.base);
  const std::string what = absl::StrCat("\"", common::AsAbsl(name), "\" in ", path_);

  std::string tmp;
  int raw = -1;
  for (int attempt = 0; attempt < 8 && raw < 0; ++attempt) {
    std::string suffix;
    TS_RETURN_IF_ERROR(RandomHex(8, &suffix));
    tmp = absl::StrCat(".tmp-", suffix);
    do {
      raw = ::openat(dir.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0600);
    } while (raw < 0 && errno == EINTR);
    if (raw < 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat(what, ": create temporary file"));
    }
  }
  if (raw < 0) {
    return absl::InternalError(absl::StrCat(what, ": no unused temporary file name"));
  }
  UniqueFd fd(raw);
  auto cleanup = [&](absl::Status status) {
    ::unlinkat(dir.get(), tmp.c_str(), 0);
    return status;
  };
  absl::Status status = WriteFull(fd.get(), data);
  if (!status.ok()) return cleanup(absl::InternalError(absl::StrCat(what, ": ", status.message())));
  status = FsyncFd(fd.get(), what);
  if (!status.ok()) return cleanup(status);
  if (::close(fd.release()) != 0 && errno != EINTR) {
    return cleanup(absl::InternalError(absl::StrCat("close ", what, ": ", Errno(errno))));
  }
  if (::renameat(dir.get(), tmp.c_str(), dir.get(), base.c_str()) != 0) {
    const int err = errno;
    if (err == EISDIR || err == ENOTEMPTY || err == EEXIST) {
      return cleanup(absl::FailedPreconditionError(absl::StrCat(what, " is a directory")));
    }
    return cleanup(absl::InternalError(absl::StrCat("rename to ", what, ": ", Errno(err))));
  }
  return FsyncFd(dir.get(), absl::StrCat("directory of ", what));
}

absl::StatusOr<UniqueFd> SafeDir::CreateExclusive(std::string_view name) const {
  TS_RETURN_IF_ERROR(ValidateArtifactName("file name", name));
  const SplitName split = Split(name);
  TS_ASSIGN_OR_RETURN(UniqueFd dir, WalkDirs(fd_.get(), split.dirs, /*create=*/true, path_, name));
  const std::string base(split.base);
  const std::string what = absl::StrCat("\"", common::AsAbsl(name), "\" in ", path_);
  int raw;
  do {
    raw = ::openat(dir.get(), base.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                   0644);
  } while (raw < 0 && errno == EINTR);
  if (raw < 0) {
    if (errno == EEXIST) return absl::AlreadyExistsError(absl::StrCat(what, " already exists"));
    return ErrnoStatus(errno, what);
  }
  return UniqueFd(raw);
}

absl::Status SafeDir::Remove(std::string_view name) const {
  TS_RETURN_IF_ERROR(ValidateArtifactName("file name", name));
  const SplitName split = Split(name);
  TS_ASSIGN_OR_RETURN(UniqueFd dir, WalkDirs(fd_.get(), split.dirs, /*create=*/false, path_, name));
  const std::string base(split.base);
  const std::string what = absl::StrCat("\"", common::AsAbsl(name), "\" in ", path_);
  struct stat st;
  if (::fstatat(dir.get(), base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(common::AsAbsl(what), " does not exist"));
    return ErrnoStatus(errno, what);
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is a directory"));
  }
  if (::unlinkat(dir.get(), base.c_str(), 0) != 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(common::AsAbsl(what), " does not exist"));
    return ErrnoStatus(errno, absl::StrCat("unlink ", what));
  }
  return absl::OkStatus();
}

absl::Status SafeDir::Sync() const { return FsyncFd(fd_.get(), path_); }

absl::StatusOr<bool> SafeDir::Empty() const {
  std::vector<std::string> names;
  absl::Status status = ReadDirNames(fd_.get(), path_, /*names_max=*/0, &names);
  if (absl::IsResourceExhausted(status)) return false;
  TS_RETURN_IF_ERROR(status);
  return names.empty();
}

absl::Status ReadFull(int fd, uint64_t offset, size_t size, std::string* out) {
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n =
        ::pread(fd, out->data() + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("pread at ", offset + done, ": ", Errno(errno)));
    }
    if (n == 0) {
      out->resize(done);
      return absl::OutOfRangeError(absl::StrCat("short read: ", done, " of ", size,
                                                " bytes at offset ", offset, " (the file shrank)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      const std::string message = absl::StrCat("write: ", Errno(err));
      // A full filesystem is a limit reached, not a fault: the caller may free space.
      if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
      return absl::InternalError(message);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace ts::sidecar
