#include "worker/client/worker_client.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/process.h"
#include "common/status.h"
#include "proto/grpc_status.h"

namespace ts::worker {
namespace {

template <typename Response, typename Call>
absl::StatusOr<Response> Invoke(const std::string& target, std::string_view method,
                                int64_t timeout_ms, Call&& call, bool wait_for_ready = false) {
  grpc::ClientContext context;
  context.set_wait_for_ready(wait_for_ready);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  Response response;
  grpc::Status status = call(&context, &response);
  if (status.ok()) return response;
  std::string what = absl::StrCat("worker ", target, ": Worker/", ts::common::AsAbsl(method));
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat(
        what,
        ": the worker is not serving (not started, crashed or killed): ", status.error_message()));
  }
  return ts::FromGrpcStatus(status, what);
}

}  // namespace

std::unique_ptr<grpc::Server> ServeWorker(const std::string& socket_path, grpc::Service* service) {
  ::unlink(socket_path.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_path), grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(kWorkerMessageBytesMax);
  builder.SetMaxSendMessageSize(kWorkerMessageBytesMax);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

WorkerClient::WorkerClient(std::string socket_path, WorkerClientOptions options)
    : target_(absl::StrCat("unix:", socket_path)), options_(options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kWorkerMessageBytesMax);
  args.SetMaxSendMessageSize(kWorkerMessageBytesMax);
  // A restarted worker must be reached at once, not after gRPC's reconnect backoff.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  stub_ = pb::Worker::NewStub(
      grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<pb::InitModelResponse> WorkerClient::InitModel(const pb::InitModelRequest& request,
                                                              int64_t timeout_ms) {
  return Invoke<pb::InitModelResponse>(target_, "InitModel",
                                       timeout_ms > 0 ? timeout_ms : options_.call_timeout_ms,
                                       [&](grpc::ClientContext* c, pb::InitModelResponse* r) {
                                         return stub_->InitModel(c, request, r);
                                       });
}

absl::StatusOr<pb::LoadCheckpointResponse> WorkerClient::LoadCheckpoint(
    const pb::LoadCheckpointRequest& request, int64_t timeout_ms) {
  return Invoke<pb::LoadCheckpointResponse>(
      target_, "LoadCheckpoint", timeout_ms > 0 ? timeout_ms : options_.call_timeout_ms,
      [&](grpc::ClientContext* c, pb::LoadCheckpointResponse* r) {
        return stub_->LoadCheckpoint(c, request, r);
      });
}

absl::StatusOr<pb::InnerStepsResponse> WorkerClient::InnerSteps(
    const pb::InnerStepsRequest& request, int64_t timeout_ms) {
  return Invoke<pb::InnerStepsResponse>(target_, "InnerSteps",
                                        timeout_ms > 0 ? timeout_ms : options_.train_timeout_ms,
                                        [&](grpc::ClientContext* c, pb::InnerStepsResponse* r) {
                                          return stub_->InnerSteps(c, request, r);
                                        });
}

absl::StatusOr<pb::OuterStepResponse> WorkerClient::OuterStep(const pb::OuterStepRequest& request,
                                                              int64_t timeout_ms) {
  return Invoke<pb::OuterStepResponse>(target_, "OuterStep",
                                       timeout_ms > 0 ? timeout_ms : options_.train_timeout_ms,
                                       [&](grpc::ClientContext* c, pb::OuterStepResponse* r) {
                                         return stub_->OuterStep(c, request, r);
                                       });
}

absl::StatusOr<pb::EvaluateResponse> WorkerClient::Evaluate(const pb::EvaluateRequest& request,
                                                            int64_t timeout_ms) {
  return Invoke<pb::EvaluateResponse>(target_, "Evaluate",
                                      timeout_ms > 0 ? timeout_ms : options_.train_timeout_ms,
                                      [&](grpc::ClientContext* c, pb::EvaluateResponse* r) {
                                        return stub_->Evaluate(c, request, r);
                                      });
}

absl::StatusOr<pb::SampleResponse> WorkerClient::Sample(const pb::SampleRequest& request,
                                                        int64_t timeout_ms) {
  return Invoke<pb::SampleResponse>(
      target_, "Sample", timeout_ms > 0 ? timeout_ms : options_.call_timeout_ms,
      [&](grpc::ClientContext* c, pb::SampleResponse* r) { return stub_->Sample(c, request, r); });
}

absl::StatusOr<pb::PrepareDataResponse> WorkerClient::PrepareData(
    const pb::PrepareDataRequest& request, int64_t timeout_ms) {
  return Invoke<pb::PrepareDataResponse>(target_, "PrepareData",
                                         timeout_ms > 0 ? timeout_ms : options_.train_timeout_ms,
                                         [&](grpc::ClientContext* c, pb::PrepareDataResponse* r) {
                                           return stub_->PrepareData(c, request, r);
                                         });
}

absl::StatusOr<pb::WorkerStatusResponse> WorkerClient::Status(int64_t timeout_ms,
                                                              bool wait_for_ready) {
  pb::WorkerStatusRequest request;
  return Invoke<pb::WorkerStatusResponse>(
      target_, "Status", timeout_ms > 0 ? timeout_ms : options_.call_timeout_ms,
      [&](grpc::ClientContext* c, pb::WorkerStatusResponse* r) {
        return stub_->Status(c, request, r);
      },
      wait_for_ready);
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Start(WorkerProcessOptions options) {
  if (options.binary.empty()) return absl::InvalidArgumentError("binary: missing");
  if (options.socket_path.empty() || options.socket_path.size() > common::kUnixSocketPathMax) {
    return absl::InvalidArgumentError(absl::StrCat("socket_path: \"", options.socket_path,
                                                   "\" must hold 1..", common::kUnixSocketPathMax,
                                                   " bytes"));
  }
  if (options.work_dir.empty()) return absl::InvalidArgumentError("work_dir: missing");
  if (options.threads < 1 || options.threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads: ", options.threads, " is out of range 1..256"));
  }
  common::SpawnOptions spawn;
  spawn.args = {options.binary,
                "--socket",
                options.socket_path,
                "--work-dir",
                options.work_dir,
                "--threads",
                std::to_string(options.threads)};
  spawn.args.insert(spawn.args.end(), options.extra_args.begin(), options.extra_args.end());
  spawn.log_file = options.log_file;
  // The path belongs to this worker: a socket left by a killed one must not be mistaken for the
  // new one's, and the channel is only used once the new socket exists (a channel that tried
  // too early waits out gRPC's reconnect backoff).
  ::unlink(options.socket_path.c_str());
  TS_ASSIGN_OR_RETURN(pid_t pid, common::SpawnProcess(spawn));

  std::unique_ptr<WorkerProcess> process(new WorkerProcess(std::move(options), pid));
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(process->options_.start_timeout_ms);
  absl::Status last;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string how;
    if (process->Reap(/*timeout_ms=*/0, &how)) {
      return absl::UnavailableError(absl::StrCat("worker ", process->client_->target(), " (",
                                                 process->options_.binary, ") ", how,
                                                 " before serving"));
    }
    struct stat st {};
    if (::stat(process->options_.socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      auto status = process->client_->Status(/*timeout_ms=*/500, /*wait_for_ready=*/true);
      if (status.ok()) return process;
      last = status.status();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  process->Kill();
  return absl::DeadlineExceededError(
      absl::StrCat("worker ", process->client_->target(), " did not serve within ",
                   process->options_.start_timeout_ms, " ms: ", last.message()));
}

WorkerProcess::WorkerProcess(WorkerProcessOptions options, pid_t pid)
    : options_(std::move(options)),
      pid_(pid),
      client_(std::make_unique<WorkerClient>(options_.socket_path, options_.client)) {}

WorkerProcess::~WorkerProcess() { (void)Stop(); }

bool WorkerProcess::Reap(int64_t timeout_ms, std::string* how) {
  if (reaped_) return true;
  reaped_ = common::ReapProcess(pid_, timeout_ms, how);
  return reaped_;
}

absl::Status WorkerProcess::Stop() {
  if (reaped_) return stop_status_;
  std::string how = common::StopProcess(pid_, options_.stop_grace_ms);
  reaped_ = true;
  stop_status_ = how.empty() ? absl::OkStatus()
                             : absl::AbortedError(absl::StrCat("worker ", client_->target(),
                                                               " (pid ", pid_, ") ", how));
  return stop_status_;
}

void WorkerProcess::Kill() {
  if (reaped_) return;
  ::kill(pid_, SIGKILL);
  std::string how;
  Reap(/*timeout_ms=*/60'000, &how);
  stop_status_ = absl::AbortedError(
      absl::StrCat("worker ", client_->target(), " (pid ", pid_, ") was killed"));
}

bool WorkerProcess::Running() {
  std::string how;
  return !Reap(0, &how);
}

}  // namespace ts::worker
