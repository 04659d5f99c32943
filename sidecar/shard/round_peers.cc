#include "sidecar/shard/round_peers.h"

#include <chrono>
#include <functional>
#include <map>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gonka/trainshard/v1/training.grpc.pb.h"
#include "proto/grpc_status.h"
#include "sidecar/peer/peer_tls.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

// Reconnect backoff of the channels to other members (see StubFor).
constexpr int kReconnectBackoffMinMs = 100;
constexpr int kReconnectBackoffMaxMs = 1000;
constexpr int kReceiveBytesMax = 16 << 20;

class GrpcRoundPeers final : public RoundPeers {
 public:
  explicit GrpcRoundPeers(std::function<std::string(const std::string&)> pinned)
      : pinned_(std::move(pinned)) {}

  absl::StatusOr<pb::AnnounceResponse> Announce(const std::string& endpoint,
                                                const pb::AnnounceRequest& request,
                                                int64_t timeout_ms) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    pb::AnnounceResponse response;
    grpc::Status rpc = StubFor(endpoint)->Announce(&context, request, &response);
    if (!rpc.ok()) return FromGrpcStatus(rpc, absl::StrCat("Announce ", endpoint));
    return response;
  }

  absl::StatusOr<pb::GetCertificatesResponse> GetCertificates(
      const std::string& endpoint, const pb::GetCertificatesRequest& request,
      int64_t timeout_ms) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    pb::GetCertificatesResponse response;
    grpc::Status rpc = StubFor(endpoint)->GetCertificates(&context, request, &response);
    if (!rpc.ok()) return FromGrpcStatus(rpc, absl::StrCat("GetCertificates ", endpoint));
    return response;
  }

  std::jthread AnnounceInBackground(std::vector<std::pair<std::string, pb::AnnounceRequest>> sends,
                                    int64_t timeout_ms) override {
    return std::jthread([this, sends = std::move(sends), timeout_ms] {
      for (const auto& [endpoint, request] : sends) (void)Announce(endpoint, request, timeout_ms);
    });
  }

 private:
  pb::ShardRound::Stub* StubFor(const std::string& endpoint) {
    absl::MutexLock lock(&mu_);
    auto it = stubs_.find(endpoint);
    if (it != stubs_.end()) return it->second.get();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kReceiveBytesMax);
    // A member that died and came back must be reachable again within a poll or two: gRPC's
    // default reconnect backoff grows to minutes while it is down, and a channel in backoff fails
    // every call at once, so a restarted planner would be skipped round after round.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kReconnectBackoffMinMs);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMinMs);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kReconnectBackoffMaxMs);
    auto channel = grpc::CreateCustomChannel(
        endpoint, PeerChannelCredentials(pinned_ ? pinned_(endpoint) : std::string()), args);
    auto stub = pb::ShardRound::NewStub(channel);
    auto* raw = stub.get();
    stubs_.emplace(endpoint, std::move(stub));
    return raw;
  }

  const std::function<std::string(const std::string&)> pinned_;
  absl::Mutex mu_;
  // Stubs are never removed, so a pointer handed out stays valid for the object's life.
  std::map<std::string, std::unique_ptr<pb::ShardRound::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<RoundPeers> MakeGrpcRoundPeers(
    std::function<std::string(const std::string& endpoint)> pinned) {
  return std::make_unique<GrpcRoundPeers>(std::move(pinned));
}

}  // namespace ts::sidecar
