// HostLink: a shard process's connection to its host sidecar (docs/architecture.md, "Shard
// process"). The sidecar keeps what the host decides and what peers fetch from it: the shard's
// artifact store (its index in the host's database, served to peers on the shard endpoint) and
// the settlement signing key's records. The shard process reaches them through the host's own
// operator API, served on a Unix socket inside the host's data directory: ArtifactOperator for
// publish / fetch / export / list / drop, HostOperator for signing and submitting the
// settlement. Files move by path, not through messages: both processes see the same directories.
//
// ShardArtifacts is the interface a run uses for the first; HostLink implements it over the
// socket. Every call has a deadline; a fetch also stops (CANCELLED) once `cancelled` says so,
// and when the host has sent nothing (its progress messages come at least every second) for
// kHostSilenceMaxMs. A publish or fetch the host refuses as busy (RESOURCE_EXHAUSTED: it runs a
// few at once, for its operator and all its shard processes together) is tried again with
// backoff for up to kHostBusyWaitMs.
//
// Thread-safety: HostLink is thread-safe.
#ifndef TS_SIDECAR_SHARD_HOST_LINK_H_
#define TS_SIDECAR_SHARD_HOST_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"

namespace ts::sidecar {

// What a run does with its shard's artifact store. Artifact ids are 32 bytes.
class ShardArtifacts {
 public:
  virtual ~ShardArtifacts() = default;
  // Publishes the regular files under `source_dir` (absolute) as an artifact of `kind` for
  // `round`, signed by the host; returns its id.
  virtual absl::StatusOr<std::string> Publish(uint64_t shard_id, const std::string& source_dir,
                                              std::string_view kind, uint64_t round) = 0;
  // Fetches an artifact from `peers` (member addresses; empty: every other member), each chunk
  // from whichever peer has it, every chunk verified before it is stored.
  virtual absl::StatusOr<::gonka::trainshard::v1::ArtifactProgress> Fetch(
      uint64_t shard_id, const std::string& artifact_id, const std::vector<std::string>& peers,
      const std::function<bool()>& cancelled) = 0;
  // Writes a complete artifact's files under `out_dir` (absolute; must not exist or be empty).
  virtual absl::Status Export(uint64_t shard_id, const std::string& artifact_id,
                              const std::string& out_dir) = 0;
  // The complete artifacts held for the shard.
  virtual absl::StatusOr<std::vector<::gonka::trainshard::v1::ArtifactSummary>> List(
      uint64_t shard_id) = 0;
  // Drops the artifacts and removes the chunks no other artifact names.
  virtual absl::Status Drop(uint64_t shard_id, const std::vector<std::string>& artifact_ids) = 0;
  // The complete artifacts of `kind` the shard's other members hold, with who holds each.
  virtual absl::StatusOr<::gonka::trainshard::v1::FindArtifactsResponse> Find(
      uint64_t shard_id, std::string_view kind) = 0;
};

inline constexpr int64_t kHostCallTimeoutMs = 60'000;
inline constexpr int64_t kHostSubmitTimeoutMs = 180'000;            // the host waits for inclusion
inline constexpr int64_t kHostTransferTimeoutMs = 6 * 3600 * 1000;  // publish / fetch / export
inline constexpr int64_t kHostSilenceMaxMs = 30'000;
inline constexpr int64_t kHostBusyWaitMs = 60'000;  // RESOURCE_EXHAUSTED is tried again this long

class HostLink final : public ShardArtifacts {
 public:
  // `socket_path`: the host's Unix socket. The channel connects lazily.
  explicit HostLink(const std::string& socket_path);
  ~HostLink() override;
  HostLink(const HostLink&) = delete;
  HostLink& operator=(const HostLink&) = delete;

  absl::StatusOr<std::string> Publish(uint64_t shard_id, const std::string& source_dir,
                                      std::string_view kind, uint64_t round) override;
  absl::StatusOr<::gonka::trainshard::v1::ArtifactProgress> Fetch(
      uint64_t shard_id, const std::string& artifact_id, const std::vector<std::string>& peers,
      const std::function<bool()>& cancelled) override;
  absl::Status Export(uint64_t shard_id, const std::string& artifact_id,
                      const std::string& out_dir) override;
  absl::StatusOr<std::vector<::gonka::trainshard::v1::ArtifactSummary>> List(
      uint64_t shard_id) override;
  absl::Status Drop(uint64_t shard_id, const std::vector<std::string>& artifact_ids) override;
  absl::StatusOr<::gonka::trainshard::v1::FindArtifactsResponse> Find(
      uint64_t shard_id, std::string_view kind) override;

  // The host checks the draft against its own records before it signs.
  absl::StatusOr<::gonka::trainshard::v1::SettlementSignature> SignSettlement(
      const ::gonka::trainshard::v1::Settlement& draft);
  // Broadcasts through the host's chain client; returns the txhash, FAILED_PRECONDITION naming
  // the code and log when the chain refused it.
  absl::StatusOr<std::string> SubmitSettlement(
      const ::gonka::trainshard::v1::Settlement& settlement,
      const std::vector<::gonka::trainshard::v1::SettlementSignature>& signatures);

  const std::string& target() const { return target_; }

 private:
  std::string target_;
  std::unique_ptr<::gonka::trainshard::v1::ArtifactOperator::Stub> artifacts_;
  std::unique_ptr<::gonka::trainshard::v1::HostOperator::Stub> host_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_HOST_LINK_H_
