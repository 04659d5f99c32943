#include "sidecar/host/operator_service.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/process.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/grpc_status.h"

namespace ts::sidecar {
namespace {

grpc::Status ToGrpc(const absl::Status& status) { return ToGrpcStatus(status); }

// What differs between the settlement the records imply and a draft, in protobuf's words (the
// first differences, cut); empty if they are equal.
std::string SettlementDifference(const pb::Settlement& expected, const pb::Settlement& draft) {
  constexpr size_t kShownMax = 400;
  std::string report;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  if (differencer.Compare(expected, draft)) return "";
  // Bytes are shown escaped by protobuf; one line per difference.
  absl::StrReplaceAll({{"\n", "; "}}, &report);
  while (!report.empty() && (report.back() == ' ' || report.back() == ';')) report.pop_back();
  if (report.size() > kShownMax) report = report.substr(0, kShownMax) + "...";
  return report.empty() ? "they differ" : report;
}

}  // namespace

absl::Time HandlerDeadline(const grpc::ServerContext& context) {
  absl::Time cap = absl::Now() + kMaxHandlerDeadline;
  auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return cap;
  return std::min(cap, absl::FromChrono(deadline));
}

HostOperatorService::HostOperatorService(
    HostCore* core, HostDaemon* daemon, std::string version, SettlementRecords* records,
    std::function<std::vector<pb::RunStartStatus>()> run_starts)
    : core_(core),
      daemon_(daemon),
      version_(std::move(version)),
      records_(records),
      run_starts_(std::move(run_starts)) {}

grpc::Status HostOperatorService::Status(grpc::ServerContext*, const pb::HostStatusRequest*,
                                         pb::HostStatusResponse* response) {
  HostStatusSnapshot s = daemon_->Snapshot();
  // The cursor and counters are read fresh: the store is the truth, the snapshot may lag a poll.
  // While the records cannot be read (closed after a write error), the snapshot's values stand
  // in, and records_error says why.
  auto cursor = core_->store().CursorHeight();
  auto processed = core_->store().EventsProcessed();
  auto pending = core_->store().ListPendingTxs();
  const int64_t cursor_height = cursor.ok() ? *cursor : s.cursor_height;
  response->set_address(core_->address());
  response->set_chain_id(s.chain_id);
  response->set_cursor_height(cursor_height);
  response->set_chain_height(std::max(s.chain_height, cursor_height));
  response->set_pending_txs(pending.ok() ? static_cast<uint32_t>(pending->size()) : s.pending_txs);
  response->set_events_processed(processed.ok() ? *processed : s.events_processed);
  response->set_current_weight(s.current_weight);
  response->set_version(version_);
  response->set_follower_error(s.last_error);
  response->set_follower_error_since_unix_ms(s.last_error_since_unix_ms);
  const state::DbHealth health = core_->shared_db()->Health();
  response->set_records_path(core_->shared_db()->path());
  response->set_records_error(std::string(health.error.message()));
  response->set_records_error_since_unix_ms(health.since_unix_ms);
  response->set_records_recoveries(health.recoveries);
  if (run_starts_) {
    for (pb::RunStartStatus& r : run_starts_()) *response->add_run_starts() = std::move(r);
  }
  return grpc::Status::OK;
}

grpc::Status HostOperatorService::ListShards(grpc::ServerContext*, const pb::ListShardsRequest*,
                                             pb::ListShardsResponse* response) {
  auto shards = core_->store().ListShards(kMaxListShards);
  if (!shards.ok()) return ToGrpc(shards.status());
  for (auto& s : *shards) *response->add_shards() = std::move(s);
  return grpc::Status::OK;
}

grpc::Status HostOperatorService::ListEvents(grpc::ServerContext*,
                                             const pb::ListEventsRequest* request,
                                             pb::ListEventsResponse* response) {
  if (request->from_height() < 0) {
    return ToGrpc(absl::InvalidArgumentError(
        absl::StrCat("from_height: ", request->from_height(), " is negative")));
  }
  uint32_t limit = request->limit() == 0 ? kDefaultListEventsLimit
                                         : std::min(request->limit(), kMaxListEventsLimit);
  auto events = core_->store().ListEvents(request->from_height(), limit);
  if (!events.ok()) return ToGrpc(events.status());
  for (auto& e : *events) *response->add_events() = std::move(e);
  return grpc::Status::OK;
}

grpc::Status HostOperatorService::Reserve(grpc::ServerContext* context,
                                          const pb::ReserveRequest* request,
                                          pb::ReserveResponse* response) {
  if (request->shard_id() == 0) {
    return ToGrpc(absl::InvalidArgumentError("shard_id: 0 is not a shard id"));
  }
  // The command may outlive this handler if the deadline passes while it runs, so it owns
  // what it writes.
  auto result = std::make_shared<absl::StatusOr<std::string>>(absl::UnknownError("not run"));
  uint64_t shard_id = request->shard_id();
  absl::Status ran =
      daemon_->Run([shard_id, result](HostCore& core) { *result = core.Reserve(shard_id); },
                   HandlerDeadline(*context));
  if (!ran.ok()) return ToGrpc(ran);
  if (!result->ok()) return ToGrpc(result->status());
  response->set_txhash(**result);
  return grpc::Status::OK;
}

grpc::Status HostOperatorService::SignSettlement(grpc::ServerContext* context,
                                                 const pb::SignSettlementRequest* request,
                                                 pb::SignSettlementResponse* response) {
  if (!request->has_draft()) {
    return ToGrpc(absl::InvalidArgumentError("draft: missing"));
  }
  // Only the draft this host's own certified records imply is signed: a signature is a host's
  // word that the result is what it trained, and one signature per shard is all it gives
  // (HostCore::SignSettlement), so a draft from anyone else must not be able to take it. Asked
  // here, on the gRPC thread, so a slow shard process never holds up the owner thread.
  if (records_ == nullptr) {
    return ToGrpc(absl::FailedPreconditionError(
        absl::StrCat("shard ", request->draft().shard_id(),
                     ": this host keeps no training records, so it signs no settlement")));
  }
  // Of the rounds the draft settles: fewer than the run's when it reached its deadline first.
  auto expected = records_->CertifiedDraft(
      request->draft().shard_id(), request->draft().rounds_completed(), HandlerDeadline(*context));
  if (!expected.ok()) return ToGrpc(expected.status());
  if (std::string difference = SettlementDifference(*expected, request->draft());
      !difference.empty()) {
    return ToGrpc(absl::FailedPreconditionError(
        absl::StrCat("draft: differs from the settlement this host's certified records imply (",
                     difference, "); it signs only that one")));
  }
  // As in Reserve, the command owns its copies.
  auto draft = std::make_shared<pb::Settlement>(request->draft());
  auto result =
      std::make_shared<absl::StatusOr<pb::SettlementSignature>>(absl::UnknownError("not run"));
  absl::Status ran =
      daemon_->Run([draft, result](HostCore& core) { *result = core.SignSettlement(*draft); },
                   HandlerDeadline(*context));
  if (!ran.ok()) return ToGrpc(ran);
  if (!result->ok()) return ToGrpc(result->status());
  *response->mutable_signature() = **result;
  return grpc::Status::OK;
}

grpc::Status HostOperatorService::SubmitSettlement(grpc::ServerContext*,
                                                   const pb::SubmitSettlementRequest* request,
                                                   pb::SubmitSettlementResponse* response) {
  if (!request->has_settlement()) {
    return ToGrpc(absl::InvalidArgumentError("settlement: missing"));
  }
  std::vector<pb::SettlementSignature> signatures(request->signatures().begin(),
                                                  request->signatures().end());
  // Runs on this gRPC thread: it changes no host records, and waiting for inclusion must not
  // hold up the follower. The chain client's own deadlines bound it.
  auto tx = core_->SubmitSettlement(request->settlement(), signatures);
  if (!tx.ok()) return ToGrpc(tx.status());
  response->set_txhash(tx->txhash());
  response->set_code(tx->code());
  response->set_raw_log(tx->raw_log());
  return grpc::Status::OK;
}

SettlementQueryService::SettlementQueryService(const HostCore* core) : core_(core) {}

grpc::Status SettlementQueryService::GetSettlement(grpc::ServerContext*,
                                                   const pb::GetSettlementRequest* request,
                                                   pb::GetSettlementResponse* response) {
  auto draft = core_->store().GetSettlementDraft(request->shard_id());
  if (absl::IsNotFound(draft.status())) {
    return ToGrpc(absl::NotFoundError(
        absl::StrCat("this host signed no settlement for shard ", request->shard_id())));
  }
  if (!draft.ok()) return ToGrpc(draft.status());
  *response = *std::move(draft);
  return grpc::Status::OK;
}

void OperatorServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (query_server != nullptr) query_server->Shutdown(deadline);
  if (server != nullptr) server->Shutdown(deadline);
}

