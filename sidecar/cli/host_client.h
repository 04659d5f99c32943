// Calls from the CLI to a host sidecar (trainshardd): its operator API (HostOperator) and its
// settlement query service (SettlementQuery), both served on the operator socket the sidecar
// names in <data_dir>/operator.addr (the query also on its public `listen` address). Every call
// carries a deadline.
//
// Errors are the sidecar's gRPC status mapped to the same absl code; UNAVAILABLE or
// DEADLINE_EXCEEDED when the sidecar cannot be reached in time.
// Thread-safety: thread-safe (gRPC stubs are).
#ifndef TS_SIDECAR_CLI_HOST_CLIENT_H_
#define TS_SIDECAR_CLI_HOST_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"

namespace ts::sidecar {

class HostClient {
 public:
  // Connects lazily to `target` (a gRPC target: "unix:/path" or "host:port", ParseHostTarget);
  // never fails here.
  HostClient(std::string target, int64_t timeout_ms);

  const std::string& target() const { return target_; }

  absl::StatusOr<gonka::trainshard::v1::HostStatusResponse> Status();
  absl::StatusOr<gonka::trainshard::v1::ListShardsResponse> ListShards();
  absl::StatusOr<gonka::trainshard::v1::ListEventsResponse> ListEvents(int64_t from_height,
                                                                       uint32_t limit);
  absl::StatusOr<gonka::trainshard::v1::ReserveResponse> Reserve(uint64_t shard_id);
  absl::StatusOr<gonka::trainshard::v1::SignSettlementResponse> SignSettlement(
      const gonka::trainshard::v1::Settlement& draft);
  absl::StatusOr<gonka::trainshard::v1::SubmitSettlementResponse> SubmitSettlement(
      const gonka::trainshard::v1::SubmitSettlementRequest& request);
  absl::StatusOr<gonka::trainshard::v1::GetSettlementResponse> GetSettlement(uint64_t shard_id);

 private:
  std::string target_;
  int64_t timeout_ms_;
  std::unique_ptr<gonka::trainshard::v1::HostOperator::Stub> operator_;
  std::unique_ptr<gonka::trainshard::v1::SettlementQuery::Stub> settlement_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_HOST_CLIENT_H_
