// ArtifactStore's internals, included only by the store's own files (store.cc, store_impl.cc,
// store_maintenance.cc): the helpers they share and ArtifactStore::Impl, the store's state and
// its operations. Thread-safety: as store.h says; Impl's locks are annotated on its members.
#ifndef TS_SIDECAR_ARTIFACTS_STORE_INTERNAL_H_
#define TS_SIDECAR_ARTIFACTS_STORE_INTERNAL_H_

#include "sidecar/artifacts/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/absl_view.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/status.h"

namespace ts::sidecar {
namespace store_internal {

// Progress callbacks are for a progress bar: more than ~20 a second is noise on the wire.
inline constexpr int64_t kProgressIntervalMs = 50;
// Writes of one chunk name are serialised by a lock picked by the hash's first byte. The chunk's
// subdirectory is also picked by that byte, so one stripe also covers creating the subdirectory.
inline constexpr size_t kWriteStripes = 64;

std::string Hex(std::string_view bytes);

absl::Status IoError(int err, std::string_view what);

// Removes an entry found by ListNames (a name without '/', so unlinkat resolves nothing but the
// entry itself, which is never followed). Directories are left alone.
void RemoveEntry(const SafeDir& dir, const std::string& name);

// Calls a ProgressFn at most every kProgressIntervalMs, except when forced.
class ProgressThrottle {
 public:
  ProgressThrottle(const ProgressFn& fn, common::Clock* clock) : fn_(fn), clock_(clock) {}
  void Report(const pb::ArtifactProgress& progress, bool force);

 private:
  const ProgressFn& fn_;
  common::Clock* clock_;
  std::optional<int64_t> last_ms_;
};

}  // namespace store_internal

struct ArtifactStore::Impl {
  // What a fetch in progress expects; fixed when the fetch begins.
  struct FetchInfo {
    VerifiedManifest manifest;
    std::vector<std::pair<std::string, uint32_t>> chunks;  // distinct, manifest order
    absl::flat_hash_map<std::string, uint32_t> sizes;
  };
  struct Fetch {
    std::shared_ptr<const FetchInfo> info;
    // Chunks missing when the fetch began whose quota is still reserved.
    absl::flat_hash_set<std::string> reserved;
    uint64_t reserved_bytes = 0;
    uint64_t reserved_files = 0;
  };

  Impl(std::string dir_path, SafeDir root_dir, SafeDir chunks_dir, SafeDir tmp_dir,
       state::Db* database, std::string chain, uint64_t shard, StoreQuota store_quota,
       common::Clock* store_clock)
      : path(std::move(dir_path)),
        root(std::move(root_dir)),
        chunks(std::move(chunks_dir)),
        tmp(std::move(tmp_dir)),
        db(database),
        chain_id(std::move(chain)),
        shard_id(shard),
        quota(store_quota),
        clock(store_clock) {}

  const std::string path;
  const SafeDir root;
  const SafeDir chunks;
  const SafeDir tmp;
  state::Db* const db;
  const std::string chain_id;
  const uint64_t shard_id;
  const StoreQuota quota;
  common::Clock* const clock;
  mutable std::atomic<uint64_t> temp_counter{0};

  // Held shared by everything that writes chunks, index rows or fetch state; exclusively by Gc
  // and Verify, so they see the chunks, the rows and the fetches in progress as one state.
  mutable absl::Mutex io_mu;
  mutable std::array<absl::Mutex, store_internal::kWriteStripes> stripe_mu;

  mutable absl::Mutex mu;
  uint64_t used_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t used_files ABSL_GUARDED_BY(mu) = 0;
  uint64_t reserved_bytes ABSL_GUARDED_BY(mu) = 0;
  uint64_t reserved_files ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<std::string, Fetch> fetches ABSL_GUARDED_BY(mu);
  // Chunks a publish in progress has hashed (hash -> number of publishes), kept by Gc.
  absl::flat_hash_map<std::string, int> publish_pins ABSL_GUARDED_BY(mu);

  mutable absl::Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::shared_ptr<const VerifiedManifest>> cache
      ABSL_GUARDED_BY(cache_mu);
  mutable size_t cache_bytes ABSL_GUARDED_BY(cache_mu) = 0;
  mutable uint64_t cache_generation ABSL_GUARDED_BY(cache_mu) = 0;

  // ---- quota

  absl::Status ReserveLocked(uint64_t bytes, uint64_t files) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void ReleaseLocked(uint64_t bytes, uint64_t files) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    TS_CHECK(bytes <= reserved_bytes && files <= reserved_files);
    reserved_bytes -= bytes;
    reserved_files -= files;
  }

  // Removes a fetch and releases what it still reserves.
  void EndFetchLocked(absl::flat_hash_map<std::string, Fetch>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ReleaseLocked(it->second.reserved_bytes, it->second.reserved_files);
    fetches.erase(it);
  }

  // ---- index rows

  absl::Status PutRow(const VerifiedManifest& manifest, bool complete);

  // Deletes the row of `id` (synced).
  absl::Status DeleteRow(std::string_view id);

  // nullopt if there is no row for `id`.
  absl::StatusOr<std::optional<pb::StoredArtifact>> GetRow(std::string_view id) const;

