#include "sidecar/host/shard_processes.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/process.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/shard/shard_db.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

constexpr std::string_view kComponent = "trainshardd";
constexpr int kMaxForwardMessageBytes = 16 << 20;
constexpr int64_t kSupervisePeriodMs = 100;
constexpr int64_t kStartCallTimeoutMs = 60'000;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

grpc::Status Grpc(const absl::Status& status) { return ToGrpcStatus(status); }

// The caller's deadline, but no later than `cap_ms` from now.
void SetForwardDeadline(const grpc::ServerContext& from, int64_t cap_ms, grpc::ClientContext* to) {
  auto cap = std::chrono::system_clock::now() + std::chrono::milliseconds(cap_ms);
  to->set_deadline(std::min(from.deadline(), cap));
}

}  // namespace

ShardProcesses::ShardProcesses(state::Db* db, ShardProcessOptions options)
    : db_(db), options_(std::move(options)) {}

ShardProcesses::~ShardProcesses() { StopAll(); }

std::string ShardProcesses::SocketPath(uint64_t shard_id) const {
  return common::UnixSocketPathOr(
      absl::StrCat(options_.shards_dir, "/", shard_id, "/shard.sock"),
      absl::StrCat(options_.fallback_socket_dir, "/ts-shard-", ::getpid(), "-", shard_id, ".sock"));
}

void ShardProcesses::MoveRunRecords() {
  std::vector<std::pair<uint64_t, std::string>> specs;
  (void)db_->Scan(kTableRunSpecs, "", [&](std::string_view key, std::string_view value) {
    specs.emplace_back(state::DecodeU64Key(key), std::string(value));
    return true;
  });
  for (const auto& [shard_id, spec] : specs) {
    const std::string prefix = state::EncodeU64Key(shard_id);
    state::WriteBatch moved;
    state::WriteBatch removed;
    moved.Put(kTableRunSpecs, prefix, spec);
    removed.Delete(kTableRunSpecs, prefix);
    size_t rounds = 0;
    (void)db_->Scan(kTableRounds, prefix, [&](std::string_view key, std::string_view value) {
      moved.Put(kTableRounds, key, value);
      removed.Delete(kTableRounds, key);
      ++rounds;
      return true;
    });
    removed.Put(kTableShardProcesses, prefix, "");
    // Into the shard's database first (durable), then out of the host's: a crash in between
    // leaves both copies, and the next start writes the same rows again.
    const std::string dir = absl::StrCat(options_.shards_dir, "/", shard_id);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    absl::Status status =
        ec ? absl::InternalError(absl::StrCat(dir, ": ", ec.message())) : absl::OkStatus();
    if (status.ok()) {
      auto shard_db = state::Db::Open(dir + "/state", ShardDbOptions());
      status = shard_db.ok() ? (*shard_db)->Write(moved) : shard_db.status();
    }
    if (status.ok()) status = db_->Write(removed);
    common::Log(status.ok() ? common::LogLevel::kInfo : common::LogLevel::kError, kComponent,
                "run records moved into the shard's database",
                {{"shard", absl::StrCat(shard_id)},
                 {"rounds", absl::StrCat(rounds)},
                 {"error", std::string(status.message())}});
  }
}

void ShardProcesses::Activate(const std::string& chain_id) {
  {
    absl::MutexLock lock(&mu_);
    if (!chain_id_.empty() || stopping_) return;
  }
  MoveRunRecords();
  std::vector<std::pair<uint64_t, std::string>> recorded;
  (void)db_->Scan(kTableShardProcesses, "", [&](std::string_view key, std::string_view value) {
    recorded.emplace_back(state::DecodeU64Key(key), std::string(value));
    return true;
  });
  absl::MutexLock lock(&mu_);
  if (!chain_id_.empty() || stopping_) return;
  chain_id_ = chain_id;
  for (const auto& [id, final_status] : recorded) {
    Child& child = children_[id];
    child.finished = !final_status.empty();
    child.final_status = final_status;
  }
  supervisor_ = std::thread([this] { Loop(); });
}

void ShardProcesses::StopAll() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (supervisor_.joinable()) supervisor_.join();
}

