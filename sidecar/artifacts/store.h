// ArtifactStore: one shard's content-addressed chunk store on the host's disk, with its index
// rows in the host's RocksDB. Layout (docs/artifacts.md, "Store"):
//
//   <dir>/chunks/<first 2 hex>/<64 hex>   one file per distinct chunk, named by its SHA-256
//   <dir>/tmp/                            temporaries; emptied on Open
//   RocksDB table kTableArtifacts, key be64(shard_id) || id  -> StoredArtifact
//
// Durability: a chunk is written to tmp/, fsync'd, renamed into chunks/ and the directory
// fsync'd (SafeDir::WriteFileAtomic); a chunk file's name is its verified hash, so a present
// chunk is a verified one (unless the disk is tampered with, which Verify reports). An index row
// says "complete" only after every chunk it names is durable, so a crash never leaves an
// artifact listed as complete with data missing. An interrupted fetch leaves an incomplete row:
// BeginFetch on the same id resumes it (only missing chunks are asked for), Gc can drop it.
//
// Quota: bytes on disk (sum of chunk sizes) and files (chunk files) per shard, checked before
// anything is written: BeginFetch and Publish reserve what they may add and fail with
// RESOURCE_EXHAUSTED if usage + reservations would pass the quota.
//
// Thread-safety: thread-safe. Publish, fetches (PutChunk from several threads), serving reads,
// List, Verify and Gc may run at once; Gc, Verify and the clean-up of a failed publish take the
// store's lock, so they wait for and block chunk writes.
#ifndef TS_SIDECAR_ARTIFACTS_STORE_H_
#define TS_SIDECAR_ARTIFACTS_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/artifacts/manifest.h"
#include "sidecar/artifacts/safe_fs.h"
#include "state/db.h"

namespace ts::sidecar {

inline constexpr std::string_view kTableArtifacts = "artifacts";

struct StoreQuota {
  uint64_t bytes_max = 0;
  uint64_t files_max = 0;
};

struct StoreUsage {
  uint64_t bytes = 0;  // chunk bytes on disk
  uint64_t files = 0;  // chunk files on disk
  uint64_t reserved_bytes = 0;
  uint64_t reserved_files = 0;
};

using ProgressFn = std::function<void(const pb::ArtifactProgress&)>;

struct PublishOptions {
  std::string source_dir;  // absolute
  uint64_t round = 0;
  std::string parent;  // empty or 32 bytes
  std::string kind = "checkpoint";
  uint32_t chunk_size = kDefaultChunkSize;
};

// What a fetch still needs.
struct FetchPlan {
  VerifiedManifest manifest;
  std::vector<std::string> missing;  // chunk hashes not stored, each once, in manifest order
  uint32_t present = 0;              // distinct chunks already stored
  uint64_t missing_bytes = 0;
};

// A chunk of a fetch in progress whose size and SHA-256 ArtifactStore::VerifyChunk has checked;
// only VerifyChunk makes one, so PutVerifiedChunk cannot store unverified bytes. It views the
// caller's data, which must stay unchanged until it is stored.
class VerifiedChunk {
 public:
  VerifiedChunk(VerifiedChunk&&) = default;
  VerifiedChunk& operator=(VerifiedChunk&&) = default;
  const std::string& hash() const { return hash_; }
  size_t size() const { return data_.size(); }

 private:
  friend class ArtifactStore;
  VerifiedChunk() = default;
  std::string artifact_id_;
  std::string hash_;
  std::string_view data_;
};

class ArtifactStore {
 public:
  // Opens (creating) `dir` (absolute) for shard `shard_id` of `chain_id`. `db` must have been
  // opened with table kTableArtifacts and outlive the store; `clock` too. Empties tmp/, counts
  // usage by listing chunks/ (a non-regular entry there is skipped and reported by Verify).
  // Errors of SafeDir::Open and Db.
  static absl::StatusOr<std::unique_ptr<ArtifactStore>> Open(const std::string& dir, state::Db* db,
                                                             std::string chain_id,
                                                             uint64_t shard_id, StoreQuota quota,
                                                             common::Clock* clock);
  ~ArtifactStore();

  uint64_t shard_id() const;
  const std::string& chain_id() const;
  StoreUsage Usage() const;

  // Chunks every regular file under options.source_dir (SafeDir::ListFiles with hardlinks
  // refused: links, devices, FIFOs, sockets and bad names are errors naming the file), writes
  // the chunks durably, signs the manifest with `key` and writes a complete index row.
  // INVALID_ARGUMENT (options: chunk_size, kind, parent; names), FAILED_PRECONDITION (unsafe
  // entries), RESOURCE_EXHAUSTED (quota, checked on the listed sizes before any write; also the
  // manifest caps; also ENOSPC and EDQUOT from the filesystem), ABORTED (a file changed size
  // while read), and the index's errors. Nothing is indexed on error, and the chunk files this
  // publish created are removed again (their bytes and files go back to the quota), except
  // those another artifact, publish or fetch names by then; the message says how many went.
  // Only when the index row's write failed and a delete could not settle it are they kept (a
  // complete row must never name a removed chunk): Verify reports them, Gc removes them. A
  // crash mid-publish leaves its chunks for Gc too.
  absl::StatusOr<VerifiedManifest> Publish(const PublishOptions& options,
                                           const common::PrivateKey& key,
                                           const ProgressFn& progress);

