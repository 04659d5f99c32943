#include "sidecar/cli/artifact_client.h"

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sidecar/cli/rpc.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

// Cancels a call when it stays silent for `idle`: Touch() on every message.
class IdleWatchdog {
 public:
  IdleWatchdog(grpc::ClientContext* context, absl::Duration idle)
      : context_(context), idle_(idle), last_(absl::Now()), thread_([this] { Run(); }) {}
  ~IdleWatchdog() {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    thread_.join();
  }
  void Touch() {
    absl::MutexLock lock(&mu_);
    last_ = absl::Now();
  }
  bool fired() {
    absl::MutexLock lock(&mu_);
    return fired_;
  }

 private:
  void Run() {
    absl::MutexLock lock(&mu_);
    while (!stopped_) {
      absl::Time deadline = last_ + idle_;
      if (mu_.AwaitWithDeadline(absl::Condition(&stopped_), deadline)) return;
      if (absl::Now() >= last_ + idle_) {
        fired_ = true;
        context_->TryCancel();
        return;
      }
    }
  }

  grpc::ClientContext* const context_;
  const absl::Duration idle_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

template <typename Start>
absl::StatusOr<pb::ArtifactProgress> ReadProgress(
    int64_t idle_ms, const Start& start, const ArtifactClient::ProgressCallback& progress) {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<pb::ArtifactProgress>> reader = start(&context);
  pb::ArtifactProgress message;
  pb::ArtifactProgress final_message;
  bool got_final = false;
  grpc::Status status;
  bool silent = false;
  {
    IdleWatchdog watchdog(&context, absl::Milliseconds(idle_ms));
    while (reader->Read(&message)) {
      watchdog.Touch();
      if (progress) progress(message);
      if (message.done()) {
        final_message = message;
        got_final = true;
      }
    }
    status = reader->Finish();
    silent = watchdog.fired();
  }
  if (silent) {
    return absl::DeadlineExceededError(
        absl::StrCat("no progress for ", idle_ms, " ms (--timeout-ms); the call was cancelled"));
  }
  if (!status.ok()) return FromGrpcStatus(status);
  if (!got_final) return absl::InternalError("the stream ended without a final progress message");
  return final_message;
}

}  // namespace

ArtifactClient::ArtifactClient(std::string target, int64_t timeout_ms)
    : target_(std::move(target)),
      timeout_ms_(timeout_ms),
      stub_(pb::ArtifactOperator::NewStub(NewChannel(target_))) {}

absl::StatusOr<pb::ArtifactProgress> ArtifactClient::Publish(
    const pb::PublishArtifactRequest& request, const ProgressCallback& progress) {
  return ReadProgress(
      timeout_ms_, [&](grpc::ClientContext* context) { return stub_->Publish(context, request); },
      progress);
}

absl::StatusOr<pb::ArtifactProgress> ArtifactClient::Fetch(const pb::FetchArtifactRequest& request,
                                                           const ProgressCallback& progress) {
  return ReadProgress(
      timeout_ms_, [&](grpc::ClientContext* context) { return stub_->Fetch(context, request); },
      progress);
}

absl::StatusOr<pb::ListArtifactsResponse> ArtifactClient::List(uint64_t shard_id,
                                                               bool include_incomplete) {
  pb::ListLocalArtifactsRequest request;
  request.set_shard_id(shard_id);
  request.set_include_incomplete(include_incomplete);
  return CallWithDeadline<pb::ListArtifactsResponse>(
      timeout_ms_,
      [&](auto* context, auto* response) { return stub_->List(context, request, response); });
}

absl::StatusOr<pb::VerifyArtifactsResponse> ArtifactClient::Verify(uint64_t shard_id) {
  pb::VerifyArtifactsRequest request;
  request.set_shard_id(shard_id);
  return CallWithDeadline<pb::VerifyArtifactsResponse>(
      timeout_ms_,
      [&](auto* context, auto* response) { return stub_->Verify(context, request, response); });
}

absl::StatusOr<pb::GcArtifactsResponse> ArtifactClient::Gc(const pb::GcArtifactsRequest& request) {
  return CallWithDeadline<pb::GcArtifactsResponse>(timeout_ms_, [&](auto* context, auto* response) {
    return stub_->Gc(context, request, response);
  });
}

}  // namespace ts::sidecar
