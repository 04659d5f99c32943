// Child processes the project starts and supervises (the worker of a run, a host's shard
// processes): fork + exec with the child tied to the parent's life, and reaping with a bounded
// wait. The death signal (PR_SET_PDEATHSIG) is sent when the *thread* that spawned the child
// ends, so spawn from a thread that lives as long as the child should.
//
// Thread-safety: the functions are thread-safe; one pid is reaped by one caller.
#ifndef TS_COMMON_PROCESS_H_
#define TS_COMMON_PROCESS_H_

#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ts::common {

// The longest path a Unix socket can be bound at (sizeof(sockaddr_un::sun_path) - 1). The
// project's processes serve one another on such sockets.
inline constexpr size_t kUnixSocketPathMax = 107;

// `preferred` if it fits kUnixSocketPathMax, else `fallback` (a short path, e.g. under /tmp).
inline std::string UnixSocketPathOr(std::string preferred, std::string fallback) {
  return preferred.size() <= kUnixSocketPathMax ? preferred : fallback;
}

struct SpawnOptions {
  std::vector<std::string> args;  // args[0] is the executable's path
  std::string log_file = {};      // the child's stdout and stderr (appended); empty: inherited
  int death_signal = 15;          // SIGTERM, sent to the child when the spawning thread ends
};

// INVALID_ARGUMENT without args; INTERNAL when fork fails. The child exits 126 when its parent
// died before it was tied to it and 127 when exec fails.
absl::StatusOr<pid_t> SpawnProcess(const SpawnOptions& options);

// Waits up to timeout_ms (0: just checks) for `pid` to exit. True once it is reaped (or was
// reaped elsewhere); `how` then describes the exit: "" for exit code 0, "exited with code N",
// "was killed by signal N".
bool ReapProcess(pid_t pid, int64_t timeout_ms, std::string* how);

// SIGTERM, up to grace_ms for it to exit, then SIGKILL; reaps. Returns how it exited, as
// ReapProcess says, or "did not exit within <grace> ms of SIGTERM and was killed".
std::string StopProcess(pid_t pid, int64_t grace_ms);

// For a process's main thread before it starts any other: blocks SIGTERM and SIGINT (every
// thread started later inherits the mask, so only a sigwait on the returned set takes them) and
// ignores SIGPIPE (a peer that goes away is an error on the write, not the end of the process).
sigset_t BlockStopSignals();

// The machine's physical memory in bytes (sysconf), 0 if it cannot be told: what a worker and a
// host assume they may use for training when nothing smaller is configured.
uint64_t PhysicalMemoryBytes();

// The memory the kernel says a new program could use now without swapping (MemAvailable in
// /proc/meminfo), 0 if it cannot be told.
uint64_t AvailableMemoryBytes();

// An executable one of the project's programs starts: `configured` if not empty, else `name`
// beside the running executable, else `build_tree_path` from its folder (where the build tree
// puts it); the first when none of them is executable.
std::string SiblingExecutable(const std::string& configured, const std::string& name,
                              const std::string& build_tree_path);

}  // namespace ts::common

#endif  // TS_COMMON_PROCESS_H_