absl::StatusOr<OperatorServer> StartOperatorServer(HostCore* core, HostDaemon* daemon,
                                                   OperatorServerOptions options) {
  const std::string& socket_path = options.socket_path;
  if (socket_path.empty() || socket_path.front() != '/' ||
      socket_path.size() > common::kUnixSocketPathMax) {
    return absl::InvalidArgumentError(absl::StrCat("operator socket: \"", socket_path,
                                                   "\" must be an absolute path of 1..",
                                                   common::kUnixSocketPathMax, " bytes"));
  }
  OperatorServer out;
  out.operator_service = std::make_unique<HostOperatorService>(
      core, daemon, std::move(options.version), options.records, std::move(options.run_starts));
  out.settlement_service = std::make_unique<SettlementQueryService>(core);

  // The operator API: the Unix socket alone. Created under the process's umask (trainshardd
  // runs with 077, so the socket is 0600 from the moment it exists) and set to 0600 after,
  // whatever the umask was.
  ::unlink(socket_path.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", socket_path), grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(kMaxOperatorMessageBytes);
  builder.RegisterService(out.operator_service.get());
  builder.RegisterService(out.settlement_service.get());
  for (grpc::Service* service : options.extra_services) builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr) {
    return absl::UnavailableError(absl::StrCat("operator socket: cannot serve on ", socket_path));
  }
  struct stat st = {};
  if (::chmod(socket_path.c_str(), 0600) != 0 || ::lstat(socket_path.c_str(), &st) != 0 ||
      !S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    out.server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("operator socket: cannot make ", socket_path, " owner-only (mode 0600)"));
  }
  out.address = absl::StrCat("unix:", socket_path);

  if (!options.query_listen.empty()) {
    grpc::ServerBuilder query;
    int port = 0;
    query.AddListeningPort(options.query_listen, grpc::InsecureServerCredentials(), &port);
    query.SetMaxReceiveMessageSize(kMaxQueryMessageBytes);
    query.RegisterService(out.settlement_service.get());
    out.query_server = query.BuildAndStart();
    if (out.query_server == nullptr || port == 0) {
      out.server->Shutdown();
      return absl::UnavailableError(absl::StrCat("listen: cannot bind ", options.query_listen));
    }
    out.query_address =
        absl::StrCat(options.query_listen.substr(0, options.query_listen.rfind(':')), ":", port);
  }
  return out;
}

}  // namespace ts::sidecar