void ShardProcesses::Loop() {
  int64_t last_poll_ms = NowMs();
  while (true) {
    if (options_.idle_stop_ms > 0 && NowMs() - last_poll_ms >= options_.status_poll_ms) {
      PollRuns();
      last_poll_ms = NowMs();
    }
    std::vector<std::pair<uint64_t, pid_t>> to_stop;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(kSupervisePeriodMs));
      if (stopping_) break;
      const int64_t now = NowMs();
      for (auto& [id, child] : children_) {
        if (child.being_stopped) continue;
        if (child.stop || (child.finished && child.pid != 0)) {
          to_stop.emplace_back(id, child.pid);
          child.being_stopped = true;
          child.pid = 0;
          child.operator_stub.reset();
          child.round_stub.reset();
          continue;
        }
        Supervise(id, child, now);
      }
    }
    // Stopped outside the lock (it may take stop_grace_ms); the entry goes afterwards unless a
    // Start took the shard back meanwhile, and then a new process is started for it.
    for (const auto& [id, pid] : to_stop) {
      if (pid != 0) (void)common::StopProcess(pid, options_.stop_grace_ms);
      absl::MutexLock lock(&mu_);
      auto it = children_.find(id);
      if (it == children_.end()) continue;
      it->second.being_stopped = false;
      if (it->second.stop) children_.erase(it);
    }
  }
  // Every process gets its SIGTERM at once; then each is waited for.
  std::vector<std::pair<uint64_t, pid_t>> running;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, child] : children_) {
      if (child.pid != 0) running.emplace_back(id, child.pid);
      child.pid = 0;
      child.operator_stub.reset();
      child.round_stub.reset();
    }
  }
  for (const auto& [id, pid] : running) ::kill(pid, SIGTERM);
  for (const auto& [id, pid] : running) {
    std::string how = common::StopProcess(pid, options_.stop_grace_ms);
    common::Log(how.empty() ? common::LogLevel::kInfo : common::LogLevel::kWarn, kComponent,
                "shard process stopped",
                {{"shard", absl::StrCat(id)}, {"pid", absl::StrCat(pid)}, {"exit", how}});
  }
}

void ShardProcesses::PollRuns() {
  std::vector<std::pair<uint64_t, std::shared_ptr<pb::ShardRunOperator::Stub>>> serving;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, child] : children_) {
      if (!child.stop && !child.finished && !child.being_stopped && child.operator_stub) {
        serving.emplace_back(id, child.operator_stub);
      }
    }
  }
  for (const auto& [id, stub] : serving) {
    grpc::ClientContext call;
    call.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(2'000));
    pb::ShardRunStatusRequest request;
    request.set_shard_id(id);
    pb::ShardRunStatus status;
    const bool done = stub->Status(&call, request, &status).ok() && status.state() == "done";
    const int64_t now = NowMs();
    absl::MutexLock lock(&mu_);
    auto it = children_.find(id);
    if (it == children_.end() || it->second.stop || it->second.finished) continue;
    Child& child = it->second;
    if (!done) {
      child.done_since_ms = 0;
      continue;
    }
    if (child.done_since_ms == 0) child.done_since_ms = now;
    if (now - child.done_since_ms < options_.idle_stop_ms) continue;
    status.set_shard_process_pid(0);
    status.set_shard_process_restarts(child.restarts());
    std::string bytes = status.SerializeAsString();
    state::WriteBatch batch;
    batch.Put(kTableShardProcesses, state::EncodeU64Key(id), bytes);
    if (absl::Status written = db_->Write(batch); !written.ok()) continue;
    child.finished = true;
    child.final_status = std::move(bytes);
    common::Log(common::LogLevel::kInfo, kComponent, "stopping the process of a finished run",
                {{"shard", absl::StrCat(id)}, {"pid", absl::StrCat(child.pid)}});
  }
}

