// The artifact operator API a host serves to its own operator (the `trainshard artifact` CLI):
// publish a directory, fetch an artifact from the shard's other members, list, verify and
// collect garbage. And ShardStoreRegistry, the StoreRegistry a host runs with: one ArtifactStore
// per shard this host is a member of, opened on first use under <artifacts_dir>/<shard_id> with
// the shard's quota from the chain (ShardDirectory), and kept open.
//
// The service does not depend on the host daemon, so whichever process hosts the shard's
// services can serve it. Publish and Fetch run the operation on a thread of their own while the
// gRPC handler thread streams ArtifactProgress: at most one message per kProgressIntervalMs, and
// at least one per kProgressHeartbeatMs even when nothing moves, so a client can bound the
// silence it accepts. A Fetch whose client goes away (IsCancelled) stops between chunks and
// stays resumable. Every request is checked before anything runs; errors name the field and the
// value (`artifact_id: 31 bytes, want 32`, `source_dir: "rel" is not absolute`).
//
// Thread-safety: both classes are thread-safe (gRPC calls the handlers on its own threads).
#ifndef TS_SIDECAR_ARTIFACTS_OPERATOR_SERVICE_H_
#define TS_SIDECAR_ARTIFACTS_OPERATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/tls_session.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"
#include "sidecar/artifacts/file_policy.h"
#include "sidecar/artifacts/store.h"
#include "sidecar/artifacts/transfer.h"
#include "sidecar/peer/shard_directory.h"
#include "state/db.h"

namespace ts::sidecar {

inline constexpr int64_t kProgressIntervalMs = 200;
inline constexpr int64_t kProgressHeartbeatMs = 1000;
// Longest source_dir / out_dir accepted (PATH_MAX).
inline constexpr size_t kMaxOperatorPathBytes = 4096;
inline constexpr size_t kMaxFetchPeers = 256;
inline constexpr size_t kMaxGcDrops = 10000;
inline constexpr int64_t kFindDeadlineMs = 10000;

struct ShardStoreRegistryOptions {
  // Absolute; each shard's store is <artifacts_dir>/<shard_id>.
  std::string artifacts_dir;
  // This host's bech32 address: stores are opened only for shards it is a member of.
  std::string self_address;
  // The chain the stores belong to. Empty: not known yet (the host has not reached the chain);
  // StoreFor is UNAVAILABLE until SetChainId.
  std::string chain_id;
};

class ShardStoreRegistry final : public StoreRegistry {
 public:
  // None of the pointers is owned; all must outlive the registry. `db` must have been opened
  // with table kTableArtifacts.
  ShardStoreRegistry(state::Db* db, ShardDirectory* directory, common::Clock* clock,
                     ShardStoreRegistryOptions options);
  ~ShardStoreRegistry() override;

  // Sets the chain id once it is known; ignored once set (a host never changes chains).
  void SetChainId(const std::string& chain_id);

  // The shard's store, opened on first use. UNAVAILABLE if the chain id is not known yet;
  // errors of ShardDirectory::Get (NOT_FOUND: no such shard; UNAVAILABLE: chain unreachable);
  // FAILED_PRECONDITION "this host (<address>) is not a member of shard <id>"; errors of
  // ArtifactStore::Open.
  absl::StatusOr<ArtifactStore*> StoreFor(uint64_t shard_id) override;

 private:
  state::Db* const db_;
  ShardDirectory* const directory_;
  common::Clock* const clock_;
  const std::string artifacts_dir_;
  const std::string self_address_;
  // Serialises opening, so one directory is never opened by two stores (Open empties tmp/).
  absl::Mutex open_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::string chain_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<ArtifactStore>> stores_ ABSL_GUARDED_BY(mu_);
};

struct ArtifactOperatorOptions {
  FetcherOptions fetcher;
  // Publish and Fetch calls running at once; more are RESOURCE_EXHAUSTED.
  size_t max_concurrent_operations = 4;
  // Where Publish may read and Fetch and Export may write (file_policy.h). Unset: anywhere the
  // process may (the library alone, in tests); trainshardd always sets it.
  std::optional<OperatorFilePolicy> file_policy;
  // Told of each publish and fetch (not owned; may be null).
  TransferObserver* observer = nullptr;
  // Fetches talk TLS to each peer, pinning the certificate its reservation names
  // (sidecar/peer/peer_tls.h); false: plaintext, on a trusted network only.
  bool peer_tls = false;
  // This host's TLS identity, for fetches over peers' chunk streams under peer_tls.
  std::shared_ptr<const common::TlsContext> tls;
};

class ArtifactOperatorService final : public pb::ArtifactOperator::Service {
 public:
  // `stores`, `directory` and `clock` are not owned and must outlive the service. Artifacts are
  // published and peer requests signed with `key`, this host's key.
  ArtifactOperatorService(StoreRegistry* stores, ShardDirectory* directory, common::PrivateKey key,
                          common::Clock* clock, ArtifactOperatorOptions options = {});

