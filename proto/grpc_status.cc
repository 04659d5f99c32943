#include "proto/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace ts {
namespace {

// gRPC and Abseil share the canonical code numbers 0..16.
constexpr int kLastCanonicalCode = 16;

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  int code = static_cast<int>(status.code());
  if (code <= 0 || code > kLastCanonicalCode) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
  return grpc::Status(static_cast<grpc::StatusCode>(code), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, std::string_view what) {
  if (status.ok()) return absl::OkStatus();
  int code = static_cast<int>(status.error_code());
  if (code <= 0 || code > kLastCanonicalCode) code = static_cast<int>(absl::StatusCode::kUnknown);
  std::string message = status.error_message();
  if (!what.empty()) {
    message = absl::StrCat(absl::string_view(what.data(), what.size()), ": ", message);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

}  // namespace ts
