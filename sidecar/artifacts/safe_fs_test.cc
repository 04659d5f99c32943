#include "sidecar/artifacts/safe_fs.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/temp_dir.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;

std::string Msg(const absl::Status& status) { return std::string(status.message()); }

void WriteRaw(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadRaw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> Entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

SafeDir OpenOrDie(const std::string& path) {
  auto dir = SafeDir::Open(path);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return *std::move(dir);
}

// ---------------------------------------------------------------------------------------------
// ValidateArtifactName

struct RefusedName {
  std::string label;
  std::string name;
  std::string reason;  // a substring of the error message
};

class RefusedNameTest : public ::testing::TestWithParam<RefusedName> {};

TEST_P(RefusedNameTest, IsInvalidArgumentNamingFieldAndReason) {
  const RefusedName& c = GetParam();
  absl::Status status = ValidateArtifactName("files[3].name", c.name);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.label << ": " << status;
  EXPECT_NE(Msg(status).find("files[3].name: "), std::string::npos) << status;
  EXPECT_NE(Msg(status).find(c.reason), std::string::npos) << status;
  // The message is printable: no raw control or non-ASCII byte from the name leaks into logs.
  for (char ch : Msg(status)) {
    const auto u = static_cast<unsigned char>(ch);
    EXPECT_TRUE(u >= 0x20 && u < 0x7f) << c.label << ": byte " << int{u} << " in " << status;
  }
}

std::vector<RefusedName> RefusedNames() {
  return {
      {"empty", "", "is empty"},
      {"dotdot", "..", "\"..\" component"},
      {"dot", ".", "\".\" component"},
      {"traversal_prefix", "../etc/passwd", "\"..\" component"},
      {"traversal_middle", "a/../b", "\"..\" component"},
      {"traversal_suffix", "a/b/..", "\"..\" component"},
      {"dot_middle", "a/./b", "\".\" component"},
      {"absolute", "/etc/passwd", "absolute path"},
      {"root", "/", "absolute path"},
      {"backslash", "a\\b", "backslash"},
      {"backslash_traversal", "..\\..\\windows", "backslash"},
      {"percent_traversal", "%2e%2e%2fetc", "'%'"},
      {"percent_slash", "a%2Fb", "'%'"},
      {"percent_backslash", "a%5cb", "'%'"},
      {"nul_inside", std::string("a\0b", 3), "NUL"},
      {"nul_end", std::string("ab\0", 3), "NUL"},
      {"newline", "a\nb", "control character 0xa"},
      {"tab", "a\tb", "control character 0x9"},
      {"escape", "a\x1b[2Jb", "control character 0x1b"},
      {"delete", "a\x7f", "control character 0x7f"},
      {"empty_component", "a//b", "empty component"},
      {"leading_empty", "./a", "\".\" component"},
      {"trailing_slash", "a/b/", "ends with '/'"},
      {"space", "a b", "space"},
      {"colon", "c:foo", "':'"},
      {"tilde", "~/x", "'~'"},
      {"star", "a*", "'*'"},
      {"non_ascii_utf8", "caf\xc3\xa9", "non-ASCII byte 0xc3"},
      {"non_ascii_overlong_dot", "\xc0\xae\xc0\xae/x", "non-ASCII byte 0xc0"},
      {"non_ascii_fullwidth_slash",
       "a\xef\xbc\x8f"
       "b",
       "non-ASCII byte 0xef"},
      {"too_long_total",
       std::string(250, 'a') + "/" + std::string(250, 'b') + "/" + std::string(250, 'c') + "/" +
           std::string(250, 'd') + "/" + std::string(250, 'e'),
       "longer than 1024 bytes"},
      {"one_byte_too_long",
       std::string(255, 'a') + "/" + std::string(255, 'b') + "/" + std::string(255, 'c') + "/" +
           std::string(255, 'd') + "/e",  // 1025 bytes
       "longer than 1024 bytes"},
      {"too_long_component", std::string(256, 'a'), "longer than 255 bytes"},
      {"too_deep", "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q", "more than 16 components"},
  };
}

INSTANTIATE_TEST_SUITE_P(Names, RefusedNameTest, ::testing::ValuesIn(RefusedNames()),
                         [](const ::testing::TestParamInfo<RefusedName>& info) {
                           return info.param.label;
                         });

TEST(ValidateArtifactNameTest, AcceptsNamesOfTheAlphabet) {
  const std::vector<std::string> accepted = {
      "a",
      "model.safetensors",
      "weights/layer-0/shard_1.bin",
      ".hidden",
      "...",
      "..a",
      "a..",
      "v1.2+build=3@host,x-y_z",
      "ABCxyz0189",
      std::string(255, 'x'),
      "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p",  // exactly 16 components
      std::string(255, 'a') + "/" + std::string(255, 'b') + "/" + std::string(255, 'c') + "/" +
          std::string(254, 'd') + "/e",  // exactly 1024 bytes
  };
  for (const std::string& name : accepted) {
    EXPECT_TRUE(ValidateArtifactName("name", name).ok())
        << name << ": " << ValidateArtifactName("name", name);
  }
  EXPECT_EQ(accepted.back().size(), kMaxArtifactNameBytes);
}

TEST(ValidateArtifactNameTest, LongRefusedNameIsQuotedTruncated) {
  const std::string name = std::string(5000, 'a') + "\\";
  absl::Status status = ValidateArtifactName("name", name);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(status.message().size(), 400u) << status;
  EXPECT_NE(Msg(status).find("5001 bytes"), std::string::npos) << status;
}

// ---------------------------------------------------------------------------------------------
// UniqueFd

TEST(UniqueFdTest, ClosesOnDestructionAndMove) {
  int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    UniqueFd a(raw);
    UniqueFd b(std::move(a));
    EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from state is specified
    EXPECT_EQ(b.get(), raw);
    UniqueFd c;
    c = std::move(b);
    EXPECT_EQ(c.get(), raw);
    EXPECT_GE(::fcntl(raw, F_GETFD), 0);
  }
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

// ---------------------------------------------------------------------------------------------
// SafeDir::Open / OpenDir

TEST(SafeDirOpenTest, OpensCreatesAndRefuses) {
  test_util::TempDir tmp{"safe_fs_"};
  EXPECT_EQ(SafeDir::Open(tmp.str() + "/missing").status().code(), absl::StatusCode::kNotFound);

  auto created = SafeDir::Open(tmp.str() + "/x/y/z", /*create=*/true);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(fs::is_directory(tmp.path() / "x/y/z"));
  EXPECT_EQ(fs::status(tmp.path() / "x/y/z").permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_EQ(created->path(), tmp.str() + "/x/y/z");
  // Opening an existing directory with create is fine.
  EXPECT_TRUE(SafeDir::Open(tmp.str() + "/x/y/z", /*create=*/true).ok());

  WriteRaw(tmp.path() / "file", "x");
  absl::Status status = SafeDir::Open(tmp.str() + "/file").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("regular file"), std::string::npos) << status;

  fs::create_symlink(tmp.path() / "x", tmp.path() / "link");
  status = SafeDir::Open(tmp.str() + "/link").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("symbolic link"), std::string::npos) << status;
}

