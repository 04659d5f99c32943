// The host sidecar's gRPC services: HostOperator (the CLI's operator API) and SettlementQuery
// (what this host signed, for the chain or anyone). Handlers that change state run on the
// HostDaemon's owner thread; reads go straight to the thread-safe HostStore. Every handler is
// bounded: request size by the server's 1 MiB receive cap, list sizes by fixed limits, and time
// by the caller's deadline (capped at kMaxHandlerDeadline when none is given). Statuses are
// mapped to gRPC in one place (chain-bridge/client/grpc_status.h).
//
// Thread-safety: thread-safe; gRPC calls the handlers on its own threads.
#ifndef TS_SIDECAR_HOST_OPERATOR_SERVICE_H_
#define TS_SIDECAR_HOST_OPERATOR_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "sidecar/host/host_core.h"
#include "sidecar/host/host_daemon.h"

namespace ts::sidecar {

inline constexpr int kMaxOperatorMessageBytes = 1 << 20;
inline constexpr uint32_t kDefaultListEventsLimit = 100;
inline constexpr uint32_t kMaxListEventsLimit = 1000;
inline constexpr size_t kMaxListShards = 10000;
inline constexpr absl::Duration kMaxHandlerDeadline = absl::Seconds(60);

class HostOperatorService final : public pb::HostOperator::Service {
 public:
  // Neither is owned; both must outlive the service.
  HostOperatorService(HostCore* core, HostDaemon* daemon, std::string version);

  grpc::Status Status(grpc::ServerContext* context, const pb::HostStatusRequest* request,
                      pb::HostStatusResponse* response) override;
  grpc::Status ListShards(grpc::ServerContext* context, const pb::ListShardsRequest* request,
                          pb::ListShardsResponse* response) override;
  // limit 0 means kDefaultListEventsLimit; larger than kMaxListEventsLimit is clamped to it.
  grpc::Status ListEvents(grpc::ServerContext* context, const pb::ListEventsRequest* request,
                          pb::ListEventsResponse* response) override;
  grpc::Status Reserve(grpc::ServerContext* context, const pb::ReserveRequest* request,
                       pb::ReserveResponse* response) override;
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

struct OperatorServer {
  std::unique_ptr<HostOperatorService> operator_service;
  std::unique_ptr<SettlementQueryService> settlement_service;
  std::unique_ptr<grpc::Server> server;
  // "host:port" with the port actually bound.
  std::string address;
};

// Binds `listen` ("host:port", port 0 = any free port) and starts both services, and
// `extra_services` next to them (e.g. the artifact operator API; not owned, they must outlive
// the server). With `local_socket` (an absolute path), the same services are also served on that
// Unix socket (mode 0600), for the host's shard processes. UNAVAILABLE naming the address if it
// cannot be bound.
absl::StatusOr<OperatorServer> StartOperatorServer(
    const std::string& listen, HostCore* core, HostDaemon* daemon, std::string version,
    const std::vector<grpc::Service*>& extra_services = {}, const std::string& local_socket = {});

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_OPERATOR_SERVICE_H_
