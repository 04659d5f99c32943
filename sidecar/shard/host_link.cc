#include "sidecar/shard/host_link.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "proto/grpc_status.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

constexpr int kMaxHostMessageBytes = 16 << 20;

void SetDeadline(grpc::ClientContext* context, int64_t timeout_ms) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// Reads a progress stream to its end. A watcher cancels the call once `cancelled` says so or
// once the host has sent nothing for kHostSilenceMaxMs; the last message is returned when the
// call ends OK with it marked done.
absl::StatusOr<pb::ArtifactProgress> ReadProgress(
    const char* what, grpc::ClientContext* context,
    grpc::ClientReaderInterface<pb::ArtifactProgress>* reader,
    const std::function<bool()>& cancelled) {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::atomic<int64_t> last_message_ms{0};
  std::atomic<bool> silent{false};
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  last_message_ms = now_ms();
  std::thread watcher([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!finished) {
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (finished) break;
      if (cancelled && cancelled()) {
        context->TryCancel();
        break;
      }
      if (now_ms() - last_message_ms.load() > kHostSilenceMaxMs) {
        silent = true;
        context->TryCancel();
        break;
      }
    }
  });
  pb::ArtifactProgress message, last;
  while (reader->Read(&message)) {
    last_message_ms = now_ms();
    last = message;
  }
  grpc::Status status = reader->Finish();
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_all();
  watcher.join();
  if (silent) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": the host sent nothing for ",
                                                    kHostSilenceMaxMs, " ms; call cancelled"));
  }
  if (!status.ok()) return FromGrpcStatus(status, what);
  if (!last.done()) {
    return absl::InternalError(absl::StrCat(what, ": the host ended the call before it was done"));
  }
  return last;
}

// The host runs a few publish and fetch calls at once (its operator's and every shard
// process's together) and answers RESOURCE_EXHAUSTED to more: such a call is tried again, with
// backoff, for up to kHostBusyWaitMs, unless `cancelled` says to stop.
absl::StatusOr<pb::ArtifactProgress> WhileHostBusy(
    const std::function<bool()>& cancelled,
    const std::function<absl::StatusOr<pb::ArtifactProgress>()>& call) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kHostBusyWaitMs);
  int64_t pause_ms = 50;
  while (true) {
    absl::StatusOr<pb::ArtifactProgress> result = call();
    if (!absl::IsResourceExhausted(result.status()) ||
        std::chrono::steady_clock::now() + std::chrono::milliseconds(pause_ms) > deadline ||
        (cancelled && cancelled())) {
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    pause_ms = std::min<int64_t>(pause_ms * 2, 2'000);
  }
}

}  // namespace

HostLink::HostLink(const std::string& socket_path) : target_(absl::StrCat("unix:", socket_path)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxHostMessageBytes);
  auto channel = grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
  artifacts_ = pb::ArtifactOperator::NewStub(channel);
  host_ = pb::HostOperator::NewStub(channel);
}

HostLink::~HostLink() = default;

absl::StatusOr<std::string> HostLink::Publish(uint64_t shard_id, const std::string& source_dir,
                                              std::string_view kind, uint64_t round) {
  pb::PublishArtifactRequest request;
  request.set_shard_id(shard_id);
  request.set_source_dir(source_dir);
  request.set_kind(std::string(kind));
  request.set_round(round);
  auto last = WhileHostBusy(nullptr, [&]() -> absl::StatusOr<pb::ArtifactProgress> {
    grpc::ClientContext context;
    SetDeadline(&context, kHostTransferTimeoutMs);
    auto reader = artifacts_->Publish(&context, request);
    return ReadProgress("ArtifactOperator/Publish", &context, reader.get(), nullptr);
  });
  if (!last.ok()) return last.status();
  if (last->artifact_id().size() != 32) {
    return absl::InternalError(absl::StrCat("ArtifactOperator/Publish: the host answered an id of ",
                                            last->artifact_id().size(), " bytes, want 32"));
  }
  return last->artifact_id();
}