  // Starts or resumes fetching `manifest` (already verified by the caller, publisher
  // membership included). If the artifact is complete here, returns a plan with nothing
  // missing. Otherwise reserves quota for the missing chunks (RESOURCE_EXHAUSTED if they do not
  // fit, nothing written) and writes an incomplete index row (synced) so the fetch can resume
  // after a restart.
  absl::StatusOr<FetchPlan> BeginFetch(const VerifiedManifest& manifest);

  // Stores one chunk of an artifact being fetched: SHA-256(data) must equal `hash` (DATA_LOSS,
  // nothing written), `hash` must be named by that artifact's manifest (INVALID_ARGUMENT) and
  // its size must match the manifest (DATA_LOSS). FAILED_PRECONDITION if no fetch of
  // `artifact_id` is in progress. Durable when it returns OK. Safe to call concurrently.
  absl::Status PutChunk(std::string_view artifact_id, std::string_view hash, std::string_view data);
  // PutChunk in two steps, so a fetcher can hash the next chunk while this one is written:
  // VerifyChunk runs PutChunk's checks (same errors) and writes nothing; PutVerifiedChunk writes
  // the chunk durably (FAILED_PRECONDITION if the fetch has ended meanwhile; I/O errors).
  absl::StatusOr<VerifiedChunk> VerifyChunk(std::string_view artifact_id, std::string_view hash,
                                            std::string_view data) const;
  absl::Status PutVerifiedChunk(const VerifiedChunk& chunk);

  // Marks the artifact complete (synced) if every chunk is present and releases what is left of
  // its reservation. FAILED_PRECONDITION naming how many chunks are missing otherwise.
  absl::Status CompleteFetch(std::string_view artifact_id);
  // Ends a fetch without completing it (the incomplete row stays, resumable) and releases its
  // reservation.
  void AbandonFetch(std::string_view artifact_id);

  // The manifest of an artifact. NOT_FOUND if absent (or incomplete when complete_only).
  absl::StatusOr<VerifiedManifest> GetManifest(std::string_view artifact_id,
                                               bool complete_only) const;
  // Reads a stored chunk for serving, refusing anything but a regular file of at most
  // kMaxChunkSize bytes (FAILED_PRECONDITION). NOT_FOUND if absent.
  absl::StatusOr<std::string> ReadChunk(std::string_view hash) const;
  // The same into `out` (resized to the chunk), reusing its capacity: for serving many chunks.
  absl::Status ReadChunk(std::string_view hash, std::string* out) const;
  // The same into memory the caller provides once the size is known: buffer_for(size) returns
  // room for `size` bytes, or nullptr (then RESOURCE_EXHAUSTED). For serving a chunk straight
  // into an outgoing message; on error the buffer's content is unspecified.
  absl::Status ReadChunkInto(std::string_view hash,
                             const std::function<char*(size_t size)>& buffer_for) const;
  // The same checks, handing out the open file and its size instead: for serving a chunk with
  // sendfile (the chunk stream). The descriptor reads the file as it was when opened.
  absl::StatusOr<UniqueFd> OpenChunk(std::string_view hash, uint64_t* size) const;
  bool HasChunk(std::string_view hash) const;

  // Index rows of this shard, complete ones only unless include_incomplete.
  absl::StatusOr<std::vector<pb::ArtifactSummary>> List(bool include_incomplete) const;

  // Re-hashes every chunk file and compares with the manifests: modified and missing chunks,
  // unreferenced ones (count and bytes: what Gc would free) and incomplete artifacts.
  absl::StatusOr<pb::VerifyArtifactsResponse> Verify() const;

  // Drops the listed artifacts' index rows (and incomplete ones with drop_incomplete), then
  // removes chunk files no remaining manifest names, and stray temporaries. Chunks of fetches in
  // progress are kept.
  absl::StatusOr<pb::GcArtifactsResponse> Gc(const std::vector<std::string>& drop_ids,
                                             bool drop_incomplete);

  // Writes a complete artifact's files under out_dir (absolute; created, or existing and
  // empty), each through SafeDir::CreateExclusive, re-hashing every chunk as it is copied
  // (DATA_LOSS naming the chunk if the store was tampered with). NOT_FOUND if not complete.
  // FAILED_PRECONDITION if out_dir exists and is not empty.
  absl::Status Export(std::string_view artifact_id, const std::string& out_dir,
                      const ProgressFn& progress) const;

 private:
  struct Impl;
  explicit ArtifactStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Index key: be64(shard_id) || id.
std::string ArtifactKey(uint64_t shard_id, std::string_view artifact_id);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_STORE_H_
