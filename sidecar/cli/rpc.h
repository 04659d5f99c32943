// gRPC plumbing shared by the CLI's direct calls: channels with a response size cap, and one call
// with a deadline whose status is mapped by the project's one mapping (grpc_status.h).
//
// Thread-safety: stateless helpers; channels and stubs are thread-safe.
#ifndef TS_SIDECAR_CLI_RPC_H_
#define TS_SIDECAR_CLI_RPC_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/grpc_status.h"

namespace ts::sidecar {

// Largest response the CLI accepts from the chain or a sidecar.
inline constexpr int kResponseBytesMax = 16 << 20;

// An insecure channel (loopback and operator networks) that connects on first use.
inline std::shared_ptr<grpc::Channel> NewChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kResponseBytesMax);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// Runs `call(&context, &response)` with a deadline of `timeout_ms`.
template <typename Response, typename Call>
absl::StatusOr<Response> CallWithDeadline(int64_t timeout_ms, Call call) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  Response response;
  grpc::Status status = call(&context, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_RPC_H_