  // Chunks, stores and signs the regular files under source_dir (ArtifactStore::Publish).
  // PERMISSION_DENIED: source_dir not allowed by the file policy (outside files_root and the
  // shard's own folder, or the data dir, the key file or a folder holding either).
  // INVALID_ARGUMENT: shard_id 0, source_dir not absolute, parent neither empty nor 32 bytes,
  // kind not [a-z0-9-]{1,32}, chunk_size outside [kMinChunkSize, kMaxChunkSize] (0 = default);
  // errors of StoreFor and Publish otherwise (FAILED_PRECONDITION for unsafe entries,
  // RESOURCE_EXHAUSTED for quota).
  grpc::Status Publish(grpc::ServerContext* context, const pb::PublishArtifactRequest* request,
                       grpc::ServerWriter<pb::ArtifactProgress>* writer) override;
  // Fetches from `peers` (member addresses, resolved to endpoints through the directory; empty:
  // every other member with an endpoint), then exports to out_dir if set. INVALID_ARGUMENT: bad
  // shard_id, artifact_id, peers (not an address, given twice, this host, more than
  // kMaxFetchPeers), out_dir not absolute; PERMISSION_DENIED: out_dir not allowed by the file
  // policy (as Publish's source_dir); FAILED_PRECONDITION: a peer not a member, no peer to
  // fetch from, out_dir existing and not empty; ABORTED when every peer was dropped (the message
  // names each and why; the fetch is resumable); CANCELLED when the client went away; other
  // errors of FetchArtifact and Export.
  grpc::Status Fetch(grpc::ServerContext* context, const pb::FetchArtifactRequest* request,
                     grpc::ServerWriter<pb::ArtifactProgress>* writer) override;
  grpc::Status List(grpc::ServerContext* context, const pb::ListLocalArtifactsRequest* request,
                    pb::ListArtifactsResponse* response) override;
  grpc::Status Verify(grpc::ServerContext* context, const pb::VerifyArtifactsRequest* request,
                      pb::VerifyArtifactsResponse* response) override;
  // INVALID_ARGUMENT for a drop_artifacts entry that is not 32 bytes or more than kMaxGcDrops.
  grpc::Status Gc(grpc::ServerContext* context, const pb::GcArtifactsRequest* request,
                  pb::GcArtifactsResponse* response) override;
  // Writes a complete artifact's files under out_dir (ArtifactStore::Export, every chunk
  // re-hashed). INVALID_ARGUMENT: bad shard_id or artifact_id, out_dir not absolute;
  // PERMISSION_DENIED: out_dir not allowed by the file policy (as Publish's source_dir);
  // FAILED_PRECONDITION: out_dir existing and not empty; errors of StoreFor and Export
  // (NOT_FOUND: no such complete artifact here).
  grpc::Status Export(grpc::ServerContext* context, const pb::ExportArtifactRequest* request,
                      pb::ArtifactProgress* response) override;
  // The complete artifacts of `kind` (empty: any) the shard's other members hold, each with the
  // members that hold it, asked of every member at once within kFindDeadlineMs; members that do
  // not answer are listed with why. INVALID_ARGUMENT for shard 0 or a bad kind; errors of
  // StoreFor and the directory.
  grpc::Status Find(grpc::ServerContext* context, const pb::FindArtifactsRequest* request,
                    pb::FindArtifactsResponse* response) override;

 private:
  // OK without a file policy; else CheckOperatorPath.
  absl::Status CheckPathAllowed(std::string_view field, const std::string& path,
                                uint64_t shard_id) const;
  // A member as a peer to fetch from: with its pinned certificate when peer_tls is on.
  FetchPeer PeerOf(const ShardMember& member) const {
    return FetchPeer{member.address, member.endpoint,
                     options_.peer_tls ? member.tls_cert_sha256 : std::string()};
  }

  StoreRegistry* const stores_;
  ShardDirectory* const directory_;
  const common::PrivateKey key_;
  const std::string self_address_;
  common::Clock* const clock_;
  const ArtifactOperatorOptions options_;
  std::atomic<size_t> operations_{0};
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_OPERATOR_SERVICE_H_