absl::StatusOr<ShardProcesses::Stubs> ShardProcesses::Wake(uint64_t shard_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = children_.find(shard_id);
    if (it != children_.end() && !it->second.stop && it->second.finished) {
      state::WriteBatch batch;
      batch.Put(kTableShardProcesses, state::EncodeU64Key(shard_id), "");
      TS_RETURN_IF_ERROR(db_->Write(batch));
      it->second.finished = false;
      it->second.final_status.clear();
      it->second.done_since_ms = 0;
      common::Log(common::LogLevel::kInfo, kComponent, "starting the process of a finished run",
                  {{"shard", absl::StrCat(shard_id)}});
    }
    auto serving = [this, shard_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = children_.find(shard_id);
      return stopping_ || it == children_.end() || it->second.operator_stub != nullptr;
    };
    mu_.AwaitWithTimeout(absl::Condition(&serving), absl::Milliseconds(options_.start_timeout_ms));
  }
  return Find(shard_id);
}

void ShardProcesses::Supervise(uint64_t shard_id, Child& child, int64_t now_ms) {
  if (child.finished) return;
  const std::string socket = SocketPath(shard_id);
  if (child.pid != 0) {
    std::string how;
    if (common::ReapProcess(child.pid, 0, &how)) {
      child.last_exit = how.empty() ? "exited with code 0" : how;
      child.operator_stub.reset();
      child.round_stub.reset();
      child.backoff_ms = now_ms - child.started_ms >= options_.stable_after_ms
                             ? options_.restart_backoff_min_ms
                             : std::clamp(child.backoff_ms * 2, options_.restart_backoff_min_ms,
                                          options_.restart_backoff_max_ms);
      child.next_start_ms = now_ms + child.backoff_ms;
      common::Log(common::LogLevel::kWarn, kComponent, "shard process exited",
                  {{"shard", absl::StrCat(shard_id)},
                   {"pid", absl::StrCat(child.pid)},
                   {"exit", child.last_exit},
                   {"restart_in_ms", absl::StrCat(child.backoff_ms)}});
      child.pid = 0;
    } else if (child.operator_stub == nullptr) {
      // Starting: connect once its socket exists (a channel that tried earlier would wait out
      // gRPC's reconnect backoff).
      struct stat st {};
      if (::stat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(kMaxForwardMessageBytes);
        args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
        auto channel = grpc::CreateCustomChannel(absl::StrCat("unix:", socket),
                                                 grpc::InsecureChannelCredentials(), args);
        child.operator_stub = pb::ShardRunOperator::NewStub(channel);
        child.round_stub = pb::ShardRound::NewStub(channel);
      }
    }
    return;
  }
  if (now_ms < child.next_start_ms) return;
  common::SpawnOptions spawn;
  spawn.death_signal = SIGKILL;
  spawn.args = {options_.binary,
                "--shard-id",
                absl::StrCat(shard_id),
                "--shards-dir",
                options_.shards_dir,
                "--socket",
                socket,
                "--host-socket",
                options_.host_socket,
                "--key-file",
                options_.key_file,
                "--chain",
                options_.chain_endpoint,
                "--chain-id",
                chain_id_,
                "--chain-profile",
                options_.chain_profile,
                "--worker-binary",
                options_.worker_binary,
                "--worker-threads",
                absl::StrCat(options_.worker_threads),
                "--worker-device",
                options_.worker_device,
                "--worker-memory-bytes-max",
                absl::StrCat(options_.worker_memory_bytes_max),
                "--collective-host",
                options_.collective_host,
                "--log-level",
                options_.log_level};
  if (options_.peer_tls) {
    spawn.args.insert(spawn.args.end(), {"--peer-tls", "--tls-dir", options_.tls_dir});
  }
  // The path belongs to the new process: one left by a killed process is not mistaken for it.
  ::unlink(socket.c_str());
  auto pid = common::SpawnProcess(spawn);
  child.started_ms = now_ms;
  if (!pid.ok()) {
    child.backoff_ms = options_.restart_backoff_max_ms;
    child.next_start_ms = now_ms + child.backoff_ms;
    child.last_exit = absl::StrCat("not started: ", pid.status().message());
    common::Log(common::LogLevel::kError, kComponent, "cannot start a shard process",
                {{"shard", absl::StrCat(shard_id)}, {"error", child.last_exit}});
    return;
  }
  child.pid = *pid;
  ++child.starts;
  common::Log(common::LogLevel::kInfo, kComponent, "shard process started",
              {{"shard", absl::StrCat(shard_id)},
               {"pid", absl::StrCat(child.pid)},
               {"starts", absl::StrCat(child.starts)}});
}