TEST(SafeDirOpenTest, OpenDirWalksWithoutFollowingLinks) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  SafeDir root = OpenOrDie(tmp.str());

  EXPECT_EQ(root.OpenDir("a/b").status().code(), absl::StatusCode::kNotFound);
  auto sub = root.OpenDir("a/b", /*create=*/true);
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_TRUE(fs::is_directory(tmp.path() / "a/b"));
  EXPECT_EQ(sub->path(), tmp.str() + "/a/b");
  ASSERT_TRUE(sub->WriteFileAtomic("f", "inside").ok());
  EXPECT_EQ(ReadRaw(tmp.path() / "a/b/f"), "inside");

  EXPECT_EQ(root.OpenDir("../x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(root.OpenDir("/tmp").status().code(), absl::StatusCode::kInvalidArgument);

  fs::create_symlink(outside.path(), tmp.path() / "a/evil");
  for (bool create : {false, true}) {
    absl::Status status = root.OpenDir("a/evil/deeper", create).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(Msg(status).find("\"a/evil\""), std::string::npos) << status;
    EXPECT_NE(Msg(status).find("symbolic link"), std::string::npos) << status;
  }
  EXPECT_TRUE(Entries(outside.path()).empty());

  WriteRaw(tmp.path() / "a/plain", "x");
  absl::Status status = root.OpenDir("a/plain/x", /*create=*/true).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("regular file"), std::string::npos) << status;
}

