// The one place where absl::Status and grpc::Status are converted, for every gRPC edge of the
// project (the devnet's services, the chain client, the host sidecar's APIs, the worker protocol).
// Canonical codes are the same numbers in both; the message is carried unchanged.
// Pure functions; thread-safe.
#ifndef TS_PROTO_GRPC_STATUS_H_
#define TS_PROTO_GRPC_STATUS_H_

#include <string_view>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ts {

grpc::Status ToGrpcStatus(const absl::Status& status);

// `what` names the call (e.g. "cosmos.tx.v1beta1.Service/GetTx") and prefixes the message of a
// non-OK status, so a caller's error says which remote call failed. A code outside the canonical
// range becomes UNKNOWN.
absl::Status FromGrpcStatus(const grpc::Status& status, std::string_view what = {});

}  // namespace ts

#endif  // TS_PROTO_GRPC_STATUS_H_