std::optional<ShardProcesses::ProcessInfo> ShardProcesses::Info(uint64_t shard_id) const {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(shard_id);
  if (it == children_.end() || it->second.stop) return std::nullopt;
  const Child& child = it->second;
  ProcessInfo info;
  info.pid = child.pid;
  info.serving = child.operator_stub != nullptr;
  info.restarts = child.restarts();
  info.last_exit = child.last_exit;
  info.finished = child.finished;
  return info;
}

absl::StatusOr<ShardProcesses::Stubs> ShardProcesses::Find(uint64_t shard_id) const {
  absl::MutexLock lock(&mu_);
  auto it = children_.find(shard_id);
  if (it == children_.end() || it->second.stop) {
    return absl::NotFoundError(absl::StrCat("shard ", shard_id, ": no run on this host"));
  }
  const Child& child = it->second;
  if (child.operator_stub == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", shard_id, ": its shard process is starting",
        child.last_exit.empty() ? "" : absl::StrCat(" (the last one ", child.last_exit, ")")));
  }
  Stubs stubs;
  stubs.operator_stub = child.operator_stub;
  stubs.round_stub = child.round_stub;
  stubs.pid = child.pid;
  stubs.restarts = child.restarts();
  return stubs;
}

grpc::Status ShardProcesses::Start(grpc::ServerContext* context,
                                   const pb::StartShardRunRequest* request,
                                   pb::StartShardRunResponse* response) {
  const uint64_t shard_id = request->shard_id();
  if (shard_id == 0) return Grpc(absl::InvalidArgumentError("shard_id: 0 is no shard"));
  bool had_process = false;
  {
    absl::MutexLock lock(&mu_);
    if (chain_id_.empty())
      return Grpc(absl::UnavailableError("the host has not reached the chain yet"));
    if (stopping_) return Grpc(absl::UnavailableError("the host is stopping"));
    auto it = children_.find(shard_id);
    had_process = it != children_.end() && !it->second.stop;
    if (!had_process) {
      state::WriteBatch batch;
      batch.Put(kTableShardProcesses, state::EncodeU64Key(shard_id), "");
      if (absl::Status written = db_->Write(batch); !written.ok()) return Grpc(written);
      // A shard whose process is being stopped is taken back: its next process starts once
      // the old one is gone (they would share the shard's database and socket).
      children_[shard_id].stop = false;
    }
  }
  auto stubs = Wake(shard_id);
  if (!stubs.ok()) return Grpc(stubs.status());
  grpc::ClientContext call;
  SetForwardDeadline(*context, kStartCallTimeoutMs, &call);
  call.set_wait_for_ready(true);
  grpc::Status status = stubs->operator_stub->Start(&call, *request, response);
  if (!status.ok() && !had_process) {
    // A refused run stores nothing in the process's records: the process goes, with its record.
    state::WriteBatch batch;
    batch.Delete(kTableShardProcesses, state::EncodeU64Key(shard_id));
    (void)db_->Write(batch);
    absl::MutexLock lock(&mu_);
    if (auto it = children_.find(shard_id); it != children_.end()) it->second.stop = true;
  }
  return status;
}

