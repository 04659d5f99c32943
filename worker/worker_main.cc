// ts_worker: the worker process (docs/worker.md "Worker protocol"). Serves the Worker service on
// a Unix socket for its shard sidecar, reading and writing tensors as files in the work dir,
// until SIGTERM or SIGINT, training on --device (cpu, the default; cuda; auto). Exit codes: 0
// after a clean shutdown, 2 for a bad flag (a --device this machine cannot give among them), 1
// when the socket cannot be served. `--probe-device` prints what --device resolves to (device,
// name, memory and free bytes) as one JSON line and exits: how a host learns its workers' device.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/server.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/process.h"
#include "worker/client/worker_client.h"
#include "worker/trainer.h"
#include "worker/worker_service.h"

namespace ts::worker {
namespace {

constexpr std::string_view kComponent = "ts_worker";
constexpr int kExitBadFlag = 2;
constexpr int kExitFailure = 1;
// How long calls in flight get after SIGTERM before the process leaves without them.
constexpr auto kShutdownGrace = std::chrono::seconds(2);

int Fail(int code, std::string_view message) {
  common::Log(common::LogLevel::kError, kComponent, message);
  return code;
}

// {"device":"cuda","name":"NVIDIA H200","memory_bytes":...,"free_bytes":...}
std::string DeviceInfoJson(const DeviceInfo& info) {
  nlohmann::json j = {{"device", std::string(DeviceName(info.device))},
                      {"name", info.name},
                      {"memory_bytes", info.memory_bytes},
                      {"free_bytes", info.free_bytes}};
  return j.dump();
}

int Main(int argc, char** argv) {
  CLI::App app{"ts_worker: the trainshard worker process", "ts_worker"};
  std::string socket_path, work_dir, log_level = "info";
  int threads = 2;
  uint64_t file_bytes_max = kCheckpointBytesMax;
  std::string device_name = "cpu";
  bool probe = false;
  app.add_option("--device", device_name,
                 "cpu | cuda | auto: where models train (auto: CUDA where available)");
  app.add_flag("--probe-device", probe,
               "print what --device resolves to as one JSON line and exit (1 if it cannot)");
  app.add_option("--socket", socket_path, "Unix socket path to serve on");
  app.add_option("--work-dir", work_dir, "directory of the files requests name");
  app.add_option("--threads", threads, "torch threads, 1..256 (fixes the bits on CPU)");
  app.add_option("--file-bytes-max", file_bytes_max,
                 "cap on a data shard, eval set or tokenizer file (checkpoints and deltas are "
                 "streamed and sized by their model)");
  uint64_t memory_bytes_max = 0;
  app.add_option("--memory-bytes-max", memory_bytes_max,
                 "memory the model's fp32 training state may take (0: physical memory)");
  app.add_option("--log-level", log_level, "debug | info | warn | error");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitBadFlag;
  }
  common::LogLevel level;
  if (!common::ParseLogLevel(log_level, &level)) {
    return Fail(kExitBadFlag, absl::StrCat("log-level: \"", log_level, "\" is not known"));
  }
  common::SetLogLevel(level);
  absl::StatusOr<Device> device = ParseDevice("device", device_name);
  if (!device.ok()) return Fail(kExitBadFlag, device.status().ToString());
  absl::StatusOr<DeviceInfo> info = ProbeDevice(*device);
  if (probe) {
    if (!info.ok()) return Fail(kExitFailure, info.status().ToString());
    std::printf("%s\n", DeviceInfoJson(*info).c_str());
    return 0;
  }
  if (!info.ok()) return Fail(kExitBadFlag, info.status().ToString());
  if (threads < 1 || threads > 256) {
    return Fail(kExitBadFlag, absl::StrCat("threads: ", threads, " is out of range 1..256"));
  }
  if (socket_path.empty() || socket_path.size() > common::kUnixSocketPathMax) {
    return Fail(kExitBadFlag, absl::StrCat("socket: \"", socket_path, "\" must hold 1..",
                                           common::kUnixSocketPathMax, " bytes"));
  }
  if (memory_bytes_max != 0 && memory_bytes_max < 1024) {
    return Fail(kExitBadFlag,
                absl::StrCat("memory-bytes-max: ", memory_bytes_max, " is below 1024"));
  }
  if (file_bytes_max < 1024) {
    return Fail(kExitBadFlag, absl::StrCat("file-bytes-max: ", file_bytes_max, " is below 1024"));
  }
  struct stat st {};
  if (::stat(work_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Fail(kExitBadFlag, absl::StrCat("work-dir: \"", work_dir, "\" is not a directory"));
  }

  // Signals are taken by sigwait on this thread; every thread started later inherits the mask.
  const sigset_t signals = common::BlockStopSignals();

  WorkerService service({.work_dir = work_dir,
                         .num_threads = threads,
                         .file_bytes_max = file_bytes_max,
                         .memory_bytes_max = memory_bytes_max,
                         .device = *info});
  std::unique_ptr<grpc::Server> server = ServeWorker(socket_path, &service);
  if (server == nullptr) {
    return Fail(kExitFailure, absl::StrCat("socket: cannot serve on unix:", socket_path));
  }
  common::Log(
      common::LogLevel::kInfo, kComponent, "serving",
      {{"socket", socket_path},
       {"work_dir", work_dir},
       {"threads", absl::StrCat(threads)},
       {"device", absl::StrCat(std::string(DeviceName(info->device)), " (", info->name, ")")},
       {"pid", absl::StrCat(::getpid())}});

  int sig = 0;
  while (sig != SIGTERM && sig != SIGINT) sig = sigwaitinfo(&signals, nullptr);
  common::Log(common::LogLevel::kInfo, kComponent, "stopping",
              {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  // A model call cannot be interrupted inside libtorch: when one outlasts the grace period the
  // process leaves without waiting for it (its caller sees UNAVAILABLE, as for a crash).
  absl::Notification done;
  // Idle: no grace period, which would otherwise be spent on the callers' idle connections.
  const auto grace = service.busy() ? kShutdownGrace : std::chrono::seconds(0);
  std::thread stopper([&] {
    server->Shutdown(std::chrono::system_clock::now() + grace);
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(4))) {
    ::unlink(socket_path.c_str());
    common::Log(common::LogLevel::kWarn, kComponent, "left with a call in flight");
    std::fflush(nullptr);
    ::_exit(0);
  }
  stopper.join();
  server->Wait();
  ::unlink(socket_path.c_str());
  common::Log(common::LogLevel::kInfo, kComponent, "stopped");
  return 0;
}

}  // namespace
}  // namespace ts::worker

int main(int argc, char** argv) { return ts::worker::Main(argc, argv); }
