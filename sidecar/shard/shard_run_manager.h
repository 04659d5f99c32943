// ShardRunManager owns the runs of a shard process (ts_shard, one per host and shard: see
// shard_main.cc), serves ShardRound to peers and ShardRunOperator to the operator (both reach it
// through the host sidecar, which forwards them), and keeps each run spec in the process's
// records so a restarted process resumes its run by itself. It is the gRPC side of the runs:
// each handler checks the request, finds the run and holds it by shared ownership for the call,
// so stopping the runs (StopAll, on SIGTERM) never frees a run under a call in progress.
//
// Thread-safety: thread-safe.
#ifndef TS_SIDECAR_SHARD_SHARD_RUN_MANAGER_H_
#define TS_SIDECAR_SHARD_SHARD_RUN_MANAGER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gonka/trainshard/v1/training.grpc.pb.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/shard/shard_run.h"

namespace ts::sidecar {

class ShardRunManager final : public ::gonka::trainshard::v1::ShardRunOperator::Service,
                              public ::gonka::trainshard::v1::ShardRound::Service {
 public:
  // `host.chain_id` may be empty until Activate; when given, runs may be started at once.
  ShardRunManager(ShardRunHost host, ShardRunOptions options);
  ~ShardRunManager() override;  // stops every run

  // Sets the chain id and resumes the runs whose specs the records hold. Later calls are ignored.
  void Activate(const std::string& chain_id);
  // Stops every run.
  void StopAll();

  // Checks the document (ParseRunSpec, its hash against the chain's run_spec_hash, this host's
  // membership, a shard that is RUNNING), stores it and starts the run.
  absl::StatusOr<::gonka::trainshard::v1::StartShardRunResponse> StartRun(uint64_t shard_id,
                                                                          const std::string& doc);

  grpc::Status Start(grpc::ServerContext* context,
                     const ::gonka::trainshard::v1::StartShardRunRequest* request,
                     ::gonka::trainshard::v1::StartShardRunResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context,
                      const ::gonka::trainshard::v1::ShardRunStatusRequest* request,
                      ::gonka::trainshard::v1::ShardRunStatus* response) override;
  grpc::Status Evaluate(grpc::ServerContext* context,
                        const ::gonka::trainshard::v1::EvaluateCheckpointRequest* request,
                        ::gonka::trainshard::v1::EvaluateCheckpointResponse* response) override;
  // The settlement the stored run spec and certificates imply (whether or not the run is
  // running now). FAILED_PRECONDITION: no run spec stored for the shard, or a round without its
  // certificate; UNAVAILABLE before Activate.
  grpc::Status DraftSettlement(grpc::ServerContext* context,
                               const ::gonka::trainshard::v1::DraftSettlementRequest* request,
                               ::gonka::trainshard::v1::DraftSettlementResponse* response) override;
  grpc::Status Announce(grpc::ServerContext* context,
                        const ::gonka::trainshard::v1::AnnounceRequest* request,
                        ::gonka::trainshard::v1::AnnounceResponse* response) override;
  grpc::Status GetCertificates(grpc::ServerContext* context,
                               const ::gonka::trainshard::v1::GetCertificatesRequest* request,
                               ::gonka::trainshard::v1::GetCertificatesResponse* response) override;

 private:
  // The run, shared: a call holds it while it runs without mu_, so StopAll (or a run replaced)
  // never destroys a run under a call in progress.
  std::shared_ptr<ShardRun> Find(uint64_t shard_id) ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Why the shard has no run here: UNAVAILABLE until Activate has resumed the stored runs,
  // NOT_FOUND after.
  absl::Status NoRun(uint64_t shard_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The draft of rounds 1..`rounds` (0: all the spec's) the stored records imply.
  absl::StatusOr<::gonka::trainshard::v1::Settlement> DraftFromStoredRun(uint64_t shard_id,
                                                                         uint64_t rounds);
  absl::StatusOr<std::string> VerifyPeer(const ::gonka::trainshard::v1::PeerRequestAuth& auth,
                                         std::string_view method, uint64_t shard_id,
                                         const google::protobuf::Message& request);

  ShardRunHost host_;
  const ShardRunOptions options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<ShardRun>> runs_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PeerRequestVerifier> verifier_ ABSL_GUARDED_BY(mu_);
  bool activated_ ABSL_GUARDED_BY(mu_) = false;  // Activate was called
  bool resumed_ ABSL_GUARDED_BY(mu_) = false;    // Activate has resumed the stored runs
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_SHARD_RUN_MANAGER_H_
