// Calls from the CLI to a host sidecar's artifact operator API (ArtifactOperator, served on the
// operator address next to HostOperator).
//
// List, Verify and Gc carry the --timeout-ms deadline. Publish and Fetch may run for as long as
// the transfer takes, so they carry no overall deadline; instead the call is cancelled when no
// message arrives for timeout_ms (the sidecar sends progress at least once a second), which
// bounds the wait on a host that hangs without bounding a large transfer.
//
// Errors are the sidecar's gRPC status mapped to the same absl code; UNAVAILABLE or
// DEADLINE_EXCEEDED when the sidecar cannot be reached or falls silent.
// Thread-safety: thread-safe (gRPC stubs are); the progress callback runs on the calling thread.
#ifndef TS_SIDECAR_CLI_ARTIFACT_CLIENT_H_
#define TS_SIDECAR_CLI_ARTIFACT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"

namespace ts::sidecar {

class ArtifactClient {
 public:
  using ProgressCallback = std::function<void(const gonka::trainshard::v1::ArtifactProgress&)>;

  // Connects lazily to `target` ("host:port"); never fails here.
  ArtifactClient(std::string target, int64_t timeout_ms);

  const std::string& target() const { return target_; }

  // Stream every progress message (the final one too) to `progress`; return the final one
  // (done = true). INTERNAL if the stream ends without it.
  absl::StatusOr<gonka::trainshard::v1::ArtifactProgress> Publish(
      const gonka::trainshard::v1::PublishArtifactRequest& request,
      const ProgressCallback& progress);
  absl::StatusOr<gonka::trainshard::v1::ArtifactProgress> Fetch(
      const gonka::trainshard::v1::FetchArtifactRequest& request, const ProgressCallback& progress);

  absl::StatusOr<gonka::trainshard::v1::ListArtifactsResponse> List(uint64_t shard_id,
                                                                    bool include_incomplete);
  absl::StatusOr<gonka::trainshard::v1::VerifyArtifactsResponse> Verify(uint64_t shard_id);
  absl::StatusOr<gonka::trainshard::v1::GcArtifactsResponse> Gc(
      const gonka::trainshard::v1::GcArtifactsRequest& request);

 private:
  std::string target_;
  int64_t timeout_ms_;
  std::unique_ptr<gonka::trainshard::v1::ArtifactOperator::Stub> stub_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_ARTIFACT_CLIENT_H_
