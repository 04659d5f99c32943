#include "sidecar/shard/shard_run_manager.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/shard/shard_db.h"
#include "sidecar/shard/verdicts.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr char kComponent[] = "shard_run";
// As the worker's replay_threads: a replay of an announced thread count must be possible.
constexpr uint32_t kWorkerThreadsMax = 1024;

}  // namespace

ShardRunManager::ShardRunManager(ShardRunHost host, ShardRunOptions options)
    : host_(std::move(host)), options_(std::move(options)) {
  // A chain id known from the start (the shard process's --chain-id) takes calls at once: a run
  // started between the socket's first answer and Activate is not refused.
  if (!host_.chain_id.empty()) {
    verifier_ = std::make_unique<PeerRequestVerifier>(host_.address, host_.chain_id, host_.clock);
  }
}

ShardRunManager::~ShardRunManager() { StopAll(); }

void ShardRunManager::StopAll() {
  std::map<uint64_t, std::shared_ptr<ShardRun>> runs;
  {
    absl::MutexLock lock(&mu_);
    runs.swap(runs_);
  }
  for (auto& [id, run] : runs) run->Stop();
}

void ShardRunManager::Activate(const std::string& chain_id) {
  {
    absl::MutexLock lock(&mu_);
    if (activated_) return;
    activated_ = true;
    if (verifier_ == nullptr) {
      host_.chain_id = chain_id;
      verifier_ = std::make_unique<PeerRequestVerifier>(host_.address, chain_id, host_.clock);
    }
  }
  std::vector<std::pair<uint64_t, std::string>> specs;
  (void)host_.db->Scan(kTableRunSpecs, "", [&](std::string_view key, std::string_view value) {
    specs.emplace_back(state::DecodeU64Key(key), std::string(value));
    return true;
  });
  for (const auto& [id, doc] : specs) {
    auto started = StartRun(id, doc);
    common::Log(started.ok() ? common::LogLevel::kInfo : common::LogLevel::kWarn, kComponent,
                "resuming run",
                {{"shard", absl::StrCat(id)}, {"error", std::string(started.status().message())}});
  }
  absl::MutexLock lock(&mu_);
  resumed_ = true;
}

absl::Status ShardRunManager::NoRun(uint64_t shard_id) const {
  // A process serves its socket before it has resumed the runs its records hold: until then a
  // missing run may only be a run not started yet, which a caller should ask again for.
  if (!resumed_) {
    return absl::UnavailableError(
        absl::StrCat("shard ", shard_id, ": the shard process is still resuming its runs"));
  }
  return absl::NotFoundError(absl::StrCat("shard ", shard_id, ": no run on this host"));
}

absl::StatusOr<pb::StartShardRunResponse> ShardRunManager::StartRun(uint64_t shard_id,
                                                                    const std::string& doc) {
  TS_ASSIGN_OR_RETURN(ParsedRunSpec spec, ParseRunSpec(doc));
  pb::StartShardRunResponse response;
  response.set_run_spec_hash(spec.hash);
  {
    absl::MutexLock lock(&mu_);
    if (verifier_ == nullptr) {
      return absl::UnavailableError("the host has not reached the chain yet");
    }
    if (std::shared_ptr<ShardRun> run = Find(shard_id); run != nullptr) {
      if (run->spec_hash() != spec.hash) {
        return absl::AlreadyExistsError(absl::StrCat("shard ", shard_id,
                                                     " already runs another run spec (",
                                                     common::HexEncode(run->spec_hash()), ")"));
      }
      response.set_already_running(true);
      return response;
    }
  }
  TS_ASSIGN_OR_RETURN(pb::Shard shard, host_.chain_shard(shard_id));
  if (shard.spec().run_spec_hash() != spec.hash) {
    return absl::InvalidArgumentError(
        absl::StrCat("run_spec: SHA-256 ", common::HexEncode(spec.hash), " is not shard ", shard_id,
                     "'s run_spec_hash ", common::HexEncode(shard.spec().run_spec_hash())));
  }
  if (shard.status() != pb::SHARD_STATUS_RUNNING && shard.status() != pb::SHARD_STATUS_SETTLED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard_id, " is ", pb::ShardStatus_Name(shard.status()), ", not RUNNING"));
  }
  bool member = false;
  for (const auto& r : shard.reservations()) member |= r.host() == host_.address;
  if (!member) {
    return absl::PermissionDeniedError(
        absl::StrCat("this host (", host_.address, ") is not a member of shard ", shard_id));
  }
  state::WriteBatch batch;
  batch.Put(kTableRunSpecs, state::EncodeU64Key(shard_id), doc);
  TS_RETURN_IF_ERROR(host_.db->Write(batch));
  absl::MutexLock lock(&mu_);
  if (Find(shard_id) == nullptr) {
    runs_[shard_id] = ShardRun::Start(host_, options_, shard_id, std::move(spec));
  }
  return response;
}

std::shared_ptr<ShardRun> ShardRunManager::Find(uint64_t shard_id) {
  auto it = runs_.find(shard_id);
  return it == runs_.end() ? nullptr : it->second;
}

absl::StatusOr<std::string> ShardRunManager::VerifyPeer(const pb::PeerRequestAuth& auth,
                                                        std::string_view method, uint64_t shard_id,
                                                        const google::protobuf::Message& request) {
  PeerRequestVerifier* verifier;
  {
    absl::MutexLock lock(&mu_);
    verifier = verifier_.get();
  }
  if (verifier == nullptr) return absl::UnavailableError("the host has not reached the chain yet");
  // Membership is asked before the nonce is recorded, so requests of hosts outside the shard
  // leave nothing in the verifier (peer_auth.h).
  return verifier->Verify(auth, method, shard_id, RequestBodyBytes(request),
                          [this](uint64_t shard, std::string_view signer) {
                            return host_.directory->CheckMember(shard, signer);
                          });
}