absl::StatusOr<pb::StartShardRunResponse> ShardProcesses::StartRun(uint64_t shard_id,
                                                                   const std::string& run_spec) {
  pb::StartShardRunRequest request;
  request.set_shard_id(shard_id);
  request.set_run_spec(run_spec);
  pb::StartShardRunResponse response;
  grpc::ServerContext context;  // no deadline of its own: Start's caps apply
  grpc::Status status = Start(&context, &request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

grpc::Status ShardProcesses::Status(grpc::ServerContext* context,
                                    const pb::ShardRunStatusRequest* request,
                                    pb::ShardRunStatus* response) {
  {
    absl::MutexLock lock(&mu_);
    auto it = children_.find(request->shard_id());
    if (it != children_.end() && !it->second.stop && it->second.finished &&
        response->ParseFromString(it->second.final_status)) {
      return grpc::Status::OK;
    }
  }
  auto stubs = Find(request->shard_id());
  if (!stubs.ok()) return Grpc(stubs.status());
  grpc::ClientContext call;
  SetForwardDeadline(*context, kForwardTimeoutMs, &call);
  grpc::Status status = stubs->operator_stub->Status(&call, *request, response);
  if (status.ok()) {
    response->set_shard_process_pid(stubs->pid);
    response->set_shard_process_restarts(stubs->restarts);
  }
  return status;
}

grpc::Status ShardProcesses::Evaluate(grpc::ServerContext* context,
                                      const pb::EvaluateCheckpointRequest* request,
                                      pb::EvaluateCheckpointResponse* response) {
  auto stubs = Wake(request->shard_id());
  if (!stubs.ok()) return Grpc(stubs.status());
  // A process just started answers UNAVAILABLE until its run has its worker and data again.
  const auto deadline =
      std::min(context->deadline(),
               std::chrono::system_clock::now() + std::chrono::milliseconds(kEvaluateTimeoutMs));
  while (true) {
    grpc::ClientContext call;
    call.set_deadline(deadline);
    grpc::Status status = stubs->operator_stub->Evaluate(&call, *request, response);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::system_clock::now() + std::chrono::milliseconds(200) >= deadline) {
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

grpc::Status ShardProcesses::DraftSettlement(grpc::ServerContext* context,
                                             const pb::DraftSettlementRequest* request,
                                             pb::DraftSettlementResponse* response) {
  const absl::Time cap = absl::Now() + absl::Milliseconds(kForwardTimeoutMs);
  const absl::Time deadline = context->deadline() == std::chrono::system_clock::time_point::max()
                                  ? cap
                                  : std::min(cap, absl::FromChrono(context->deadline()));
  auto draft = CertifiedDraft(request->shard_id(), request->rounds(), deadline);
  if (!draft.ok()) return Grpc(draft.status());
  *response->mutable_draft() = *std::move(draft);
  return grpc::Status::OK;
}

absl::StatusOr<pb::Settlement> ShardProcesses::CertifiedDraft(uint64_t shard_id, uint64_t rounds,
                                                              absl::Time deadline) {
  auto stubs = Wake(shard_id);
  if (absl::IsNotFound(stubs.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": this host keeps no training records for it"));
  }
  if (!stubs.ok()) return stubs.status();
  pb::DraftSettlementRequest request;
  request.set_shard_id(shard_id);
  request.set_rounds(rounds);
  // A process just started answers UNAVAILABLE until it has its chain id.
  while (true) {
    grpc::ClientContext call;
    call.set_deadline(absl::ToChronoTime(deadline));
    pb::DraftSettlementResponse response;
    grpc::Status status = stubs->operator_stub->DraftSettlement(&call, request, &response);
    if (status.ok()) return std::move(*response.mutable_draft());
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() + absl::Milliseconds(200) >= deadline) {
      return FromGrpcStatus(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// A peer's call goes to the shard's process; a host without one (yet) answers as a run that
// has not started would.
template <typename Request, typename Response, typename Method>
grpc::Status ShardProcesses::ForwardRound(const grpc::ServerContext& context,
                                          const Request& request, Response* response, Method method,
                                          bool wake) {
  auto stubs = wake ? Wake(request.shard_id()) : Find(request.shard_id());
  if (!stubs.ok()) {
    return Grpc(absl::UnavailableError(
        absl::StrCat("shard ", request.shard_id(), ": no run on this host yet")));
  }
  grpc::ClientContext call;
  SetForwardDeadline(context, kForwardTimeoutMs, &call);
  return ((*stubs->round_stub).*method)(&call, request, response);
}

grpc::Status ShardProcesses::Announce(grpc::ServerContext* context,
                                      const pb::AnnounceRequest* request,
                                      pb::AnnounceResponse* response) {
  return ForwardRound(*context, *request, response, &pb::ShardRound::Stub::Announce,
                      /*wake=*/false);
}

grpc::Status ShardProcesses::GetCertificates(grpc::ServerContext* context,
                                             const pb::GetCertificatesRequest* request,
                                             pb::GetCertificatesResponse* response) {
  // A member catching up may ask a host whose run is done: the process is started for it.
  return ForwardRound(*context, *request, response, &pb::ShardRound::Stub::GetCertificates,
                      /*wake=*/true);
}

}  // namespace ts::sidecar
