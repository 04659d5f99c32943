#include "common/process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ts::common {

absl::StatusOr<pid_t> SpawnProcess(const SpawnOptions& options) {
  if (options.args.empty() || options.args[0].empty()) {
    return absl::InvalidArgumentError("args: no executable");
  }
  // Everything the child needs is built before fork: after it, only exec-safe calls.
  std::vector<std::string> args = options.args;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, options.death_signal);
    if (::getppid() != parent) ::_exit(126);
    if (!options.log_file.empty()) {
      int fd = ::open(options.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

bool ReapProcess(pid_t pid, int64_t timeout_ms, std::string* how) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) {
      how->clear();
      if (r < 0) {
        *how = "was reaped elsewhere";
      } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        *how = absl::StrCat("exited with code ", WEXITSTATUS(status));
      } else if (WIFSIGNALED(status)) {
        *how = absl::StrCat("was killed by signal ", WTERMSIG(status));
      }
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string StopProcess(pid_t pid, int64_t grace_ms) {
  std::string how;
  if (ReapProcess(pid, 0, &how)) return how;
  ::kill(pid, SIGTERM);
  if (ReapProcess(pid, grace_ms, &how)) return how;
  ::kill(pid, SIGKILL);
  ReapProcess(pid, /*timeout_ms=*/60'000, &how);
  return absl::StrCat("did not exit within ", grace_ms, " ms of SIGTERM and was killed");
}

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

uint64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t AvailableMemoryBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), f) != nullptr) {
    found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
  }
  std::fclose(f);
  return found ? static_cast<uint64_t>(kib) * 1024 : 0;
}

std::string SiblingExecutable(const std::string& configured, const std::string& name,
                              const std::string& build_tree_path) {
  if (!configured.empty()) return configured;
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string dir(self, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  for (const std::string& candidate : {dir + "/" + name, dir + "/" + build_tree_path}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return dir + "/" + name;
}

}  // namespace ts::common