grpc::Status ShardRunManager::Start(grpc::ServerContext*, const pb::StartShardRunRequest* request,
                                    pb::StartShardRunResponse* response) {
  auto started = StartRun(request->shard_id(), request->run_spec());
  if (!started.ok()) return ToGrpcStatus(started.status());
  *response = *started;
  return grpc::Status::OK;
}

grpc::Status ShardRunManager::Status(grpc::ServerContext*, const pb::ShardRunStatusRequest* request,
                                     pb::ShardRunStatus* response) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<ShardRun> run = Find(request->shard_id());
  if (run == nullptr) return ToGrpcStatus(NoRun(request->shard_id()));
  *response = run->Status();
  return grpc::Status::OK;
}

grpc::Status ShardRunManager::Evaluate(grpc::ServerContext*,
                                       const pb::EvaluateCheckpointRequest* request,
                                       pb::EvaluateCheckpointResponse* response) {
  if (request->artifact_id().size() != 32) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("artifact_id: ", request->artifact_id().size(), " bytes, want 32")));
  }
  // Held by shared ownership for the call: StopAll may stop the run meanwhile, never free it.
  std::shared_ptr<ShardRun> run;
  {
    absl::MutexLock lock(&mu_);
    run = Find(request->shard_id());
    if (run == nullptr) return ToGrpcStatus(NoRun(request->shard_id()));
  }
  auto ev = run->EvaluateArtifact(request->artifact_id(), request->windows_max());
  if (!ev.ok()) return ToGrpcStatus(ev.status());
  *response->mutable_evaluation() = *ev;
  return grpc::Status::OK;
}

grpc::Status ShardRunManager::Announce(grpc::ServerContext*, const pb::AnnounceRequest* request,
                                       pb::AnnounceResponse* response) {
  auto signer = VerifyPeer(request->auth(), kAnnounceMethod, request->shard_id(), *request);
  if (!signer.ok()) return ToGrpcStatus(signer.status());
  if (request->collective_endpoint().empty() || request->collective_endpoint().size() > 300) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "collective_endpoint: ", request->collective_endpoint().size(), " bytes, want 1..300")));
  }
  if (request->worker_threads() > kWorkerThreadsMax) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "worker_threads: ", request->worker_threads(), " is more than ", kWorkerThreadsMax)));
  }
  if (!request->verdicts().empty()) {
    // Checked before a planner may carry them: one bad verdict would make its plan refused.
    auto view = host_.directory->Get(request->shard_id());
    if (!view.ok()) return ToGrpcStatus(view.status());
    absl::Status verdicts = CheckVerdicts(host_.chain_id, request->verdicts(), request->round(),
                                          *view, "verdicts", kVerdictsPerAnnounceMax);
    if (!verdicts.ok()) return ToGrpcStatus(verdicts);
    for (const pb::SignedVerdict& v : request->verdicts()) {
      if (v.verdict().validator() != *signer) {
        return ToGrpcStatus(absl::PermissionDeniedError(
            absl::StrCat("verdicts: a verdict of ", v.verdict().validator(), " announced by ",
                         *signer, " (a member announces its own)")));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<ShardRun> run = Find(request->shard_id());
  if (run == nullptr) {
    return ToGrpcStatus(absl::UnavailableError(
        absl::StrCat("shard ", request->shard_id(), ": no run on this host yet")));
  }
  *response = run->OnAnnounce(*signer, *request);
  return grpc::Status::OK;
}

grpc::Status ShardRunManager::GetCertificates(grpc::ServerContext*,
                                              const pb::GetCertificatesRequest* request,
                                              pb::GetCertificatesResponse* response) {
  auto signer = VerifyPeer(request->auth(), kGetCertificatesMethod, request->shard_id(), *request);
  if (!signer.ok()) return ToGrpcStatus(signer.status());
  absl::MutexLock lock(&mu_);
  std::shared_ptr<ShardRun> run = Find(request->shard_id());
  if (run == nullptr) {
    return ToGrpcStatus(absl::UnavailableError(
        absl::StrCat("shard ", request->shard_id(), ": no run on this host yet")));
  }
  auto got = run->OnGetCertificates(*request);
  if (!got.ok()) return ToGrpcStatus(got.status());
  *response = *std::move(got);
  return grpc::Status::OK;
}

grpc::Status ShardRunManager::DraftSettlement(grpc::ServerContext*,
                                              const pb::DraftSettlementRequest* request,
                                              pb::DraftSettlementResponse* response) {
  auto draft = DraftFromStoredRun(request->shard_id(), request->rounds());
  if (!draft.ok()) return ToGrpcStatus(draft.status());
  *response->mutable_draft() = *std::move(draft);
  return grpc::Status::OK;
}

absl::StatusOr<pb::Settlement> ShardRunManager::DraftFromStoredRun(uint64_t shard_id,
                                                                   uint64_t rounds) {
  ShardRunHost host;
  {
    absl::MutexLock lock(&mu_);
    if (verifier_ == nullptr)
      return absl::UnavailableError("the host has not reached the chain yet");
    host = host_;
  }
  auto doc = host.db->Get(kTableRunSpecs, state::EncodeU64Key(shard_id));
  if (absl::IsNotFound(doc.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id, ": this host keeps no training records for it"));
  }
  if (!doc.ok()) return doc.status();
  TS_ASSIGN_OR_RETURN(ParsedRunSpec spec, ParseRunSpec(*doc));
  return DraftFromRecords(host, shard_id, spec.spec, rounds == 0 ? spec.spec.rounds() : rounds);
}

}  // namespace ts::sidecar