// ---------------------------------------------------------------------------------------------
// SafeDir::OpenRead

TEST(SafeDirOpenReadTest, ReadsARegularFile) {
  test_util::TempDir tmp{"safe_fs_"};
  WriteRaw(tmp.path() / "d/e/data.bin", "0123456789");
  SafeDir root = OpenOrDie(tmp.str());
  uint64_t size = 0;
  auto fd = root.OpenRead("d/e/data.bin", /*refuse_hardlinks=*/true, &size);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(size, 10u);
  EXPECT_EQ(::fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC, 0);
  std::string out;
  ASSERT_TRUE(ReadFull(fd->get(), 3, 4, &out).ok());
  EXPECT_EQ(out, "3456");
  absl::Status status = ReadFull(fd->get(), 8, 5, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;

  EXPECT_EQ(root.OpenRead("d/e/missing", true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(root.OpenRead("nope/missing", true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(root.OpenRead("d/../d/e/data.bin", true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafeDirOpenReadTest, RefusesASymlinkedFile) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  WriteRaw(outside.path() / "secret", "secret");
  fs::create_symlink(outside.path() / "secret", tmp.path() / "link");
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.OpenRead("link", /*refuse_hardlinks=*/false).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("\"link\""), std::string::npos) << status;
  EXPECT_NE(Msg(status).find(tmp.str()), std::string::npos) << status;
  EXPECT_NE(Msg(status).find("is a symbolic link"), std::string::npos) << status;
}

TEST(SafeDirOpenReadTest, RefusesASymlinkedDirectoryOnTheWay) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  WriteRaw(outside.path() / "inner/secret", "secret");
  fs::create_directories(tmp.path() / "a");
  fs::create_symlink(outside.path(), tmp.path() / "a/link");
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.OpenRead("a/link/inner/secret", false).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("\"a/link\""), std::string::npos) << status;
  EXPECT_NE(Msg(status).find("symbolic link"), std::string::npos) << status;
}

TEST(SafeDirOpenReadTest, RefusesAHardlinkedFileOnlyWhenAsked) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  WriteRaw(outside.path() / "secret", "secret");
  // A hard link across directories: the published file would be one that lives outside.
  ASSERT_EQ(::link((outside.path() / "secret").c_str(), (tmp.path() / "h").c_str()), 0)
      << std::strerror(errno);
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.OpenRead("h", /*refuse_hardlinks=*/true).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("\"h\""), std::string::npos) << status;
  EXPECT_NE(Msg(status).find("has 2 hard links"), std::string::npos) << status;
  EXPECT_TRUE(root.OpenRead("h", /*refuse_hardlinks=*/false).ok());
}

TEST(SafeDirOpenReadTest, RefusesAFifoWithoutBlocking) {
  test_util::TempDir tmp{"safe_fs_"};
  const fs::path fifo = tmp.path() / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  SafeDir root = OpenOrDie(tmp.str());
  auto result = std::async(std::launch::async, [&] {
    return root.OpenRead("pipe", /*refuse_hardlinks=*/true).status();
  });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "OpenRead blocked on a FIFO";
    // Unblock the reader so the test can finish.
    int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (w >= 0) ::close(w);
  }
  absl::Status status = result.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("\"pipe\""), std::string::npos) << status;
  EXPECT_NE(Msg(status).find("is a FIFO"), std::string::npos) << status;
}

TEST(SafeDirOpenReadTest, RefusesAUnixSocket) {
  test_util::TempDir tmp{"safe_fs_"};
  const std::string path = (tmp.path() / "sock").string();
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  UniqueFd sock(s);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.OpenRead("sock", true).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("is a socket"), std::string::npos) << status;
}