  // Every row of this shard: fn(id, row). DATA_LOSS for a key that does not decode, and for a
  // value that does not parse unless `unparsable_ok`, in which case fn gets a null row.
  absl::Status ScanRows(
      const std::function<absl::Status(const std::string&, const pb::StoredArtifact*)>& fn,
      bool unparsable_ok) const;

  // Verified manifests of complete rows, so serving chunks (the transfer service looks the
  // manifest up for every GetChunks call) does not re-verify a large manifest each time. A
  // complete row changes only by being dropped (Gc) or rewritten (PutRow), which remove the
  // entry and move the generation on, so a lookup that read the row before cannot insert it
  // after.
  std::shared_ptr<const VerifiedManifest> CacheLookup(std::string_view id) const {
    absl::MutexLock lock(&cache_mu);
    auto it = cache.find(std::string(id));
    return it == cache.end() ? nullptr : it->second;
  }
  uint64_t CacheGeneration() const {
    absl::MutexLock lock(&cache_mu);
    return cache_generation;
  }
  void CacheInsert(std::shared_ptr<const VerifiedManifest> manifest, uint64_t generation) const;
  void CacheErase(std::string_view id) const;

  // The body of a row's manifest, decoded without the checks of VerifyManifest (for listing and
  // for the chunk references of Gc and Verify; the row was written by this store).
  static absl::StatusOr<pb::ManifestBody> RowBody(const std::string& id,
                                                  const pb::StoredArtifact& row);

  absl::StatusOr<VerifiedManifest> VerifyRow(std::string_view id,
                                             const pb::StoredArtifact& row) const;

  // ---- chunk files

  // chunks/<sub>; nullopt if absent and !create. The caller holds the stripe of the subdirectory
  // when creating it.
  absl::StatusOr<std::optional<SafeDir>> ChunkSubdir(std::string_view sub, bool create) const;

  // The stat of chunk `hash` (its final component not followed); nullopt if absent.
  absl::StatusOr<std::optional<struct stat>> StatChunk(std::string_view hash) const;

  // Whether chunk `hash` is stored as a servable file: a regular file with one link, of `size`
  // bytes (any size up to kMaxChunkSize when size is nullopt). Errors count as absent.
  bool ChunkPresent(std::string_view hash, std::optional<uint64_t> size) const;

  // Stores chunk `hash` (whose data the caller has verified) unless a file of the right size is
  // already there. `covered`: the caller holds a quota reservation for it; otherwise quota is
  // reserved here for the write. Durable when it returns; true if it wrote the file.
  absl::StatusOr<bool> WriteChunk(const std::string& hash, std::string_view data, bool covered)
      ABSL_SHARED_LOCKS_REQUIRED(io_mu);

  // tmp/<name> → write → fdatasync → rename to chunks/<2 hex>/<hex> → fsync of the subdirectory.
  absl::Status WriteDurably(const SafeDir& sub, const std::string& hex,
                            std::string_view data) const;

  uint64_t temp_counter_next() const { return temp_counter.fetch_add(1); }

  // After a publish failed with `failure`: removes the chunk files it created (`written`) that
  // nothing else names by now — no index row (complete or not), no other publish in progress
  // (its pins; `own_pins` are the failed publish's own) and no fetch in progress — and gives
  // their bytes and files back to the quota. Returns `failure`, its message saying what became
  // of the files. Takes io_mu exclusively, like Gc, so no chunk write, fetch start or row write
  // runs meanwhile.
  absl::Status UndoPublish(const absl::Status& failure,
                           const absl::flat_hash_set<std::string>& written,
                           const absl::flat_hash_set<std::string>& own_pins, bool keep_all)
      ABSL_LOCKS_EXCLUDED(io_mu, mu);

  // Every chunk-named entry under chunks/: fn(subdir, name, hash, stat). Entries of chunks/ that
  // are not two-hex directories are skipped (never followed); so are names in a subdirectory
  // that are not chunk names, which go to `strays` when it is non-null.
  absl::Status WalkChunks(
      const std::function<absl::Status(const SafeDir&, const std::string& name,
                                       const std::string& hash, const struct stat&)>& fn,
      std::vector<std::pair<std::string, std::string>>* strays) const;

  absl::Status CountUsage();

  // Removes every entry of tmp/ but directories. Called with no chunk write in flight.
  absl::Status EmptyTmp() const;

  // Reads chunk `hash` (a regular file with one link, at most kMaxChunkSize bytes).
  absl::StatusOr<std::string> ReadChunkFile(std::string_view hash) const;
  // The same into `out`, whose capacity is reused: a buffer that already holds a chunk of the
  // same size is neither reallocated nor cleared before the read.
  absl::Status ReadChunkFile(std::string_view hash, std::string* out) const;
  // A stored chunk opened for reading: a regular file of at most kMaxChunkSize bytes.
  absl::StatusOr<UniqueFd> OpenChunkFile(std::string_view hash, uint64_t* size) const;

  absl::Status ReadChunkFile(std::string_view hash,
                             const std::function<char*(size_t size)>& buffer_for) const;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_STORE_INTERNAL_H_