absl::StatusOr<pb::ArtifactProgress> HostLink::Fetch(uint64_t shard_id,
                                                     const std::string& artifact_id,
                                                     const std::vector<std::string>& peers,
                                                     const std::function<bool()>& cancelled) {
  pb::FetchArtifactRequest request;
  request.set_shard_id(shard_id);
  request.set_artifact_id(artifact_id);
  for (const std::string& peer : peers) request.add_peers(peer);
  return WhileHostBusy(cancelled, [&]() -> absl::StatusOr<pb::ArtifactProgress> {
    grpc::ClientContext context;
    SetDeadline(&context, kHostTransferTimeoutMs);
    auto reader = artifacts_->Fetch(&context, request);
    return ReadProgress("ArtifactOperator/Fetch", &context, reader.get(), cancelled);
  });
}

absl::Status HostLink::Export(uint64_t shard_id, const std::string& artifact_id,
                              const std::string& out_dir) {
  pb::ExportArtifactRequest request;
  request.set_shard_id(shard_id);
  request.set_artifact_id(artifact_id);
  request.set_out_dir(out_dir);
  pb::ArtifactProgress response;
  grpc::ClientContext context;
  SetDeadline(&context, kHostTransferTimeoutMs);
  return FromGrpcStatus(artifacts_->Export(&context, request, &response),
                        "ArtifactOperator/Export");
}

absl::StatusOr<std::vector<pb::ArtifactSummary>> HostLink::List(uint64_t shard_id) {
  pb::ListLocalArtifactsRequest request;
  request.set_shard_id(shard_id);
  pb::ListArtifactsResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kHostCallTimeoutMs);
  grpc::Status status = artifacts_->List(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status, "ArtifactOperator/List");
  std::vector<pb::ArtifactSummary> out;
  for (const pb::ArtifactSummary& a : response.artifacts()) {
    if (a.complete()) out.push_back(a);
  }
  return out;
}

absl::StatusOr<pb::FindArtifactsResponse> HostLink::Find(uint64_t shard_id, std::string_view kind) {
  pb::FindArtifactsRequest request;
  request.set_shard_id(shard_id);
  request.set_kind(std::string(kind));
  pb::FindArtifactsResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kHostCallTimeoutMs);
  grpc::Status status = artifacts_->Find(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status, "ArtifactOperator/Find");
  return response;
}

absl::Status HostLink::Drop(uint64_t shard_id, const std::vector<std::string>& artifact_ids) {
  pb::GcArtifactsRequest request;
  request.set_shard_id(shard_id);
  for (const std::string& id : artifact_ids) request.add_drop_artifacts(id);
  pb::GcArtifactsResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kHostCallTimeoutMs);
  return FromGrpcStatus(artifacts_->Gc(&context, request, &response), "ArtifactOperator/Gc");
}

absl::StatusOr<pb::SettlementSignature> HostLink::SignSettlement(const pb::Settlement& draft) {
  pb::SignSettlementRequest request;
  *request.mutable_draft() = draft;
  pb::SignSettlementResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kHostCallTimeoutMs);
  grpc::Status status = host_->SignSettlement(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status, "HostOperator/SignSettlement");
  return response.signature();
}

absl::StatusOr<std::string> HostLink::SubmitSettlement(
    const pb::Settlement& settlement, const std::vector<pb::SettlementSignature>& signatures) {
  pb::SubmitSettlementRequest request;
  *request.mutable_settlement() = settlement;
  for (const auto& s : signatures) *request.add_signatures() = s;
  pb::SubmitSettlementResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, kHostSubmitTimeoutMs);
  grpc::Status status = host_->SubmitSettlement(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status, "HostOperator/SubmitSettlement");
  if (response.code() != 0) {
    return absl::FailedPreconditionError(absl::StrCat("the chain refused the settlement (code ",
                                                      response.code(), "): ", response.raw_log()));
  }
  return response.txhash();
}

}  // namespace ts::sidecar