TEST(SafeDirOpenReadTest, RefusesACharacterDevice) {
  test_util::TempDir tmp{"safe_fs_"};
  const fs::path dev = tmp.path() / "null";
  if (::mknod(dev.c_str(), S_IFCHR | 0600, ::makedev(1, 3)) == 0) {
    SafeDir root = OpenOrDie(tmp.str());
    absl::Status status = root.OpenRead("null", true).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(Msg(status).find("is a character device"), std::string::npos) << status;
    status = root.ListFiles(true, SafeListLimits{}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(Msg(status).find("is a character device"), std::string::npos) << status;
  } else {
    // Without CAP_MKNOD: the system's own /dev/null stands in.
    ASSERT_TRUE(errno == EPERM || errno == EACCES) << std::strerror(errno);
  }
  SafeDir devdir = OpenOrDie("/dev");
  absl::Status status = devdir.OpenRead("null", false).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("is a character device"), std::string::npos) << status;
}

TEST(SafeDirOpenReadTest, RefusesADirectory) {
  test_util::TempDir tmp{"safe_fs_"};
  fs::create_directories(tmp.path() / "a/b");
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.OpenRead("a/b", true).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("is a directory"), std::string::npos) << status;
}

TEST(SafeDirOpenReadTest, ConcurrentReadersShareOneSafeDir) {
  test_util::TempDir tmp{"safe_fs_"};
  for (int i = 0; i < 8; ++i) WriteRaw(tmp.path() / ("f" + std::to_string(i)), std::string(i, 'x'));
  SafeDir root = OpenOrDie(tmp.str());
  std::vector<std::future<bool>> results;
  for (int i = 0; i < 8; ++i) {
    results.push_back(std::async(std::launch::async, [&root, i] {
      for (int round = 0; round < 50; ++round) {
        uint64_t size = 0;
        auto fd = root.OpenRead("f" + std::to_string(i), true, &size);
        if (!fd.ok() || size != static_cast<uint64_t>(i)) return false;
      }
      return true;
    }));
  }
  for (auto& r : results) EXPECT_TRUE(r.get());
}

// ---------------------------------------------------------------------------------------------
// SafeDir::ListFiles

TEST(SafeDirListTest, ListsRegularFilesRecursivelySorted) {
  test_util::TempDir tmp{"safe_fs_"};
  WriteRaw(tmp.path() / "b.bin", "bb");
  WriteRaw(tmp.path() / "a/z", "zzz");
  WriteRaw(tmp.path() / "a/b/c", "");
  WriteRaw(tmp.path() / "a-x", "1");
  fs::create_directories(tmp.path() / "empty/dir");
  SafeDir root = OpenOrDie(tmp.str());
  auto files = root.ListFiles(true, SafeListLimits{});
  ASSERT_TRUE(files.ok()) << files.status();
  std::vector<std::pair<std::string, uint64_t>> got;
  for (const SafeFileEntry& e : *files) got.emplace_back(e.name, e.size);
  // Byte order: '-' (0x2d) sorts before '/' (0x2f).
  const std::vector<std::pair<std::string, uint64_t>> want = {
      {"a-x", 1}, {"a/b/c", 0}, {"a/z", 3}, {"b.bin", 2}};
  EXPECT_EQ(got, want);
}

