#include "sidecar/cli/host_client.h"

#include "sidecar/cli/rpc.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;

HostClient::HostClient(std::string target, int64_t timeout_ms)
    : target_(std::move(target)), timeout_ms_(timeout_ms) {
  auto channel = NewChannel(target_);
  operator_ = pb::HostOperator::NewStub(channel);
  settlement_ = pb::SettlementQuery::NewStub(channel);
}

absl::StatusOr<pb::HostStatusResponse> HostClient::Status() {
  return CallWithDeadline<pb::HostStatusResponse>(timeout_ms_, [&](auto* context, auto* response) {
    return operator_->Status(context, pb::HostStatusRequest(), response);
  });
}

absl::StatusOr<pb::ListShardsResponse> HostClient::ListShards() {
  return CallWithDeadline<pb::ListShardsResponse>(timeout_ms_, [&](auto* context, auto* response) {
    return operator_->ListShards(context, pb::ListShardsRequest(), response);
  });
}

absl::StatusOr<pb::ListEventsResponse> HostClient::ListEvents(int64_t from_height, uint32_t limit) {
  pb::ListEventsRequest request;
  request.set_from_height(from_height);
  request.set_limit(limit);
  return CallWithDeadline<pb::ListEventsResponse>(timeout_ms_, [&](auto* context, auto* response) {
    return operator_->ListEvents(context, request, response);
  });
}

absl::StatusOr<pb::ReserveResponse> HostClient::Reserve(uint64_t shard_id) {
  pb::ReserveRequest request;
  request.set_shard_id(shard_id);
  return CallWithDeadline<pb::ReserveResponse>(timeout_ms_, [&](auto* context, auto* response) {
    return operator_->Reserve(context, request, response);
  });
}

absl::StatusOr<pb::SignSettlementResponse> HostClient::SignSettlement(const pb::Settlement& draft) {
  pb::SignSettlementRequest request;
  *request.mutable_draft() = draft;
  return CallWithDeadline<pb::SignSettlementResponse>(
      timeout_ms_, [&](auto* context, auto* response) {
        return operator_->SignSettlement(context, request, response);
      });
}

absl::StatusOr<pb::SubmitSettlementResponse> HostClient::SubmitSettlement(
    const pb::SubmitSettlementRequest& request) {
  return CallWithDeadline<pb::SubmitSettlementResponse>(
      timeout_ms_, [&](auto* context, auto* response) {
        return operator_->SubmitSettlement(context, request, response);
      });
}

absl::StatusOr<pb::GetSettlementResponse> HostClient::GetSettlement(uint64_t shard_id) {
  pb::GetSettlementRequest request;
  request.set_shard_id(shard_id);
  return CallWithDeadline<pb::GetSettlementResponse>(
      timeout_ms_, [&](auto* context, auto* response) {
        return settlement_->GetSettlement(context, request, response);
      });
}

}  // namespace ts::sidecar
