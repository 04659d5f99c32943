// The host sidecar's gRPC services: HostOperator (the CLI's operator API) and SettlementQuery
// (what this host signed, for the chain or anyone). Handlers that change state run on the
// HostDaemon's owner thread; reads go straight to the thread-safe HostStore. Every handler is
// bounded: request size by the server's 1 MiB receive cap, list sizes by fixed limits, and time
// by the caller's deadline (capped at kMaxHandlerDeadline when none is given). Statuses are
// mapped to gRPC in one place (chain-bridge/client/grpc_status.h).
//
// Who may call (docs/threat-model.md): the operator services are served on a Unix socket only,
// mode 0600 in the data dir (0700), so only the host's owner (and root) can connect — no TCP
// listener carries them, so another local user cannot drive the host, publish its files or make
// it sign. The TCP `listen` address serves SettlementQuery alone, which reads what this host
// has signed and changes nothing.
//
// Thread-safety: thread-safe; gRPC calls the handlers on its own threads.
#ifndef TS_SIDECAR_HOST_OPERATOR_SERVICE_H_
#define TS_SIDECAR_HOST_OPERATOR_SERVICE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "sidecar/host/host_core.h"
#include "sidecar/host/host_daemon.h"
#include "sidecar/host/shard_processes.h"

namespace ts::sidecar {

inline constexpr int kMaxOperatorMessageBytes = 1 << 20;
// SettlementQuery requests (a shard id) on the public listener.
inline constexpr int kMaxQueryMessageBytes = 4 << 10;
inline constexpr uint32_t kDefaultListEventsLimit = 100;
inline constexpr uint32_t kMaxListEventsLimit = 1000;
inline constexpr size_t kMaxListShards = 10000;
inline constexpr absl::Duration kMaxHandlerDeadline = absl::Seconds(60);

class HostOperatorService final : public pb::HostOperator::Service {
 public:
  // None is owned; all must outlive the service. `records` answers what this host's certified
  // records say a shard's settlement must be; nullptr: the host keeps none, and every draft is
  // refused.
  HostOperatorService(HostCore* core, HostDaemon* daemon, std::string version,
                      SettlementRecords* records,
                      std::function<std::vector<pb::RunStartStatus>()> run_starts = {});

  grpc::Status Status(grpc::ServerContext* context, const pb::HostStatusRequest* request,
                      pb::HostStatusResponse* response) override;
  grpc::Status ListShards(grpc::ServerContext* context, const pb::ListShardsRequest* request,
                          pb::ListShardsResponse* response) override;
  // limit 0 means kDefaultListEventsLimit; larger than kMaxListEventsLimit is clamped to it.
  grpc::Status ListEvents(grpc::ServerContext* context, const pb::ListEventsRequest* request,
                          pb::ListEventsResponse* response) override;
  grpc::Status Reserve(grpc::ServerContext* context, const pb::ReserveRequest* request,
                       pb::ReserveResponse* response) override;
  // Signs only the draft this host's certified records imply (SettlementRecords, asked on this
  // gRPC thread first), then as HostCore::SignSettlement. FAILED_PRECONDITION naming the first
  // difference for any other draft, or when the host keeps no (finished) records of the shard.
  grpc::Status SignSettlement(grpc::ServerContext* context,
                              const pb::SignSettlementRequest* request,
                              pb::SignSettlementResponse* response) override;
  grpc::Status SubmitSettlement(grpc::ServerContext* context,
                                const pb::SubmitSettlementRequest* request,
                                pb::SubmitSettlementResponse* response) override;

 private:
  HostCore* const core_;
  HostDaemon* const daemon_;
  const std::string version_;
  SettlementRecords* const records_;
  const std::function<std::vector<pb::RunStartStatus>()> run_starts_;
};

class SettlementQueryService final : public pb::SettlementQuery::Service {
 public:
  explicit SettlementQueryService(const HostCore* core);

  // NOT_FOUND if this host signed no settlement for the shard.
  grpc::Status GetSettlement(grpc::ServerContext* context, const pb::GetSettlementRequest* request,
                             pb::GetSettlementResponse* response) override;

 private:
  const HostCore* const core_;
};

// The deadline a handler works to: the caller's, capped at kMaxHandlerDeadline from now.
absl::Time HandlerDeadline(const grpc::ServerContext& context);

struct OperatorServerOptions {
  // Required, absolute: the Unix socket that carries the operator API (HostOperator,
  // SettlementQuery and `extra_services`). Made mode 0600; a file already at the path is
  // replaced.
  std::string socket_path;
  // Optional "host:port" (port 0 = any free port): SettlementQuery alone, for anyone.
  std::string query_listen;
  std::string version;
  // Served on the socket next to HostOperator (e.g. the artifact operator API); not owned, they
  // must outlive the server.
  std::vector<grpc::Service*> extra_services;
  // Not owned; see HostOperatorService.
  SettlementRecords* records = nullptr;
  // What the host's run starter is doing, for Status; empty: nothing reported.
  std::function<std::vector<pb::RunStartStatus>()> run_starts;
};

struct OperatorServer {
  std::unique_ptr<HostOperatorService> operator_service;
  std::unique_ptr<SettlementQueryService> settlement_service;
  // The operator API on the Unix socket.
  std::unique_ptr<grpc::Server> server;
  // "unix:<socket_path>", as a gRPC client (and `trainshard --host`) takes it.
  std::string address;
  // SettlementQuery on query_listen; null without one.
  std::unique_ptr<grpc::Server> query_server;
  // "host:port" with the port actually bound; empty without one.
  std::string query_address;

  // Both servers; in-flight calls get until `deadline`.
  void Shutdown(std::chrono::system_clock::time_point deadline);
};

// Starts the operator API on options.socket_path and, with options.query_listen, the settlement
// query on TCP. INVALID_ARGUMENT for a socket path that is not absolute or longer than a Unix
// socket path may be; UNAVAILABLE naming the address or path if it cannot be bound or made
// owner-only.
absl::StatusOr<OperatorServer> StartOperatorServer(HostCore* core, HostDaemon* daemon,
                                                   OperatorServerOptions options);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_OPERATOR_SERVICE_H_