TEST(SafeDirListTest, RefusesEverythingButRegularFilesAndDirectories) {
  struct Case {
    std::string label;
    std::function<void(const fs::path&)> plant;
    std::string reason;
  };
  test_util::TempDir outside{"safe_fs_"};
  WriteRaw(outside.path() / "secret", "secret");
  const std::vector<Case> cases = {
      {"symlink_file",
       [&](const fs::path& d) { fs::create_symlink(outside.path() / "secret", d / "sub/l"); },
       "is a symbolic link"},
      {"symlink_dir", [&](const fs::path& d) { fs::create_symlink(outside.path(), d / "sub/l"); },
       "is a symbolic link"},
      {"fifo", [](const fs::path& d) { ASSERT_EQ(::mkfifo((d / "sub/l").c_str(), 0600), 0); },
       "is a FIFO"},
      {"hardlink",
       [&](const fs::path& d) {
         ASSERT_EQ(::link((outside.path() / "secret").c_str(), (d / "sub/l").c_str()), 0);
       },
       "has 2 hard links"},
      {"bad_name", [](const fs::path& d) { WriteRaw(d / "sub/l%2f", "x"); }, "'%'"},
      {"bad_dir_name", [](const fs::path& d) { WriteRaw(d / "sub/a b/x", "x"); }, "space"},
  };
  for (const Case& c : cases) {
    test_util::TempDir tmp{"safe_fs_"};
    WriteRaw(tmp.path() / "sub/ok", "ok");
    c.plant(tmp.path());
    SafeDir root = OpenOrDie(tmp.str());
    absl::Status status = root.ListFiles(/*refuse_hardlinks=*/true, SafeListLimits{}).status();
    EXPECT_FALSE(status.ok()) << c.label;
    EXPECT_TRUE(status.code() == absl::StatusCode::kFailedPrecondition ||
                status.code() == absl::StatusCode::kInvalidArgument)
        << c.label << ": " << status;
    EXPECT_NE(Msg(status).find(c.reason), std::string::npos) << c.label << ": " << status;
    EXPECT_NE(Msg(status).find("sub/"), std::string::npos) << c.label << ": " << status;
  }
}

TEST(SafeDirListTest, ConcurrentListingsEachSeeEveryFile) {
  test_util::TempDir tmp{"safe_fs_"};
  // Enough entries (about 80 KiB of dirents) that a listing takes several getdents calls, so
  // listings sharing one read offset would interleave.
  constexpr int kFiles = 1000;
  for (int i = 0; i < kFiles; ++i) {
    WriteRaw(tmp.path() / (std::string(60, 'f') + std::to_string(i)), "");
  }
  SafeDir root = OpenOrDie(tmp.str());
  std::vector<std::future<bool>> results;
  for (int t = 0; t < 4; ++t) {
    results.push_back(std::async(std::launch::async, [&root] {
      for (int round = 0; round < 10; ++round) {
        auto files = root.ListFiles(true, SafeListLimits{});
        if (!files.ok() || files->size() != kFiles) return false;
        auto empty = root.Empty();
        if (!empty.ok() || *empty) return false;
      }
      return true;
    }));
  }
  for (auto& r : results) EXPECT_TRUE(r.get());
}

TEST(SafeDirListTest, HardlinksAllowedWhenNotRefused) {
  test_util::TempDir tmp{"safe_fs_"};
  WriteRaw(tmp.path() / "a", "x");
  ASSERT_EQ(::link((tmp.path() / "a").c_str(), (tmp.path() / "b").c_str()), 0);
  SafeDir root = OpenOrDie(tmp.str());
  auto files = root.ListFiles(/*refuse_hardlinks=*/false, SafeListLimits{});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 2u);
  EXPECT_FALSE(root.ListFiles(/*refuse_hardlinks=*/true, SafeListLimits{}).ok());
}

TEST(SafeDirListTest, RefusesAUnixSocket) {
  test_util::TempDir tmp{"safe_fs_"};
  const std::string path = (tmp.path() / "s").string();
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(sock.valid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.ListFiles(true, SafeListLimits{}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("is a socket"), std::string::npos) << status;
}

TEST(SafeDirListTest, EnforcesLimits) {
  test_util::TempDir tmp{"safe_fs_"};
  for (int i = 0; i < 5; ++i) WriteRaw(tmp.path() / ("d/f" + std::to_string(i)), "0123456789");
  SafeDir root = OpenOrDie(tmp.str());

  SafeListLimits limits;
  limits.files_max = 5;
  limits.bytes_max = 50;
  auto files = root.ListFiles(true, limits);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 5u);

  limits.files_max = 4;
  absl::Status status = root.ListFiles(true, limits).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(Msg(status).find("files_max"), std::string::npos) << status;

  limits.files_max = 5;
  limits.bytes_max = 49;
  status = root.ListFiles(true, limits).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(Msg(status).find("bytes_max"), std::string::npos) << status;
}

TEST(SafeDirListTest, ManyEmptyDirectoriesAreBounded) {
  test_util::TempDir tmp{"safe_fs_"};
  for (int i = 0; i < 40; ++i) fs::create_directories(tmp.path() / ("d" + std::to_string(i)));
  SafeDir root = OpenOrDie(tmp.str());
  SafeListLimits limits;
  limits.files_max = 0;
  // 2 * files_max + 1024 entries are allowed: 40 empty directories are fine...
  auto files = root.ListFiles(true, limits);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_TRUE(files->empty());
  // ...and one file is over files_max = 0.
  WriteRaw(tmp.path() / "d7/f", "x");
  EXPECT_EQ(root.ListFiles(true, limits).status().code(), absl::StatusCode::kResourceExhausted);
}

// ---------------------------------------------------------------------------------------------
// SafeDir::WriteFileAtomic

TEST(SafeDirWriteTest, WritesCreatesParentsAndReplaces) {
  test_util::TempDir tmp{"safe_fs_"};
  SafeDir root = OpenOrDie(tmp.str());
  ASSERT_TRUE(root.WriteFileAtomic("a/b/c.bin", "first").ok());
  EXPECT_EQ(ReadRaw(tmp.path() / "a/b/c.bin"), "first");
  EXPECT_EQ(fs::status(tmp.path() / "a/b/c.bin").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(fs::status(tmp.path() / "a/b").permissions() & fs::perms::all, fs::perms::owner_all);
  ASSERT_TRUE(root.WriteFileAtomic("a/b/c.bin", "second, longer").ok());
  EXPECT_EQ(ReadRaw(tmp.path() / "a/b/c.bin"), "second, longer");
  ASSERT_TRUE(root.WriteFileAtomic("empty", "").ok());
  EXPECT_EQ(fs::file_size(tmp.path() / "empty"), 0u);
  // No temporaries left behind.
  EXPECT_EQ(Entries(tmp.path() / "a/b"), std::vector<std::string>{"c.bin"});
  EXPECT_EQ(Entries(tmp.path()), (std::vector<std::string>{"a", "empty"}));

  const std::string big(3 << 20, 'q');
  ASSERT_TRUE(root.WriteFileAtomic("big", big).ok());
  EXPECT_EQ(ReadRaw(tmp.path() / "big"), big);

  EXPECT_EQ(root.WriteFileAtomic("../escape", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(root.WriteFileAtomic("/etc/x", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafeDirWriteTest, ReplacesAPlantedSymlinkNotItsTarget) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  WriteRaw(outside.path() / "victim", "original");
  fs::create_directories(tmp.path() / "chunks");
  fs::create_symlink(outside.path() / "victim", tmp.path() / "chunks/x");
  SafeDir root = OpenOrDie(tmp.str());
  ASSERT_TRUE(root.WriteFileAtomic("chunks/x", "new bytes").ok());
  EXPECT_EQ(ReadRaw(outside.path() / "victim"), "original");
  EXPECT_FALSE(fs::is_symlink(tmp.path() / "chunks/x"));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(tmp.path() / "chunks/x")));
  EXPECT_EQ(ReadRaw(tmp.path() / "chunks/x"), "new bytes");
}

TEST(SafeDirWriteTest, RefusesASymlinkedParentAndWritesNothingOutside) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  fs::create_directories(tmp.path() / "a");
  fs::create_symlink(outside.path(), tmp.path() / "a/link");
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.WriteFileAtomic("a/link/f", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(Msg(status).find("symbolic link"), std::string::npos) << status;
  status = root.WriteFileAtomic("a/link/sub/f", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(Entries(outside.path()).empty());
  // A symlink to a directory as the root component too.
  fs::create_symlink(outside.path(), tmp.path() / "top");
  EXPECT_EQ(root.WriteFileAtomic("top/f", "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(root.CreateExclusive("top/f").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Entries(outside.path()).empty());
}

TEST(SafeDirWriteTest, RefusesADirectoryAsTargetAndCleansUp) {
  test_util::TempDir tmp{"safe_fs_"};
  fs::create_directories(tmp.path() / "d/inner");
  SafeDir root = OpenOrDie(tmp.str());
  absl::Status status = root.WriteFileAtomic("d", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(Entries(tmp.path()), std::vector<std::string>{"d"});
  fs::create_directories(tmp.path() / "e");
  status = root.WriteFileAtomic("e", "x");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Entries(tmp.path()), (std::vector<std::string>{"d", "e"}));
}

// ---------------------------------------------------------------------------------------------
// CreateExclusive, Remove, Empty, Sync

TEST(SafeDirCreateTest, CreatesExclusivelyAndNeverThroughALink) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  SafeDir root = OpenOrDie(tmp.str());
  auto fd = root.CreateExclusive("out/x/file");
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_TRUE(WriteFull(fd->get(), "hello").ok());
  *fd = UniqueFd();
  EXPECT_EQ(ReadRaw(tmp.path() / "out/x/file"), "hello");
  EXPECT_EQ(root.CreateExclusive("out/x/file").status().code(), absl::StatusCode::kAlreadyExists);

  WriteRaw(outside.path() / "victim", "original");
  fs::create_symlink(outside.path() / "victim", tmp.path() / "planted");
  absl::Status status = root.CreateExclusive("planted").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;
  // A dangling link is no way out either.
  fs::create_symlink(outside.path() / "new", tmp.path() / "dangling");
  EXPECT_EQ(root.CreateExclusive("dangling").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadRaw(outside.path() / "victim"), "original");
  EXPECT_EQ(Entries(outside.path()), std::vector<std::string>{"victim"});
}

TEST(SafeDirRemoveTest, RemovesFilesAndLinksNotTargets) {
  test_util::TempDir tmp{"safe_fs_"};
  test_util::TempDir outside{"safe_fs_"};
  WriteRaw(tmp.path() / "a/f", "x");
  WriteRaw(outside.path() / "victim", "original");
  fs::create_symlink(outside.path() / "victim", tmp.path() / "a/l");
  SafeDir root = OpenOrDie(tmp.str());
  ASSERT_TRUE(root.Remove("a/f").ok());
  EXPECT_FALSE(fs::exists(tmp.path() / "a/f"));
  ASSERT_TRUE(root.Remove("a/l").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp.path() / "a/l")));
  EXPECT_EQ(ReadRaw(outside.path() / "victim"), "original");
  EXPECT_EQ(root.Remove("a/f").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(root.Remove("missing/f").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(root.Remove("a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(root.Remove("a/../x").code(), absl::StatusCode::kInvalidArgument);

  fs::create_symlink(outside.path(), tmp.path() / "dirlink");
  EXPECT_EQ(root.Remove("dirlink/victim").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::exists(outside.path() / "victim"));
}

TEST(SafeDirEmptyTest, ReportsEmptiness) {
  test_util::TempDir tmp{"safe_fs_"};
  SafeDir root = OpenOrDie(tmp.str());
  auto empty = root.Empty();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(*empty);
  EXPECT_TRUE(root.Sync().ok());
  ASSERT_TRUE(root.WriteFileAtomic("x", "1").ok());
  empty = root.Empty();
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(*empty);
  // Asking twice gives the same answer (the descriptor's offset is not consumed).
  empty = root.Empty();
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(*empty);
  ASSERT_TRUE(root.Remove("x").ok());
  empty = root.Empty();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(*empty);
}

TEST(ReadWriteFullTest, WritesAndReadsAll) {
  test_util::TempDir tmp{"safe_fs_"};
  const fs::path path = tmp.path() / "f";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  ASSERT_TRUE(fd.valid());
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131);
  ASSERT_TRUE(WriteFull(fd.get(), data).ok());
  std::string out;
  ASSERT_TRUE(ReadFull(fd.get(), 0, data.size(), &out).ok());
  EXPECT_EQ(out, data);
  EXPECT_EQ(ReadFull(fd.get(), data.size(), 1, &out).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReadFull(-1, 0, 1, &out).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(WriteFull(-1, "x").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace ts::sidecar
