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
namespace {

// Progress callbacks are for a progress bar: more than ~20 a second is noise on the wire.
constexpr int64_t kProgressIntervalMs = 50;
// Writes of one chunk name are serialised by a lock picked by the hash's first byte. The chunk's
// subdirectory is also picked by that byte, so one stripe also covers creating the subdirectory.
constexpr size_t kWriteStripes = 64;
constexpr size_t kChunkHexBytes = 2 * common::kSha256Size;
// Entries read from one directory of the store at most (Open, Verify, Gc); a store holds at most
// its quota's files_max chunks, spread over 256 subdirectories.
constexpr size_t kDirEntriesMax = 10'000'000;
// Verified manifests of complete artifacts kept in memory (see Impl::CacheLookup).
constexpr size_t kManifestCacheEntries = 16;
constexpr size_t kManifestCacheBytesMax = 64u << 20;
// Alignment of buffer, offset and length for O_DIRECT writes: a page covers every logical block
// size in use.
constexpr size_t kDirectIoAlignBytes = 4096;

std::string Hex(std::string_view bytes) { return common::HexEncode(bytes); }

std::string Errno(int err) { return std::strerror(err); }

absl::Status IoError(int err, std::string_view what) {
  const std::string message = absl::StrCat(common::AsAbsl(what), ": ", Errno(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

// Name of a chunk under chunks/: "<first 2 hex>/<64 hex>".
std::string ChunkName(std::string_view hex) {
  return absl::StrCat(common::AsAbsl(hex.substr(0, 2)), "/", common::AsAbsl(hex));
}

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Whether `name`, found in chunks/<subdir>/, is a chunk's name; sets *hash to the hash.
bool ParseChunkName(std::string_view subdir, std::string_view name, std::string* hash) {
  if (name.size() != kChunkHexBytes || !IsLowerHex(name) || name.substr(0, 2) != subdir) {
    return false;
  }
  auto decoded = common::HexDecode(name);
  if (!decoded.ok()) return false;
  *hash = *std::move(decoded);
  return true;
}

bool ValidKind(std::string_view kind) {
  if (kind.empty() || kind.size() > 32) return false;
  return std::all_of(kind.begin(), kind.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

// Names in a directory (not "." and ".."), in no particular order.
absl::StatusOr<std::vector<std::string>> ListNames(const SafeDir& dir) {
  // A descriptor of its own (not a dup, which would share the read offset with every other
  // listing of the same SafeDir).
  int own_fd;
  do {
    own_fd = ::openat(dir.fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (own_fd < 0 && errno == EINTR);
  if (own_fd < 0) return IoError(errno, absl::StrCat("open ", dir.path()));
  DIR* d = ::fdopendir(own_fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(own_fd);
    return IoError(err, absl::StrCat("fdopendir ", dir.path()));
  }
  std::vector<std::string> names;
  absl::Status status;
  while (true) {
    errno = 0;
    const struct dirent* entry = ::readdir(d);
    if (entry == nullptr) {
      if (errno != 0) status = IoError(errno, absl::StrCat("readdir ", dir.path()));
      break;
    }
    const std::string_view name(entry->d_name);
    if (name == "." || name == "..") continue;
    if (names.size() >= kDirEntriesMax) {
      status = absl::ResourceExhaustedError(
          absl::StrCat(dir.path(), ": more than ", kDirEntriesMax, " entries"));
      break;
    }
    names.emplace_back(name);
  }
  ::closedir(d);
  if (!status.ok()) return status;
  return names;
}

// lstat of `name` directly in `dir`. nullopt if absent.
absl::StatusOr<std::optional<struct stat>> StatAt(const SafeDir& dir, const std::string& name) {
  struct stat st;
  if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return std::optional<struct stat>();
    return IoError(errno, absl::StrCat("stat \"", name, "\" in ", dir.path()));
  }
  return std::optional<struct stat>(st);
}

// Removes an entry found by ListNames (a name without '/', so unlinkat resolves nothing but the
// entry itself, which is never followed). Directories are left alone.
void RemoveEntry(const SafeDir& dir, const std::string& name) {
  ::unlinkat(dir.fd(), name.c_str(), 0);
}

absl::Status FsyncFd(int fd, std::string_view what) {
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return IoError(errno, absl::StrCat("fsync ", common::AsAbsl(what)));
  return absl::OkStatus();
}

// fdatasync: for a file just written, what it flushes (the data, the size and the block map
// needed to read it back) is what fsync would; only the timestamps are left to the journal.
absl::Status DataSyncFd(int fd, std::string_view what) {
  int rc;
  do {
    rc = ::fdatasync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return IoError(errno, absl::StrCat("fdatasync ", common::AsAbsl(what)));
  return absl::OkStatus();
}

// Writes `data` to the new, empty file `fd`. When the buffer is aligned for direct I/O, the
// aligned part bypasses the page cache (O_DIRECT): a fetched chunk is written once from the
// fetcher's buffer to the disk instead of being copied into freshly allocated cache pages,
// which was most of a fetch's CPU on this kind of host. The tail, and every write where the
// filesystem refuses direct I/O, goes through the page cache. Durability still comes from the
// caller's fdatasync, which also flushes the device's cache.
absl::Status WriteNewFile(int fd, std::string_view data) {
  const size_t direct_bytes = data.size() & ~(kDirectIoAlignBytes - 1);
  const bool aligned = reinterpret_cast<uintptr_t>(data.data()) % kDirectIoAlignBytes == 0;
  const int flags = ::fcntl(fd, F_GETFL);
  if (aligned && direct_bytes > 0 && flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0) {
    size_t done = 0;
    while (done < direct_bytes) {
      const ssize_t n =
          ::pwrite(fd, data.data() + done, direct_bytes - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      // EINVAL: the device wants a larger alignment; a short write leaves an unaligned rest.
      // Either way the buffered path below rewrites from where this stopped.
      if (n <= 0 || static_cast<size_t>(n) % kDirectIoAlignBytes != 0) {
        if (n < 0 && errno != EINVAL) return IoError(errno, "write");
        if (n > 0) done += static_cast<size_t>(n);
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (::fcntl(fd, F_SETFL, flags) != 0) {
      return absl::InternalError(absl::StrCat("fcntl(F_SETFL): ", Errno(errno)));
    }
    if (::lseek(fd, static_cast<off_t>(done), SEEK_SET) < 0) {
      return absl::InternalError(absl::StrCat("lseek: ", Errno(errno)));
    }
    data.remove_prefix(done);
  }
  return WriteFull(fd, data);
}

// Each distinct chunk of a manifest with its size, in manifest order. INVALID_ARGUMENT if the
// manifest names one hash with two sizes (no data can match both).
absl::StatusOr<std::vector<std::pair<std::string, uint32_t>>> DistinctChunks(
    const pb::ManifestBody& body) {
  std::vector<std::pair<std::string, uint32_t>> out;
  absl::flat_hash_map<std::string, uint32_t> seen;
  const uint64_t chunk_size = body.chunk_size();
  for (int i = 0; i < body.files_size(); ++i) {
    const pb::ManifestFile& file = body.files(i);
    for (int c = 0; c < file.chunks_size(); ++c) {
      const uint64_t offset = static_cast<uint64_t>(c) * chunk_size;
      const auto size = static_cast<uint32_t>(std::min<uint64_t>(chunk_size, file.size() - offset));
      auto [it, inserted] = seen.emplace(file.chunks(c), size);
      if (inserted) {
        out.emplace_back(file.chunks(c), size);
      } else if (it->second != size) {
        return absl::InvalidArgumentError(
            absl::StrCat("manifest files[", i, "].chunks[", c, "]: chunk ", Hex(file.chunks(c)),
                         " of ", size, " bytes is named elsewhere with ", it->second, " bytes"));
      }
    }
  }
  return out;
}

// Calls a ProgressFn at most every kProgressIntervalMs, except when forced.
class ProgressThrottle {
 public:
  ProgressThrottle(const ProgressFn& fn, common::Clock* clock) : fn_(fn), clock_(clock) {}
  void Report(const pb::ArtifactProgress& progress, bool force) {
    if (!fn_) return;
    const int64_t now_ms = clock_->MonotonicMs();
    if (!force && last_ms_.has_value() && now_ms - *last_ms_ < kProgressIntervalMs) return;
    last_ms_ = now_ms;
    fn_(progress);
  }

 private:
  const ProgressFn& fn_;
  common::Clock* clock_;
  std::optional<int64_t> last_ms_;
};

}  // namespace

std::string ArtifactKey(uint64_t shard_id, std::string_view artifact_id) {
  return absl::StrCat(state::EncodeU64Key(shard_id), common::AsAbsl(artifact_id));
}

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
  mutable std::array<absl::Mutex, kWriteStripes> stripe_mu;

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

  absl::Status ReserveLocked(uint64_t bytes, uint64_t files) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto check = [](std::string_view what, uint64_t max, uint64_t used, uint64_t reserved,
                    uint64_t needed) -> absl::Status {
      const uint64_t have = used + reserved;
      if (have <= max && needed <= max - have) return absl::OkStatus();
      std::string message = absl::StrCat("artifact quota: ", max, " ", common::AsAbsl(what),
                                         " exceeded: ", used, " used + ");
      if (reserved > 0) absl::StrAppend(&message, reserved, " reserved + ");
      absl::StrAppend(&message, needed, " needed");
      return absl::ResourceExhaustedError(message);
    };
    TS_RETURN_IF_ERROR(check("bytes_max", quota.bytes_max, used_bytes, reserved_bytes, bytes));
    TS_RETURN_IF_ERROR(check("files_max", quota.files_max, used_files, reserved_files, files));
    reserved_bytes += bytes;
    reserved_files += files;
    return absl::OkStatus();
  }

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

  absl::Status PutRow(const VerifiedManifest& manifest, bool complete) {
    pb::StoredArtifact row;
    *row.mutable_manifest() = manifest.manifest;
    row.set_complete(complete);
    row.set_stored_unix_ms(clock->NowUnixMs());
    row.set_total_bytes(manifest.total_bytes);
    row.set_chunks(manifest.total_chunks);
    state::WriteBatch batch;
    batch.PutProto(kTableArtifacts, ArtifactKey(shard_id, manifest.id), row);
    absl::Status status = db->Write(batch, /*sync=*/true);
    CacheErase(manifest.id);
    return status;
  }

  // Deletes the row of `id` (synced).
  absl::Status DeleteRow(std::string_view id) {
    state::WriteBatch batch;
    batch.Delete(kTableArtifacts, ArtifactKey(shard_id, id));
    absl::Status status = db->Write(batch, /*sync=*/true);
    CacheErase(id);
    return status;
  }

  // nullopt if there is no row for `id`.
  absl::StatusOr<std::optional<pb::StoredArtifact>> GetRow(std::string_view id) const {
    pb::StoredArtifact row;
    absl::Status status = db->GetProto(kTableArtifacts, ArtifactKey(shard_id, id), &row);
    if (absl::IsNotFound(status)) return std::optional<pb::StoredArtifact>();
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("index row ", Hex(id), ": ", status.message()));
    }
    return std::optional<pb::StoredArtifact>(std::move(row));
  }

  // Every row of this shard: fn(id, row). DATA_LOSS for a key that does not decode, and for a
  // value that does not parse unless `unparsable_ok`, in which case fn gets a null row.
  absl::Status ScanRows(
      const std::function<absl::Status(const std::string&, const pb::StoredArtifact*)>& fn,
      bool unparsable_ok) const {
    absl::Status inner;
    absl::Status status = db->Scan(
        kTableArtifacts, state::EncodeU64Key(shard_id),
        [&](std::string_view key, std::string_view value) {
          const std::string_view id = key.substr(8);
          if (id.size() != common::kSha256Size) {
            inner = absl::DataLossError(absl::StrCat("index row key ", Hex(key), ": the id is ",
                                                     id.size(), " bytes, want 32"));
            return false;
          }
          pb::StoredArtifact row;
          const bool parsed = row.ParseFromArray(value.data(), static_cast<int>(value.size()));
          if (!parsed && !unparsable_ok) {
            inner = absl::DataLossError(
                absl::StrCat("index row ", Hex(id), ": does not parse as a StoredArtifact"));
            return false;
          }
          inner = fn(std::string(id), parsed ? &row : nullptr);
          return inner.ok();
        });
    TS_RETURN_IF_ERROR(status);
    return inner;
  }

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
  void CacheInsert(std::shared_ptr<const VerifiedManifest> manifest, uint64_t generation) const {
    // A parsed body takes about as much memory again as its encoding.
    const size_t bytes = 2 * manifest->manifest.body().size();
    if (bytes > kManifestCacheBytesMax) return;
    absl::MutexLock lock(&cache_mu);
    if (generation != cache_generation || cache.contains(manifest->id)) return;
    while (!cache.empty() && (cache.size() >= kManifestCacheEntries ||
                              cache_bytes + bytes > kManifestCacheBytesMax)) {
      cache_bytes -= 2 * cache.begin()->second->manifest.body().size();
      cache.erase(cache.begin());
    }
    cache_bytes += bytes;
    cache.emplace(manifest->id, std::move(manifest));
  }
  void CacheErase(std::string_view id) const {
    absl::MutexLock lock(&cache_mu);
    ++cache_generation;
    auto it = cache.find(std::string(id));
    if (it == cache.end()) return;
    cache_bytes -= 2 * it->second->manifest.body().size();
    cache.erase(it);
  }

  // The body of a row's manifest, decoded without the checks of VerifyManifest (for listing and
  // for the chunk references of Gc and Verify; the row was written by this store).
  static absl::StatusOr<pb::ManifestBody> RowBody(const std::string& id,
                                                  const pb::StoredArtifact& row) {
    pb::ManifestBody body;
    if (!body.ParseFromString(row.manifest().body())) {
      return absl::DataLossError(
          absl::StrCat("index row ", Hex(id), ": manifest body does not parse"));
    }
    return body;
  }

  absl::StatusOr<VerifiedManifest> VerifyRow(std::string_view id,
                                             const pb::StoredArtifact& row) const {
    auto verified = VerifyManifest(row.manifest(), chain_id, shard_id, id);
    if (!verified.ok()) {
      return absl::DataLossError(absl::StrCat("index row ", Hex(id), ": stored manifest fails ",
                                              "verification: ", verified.status().message()));
    }
    return verified;
  }

  // ---- chunk files

  // chunks/<sub>; nullopt if absent and !create. The caller holds the stripe of the subdirectory
  // when creating it.
  absl::StatusOr<std::optional<SafeDir>> ChunkSubdir(std::string_view sub, bool create) const {
    auto dir = chunks.OpenDir(sub, /*create=*/false);
    if (dir.ok()) return std::optional<SafeDir>(*std::move(dir));
    if (!absl::IsNotFound(dir.status())) return dir.status();
    if (!create) return std::optional<SafeDir>();
    TS_ASSIGN_OR_RETURN(SafeDir made, chunks.OpenDir(sub, /*create=*/true));
    return std::optional<SafeDir>(std::move(made));
  }

  // The stat of chunk `hash` (its final component not followed); nullopt if absent.
  absl::StatusOr<std::optional<struct stat>> StatChunk(std::string_view hash) const {
    const std::string hex = Hex(hash);
    TS_ASSIGN_OR_RETURN(std::optional<SafeDir> sub, ChunkSubdir(hex.substr(0, 2), false));
    if (!sub.has_value()) return std::optional<struct stat>();
    return StatAt(*sub, hex);
  }

  // Whether chunk `hash` is stored as a servable file: a regular file with one link, of `size`
  // bytes (any size up to kMaxChunkSize when size is nullopt). Errors count as absent.
  bool ChunkPresent(std::string_view hash, std::optional<uint64_t> size) const {
    auto st = StatChunk(hash);
    if (!st.ok() || !st->has_value()) return false;
    const struct stat& s = **st;
    if (!S_ISREG(s.st_mode) || s.st_nlink != 1) return false;
    const auto file_size = static_cast<uint64_t>(s.st_size);
    return size.has_value() ? file_size == *size : file_size <= kMaxChunkSize;
  }

  // Stores chunk `hash` (whose data the caller has verified) unless a file of the right size is
  // already there. `covered`: the caller holds a quota reservation for it; otherwise quota is
  // reserved here for the write. Durable when it returns; true if it wrote the file.
  absl::StatusOr<bool> WriteChunk(const std::string& hash, std::string_view data, bool covered)
      ABSL_SHARED_LOCKS_REQUIRED(io_mu) {
    const std::string hex = Hex(hash);
    absl::MutexLock stripe(&stripe_mu[static_cast<uint8_t>(hash[0]) % kWriteStripes]);
    TS_ASSIGN_OR_RETURN(std::optional<SafeDir> sub, ChunkSubdir(hex.substr(0, 2), true));
    TS_ASSIGN_OR_RETURN(std::optional<struct stat> existing, StatAt(*sub, hex));
    // A regular file there was counted in the usage; anything else (a planted link) was not.
    bool counted = false;
    uint64_t old_size = 0;
    if (existing.has_value()) {
      if (S_ISDIR(existing->st_mode)) {
        return absl::FailedPreconditionError(
            absl::StrCat("chunk file ", sub->path(), "/", hex, " is a directory"));
      }
      if (S_ISREG(existing->st_mode)) {
        counted = true;
        old_size = static_cast<uint64_t>(existing->st_size);
        // The name is the hash checked before the rename; a file of another size or with other
        // links was not put there by this store and is replaced.
        if (existing->st_nlink == 1 && old_size == data.size()) return false;
      }
    }
    if (!covered) {
      absl::MutexLock lock(&mu);
      TS_RETURN_IF_ERROR(ReserveLocked(data.size(), 1));
    }
    absl::Status status = WriteDurably(*sub, hex, data);
    {
      absl::MutexLock lock(&mu);
      if (!covered) ReleaseLocked(data.size(), 1);
      if (status.ok()) {
        used_bytes = used_bytes - std::min(used_bytes, old_size) + data.size();
        if (!counted) ++used_files;
      }
    }
    TS_RETURN_IF_ERROR(status);
    return true;
  }

  // tmp/<name> → write → fdatasync → rename to chunks/<2 hex>/<hex> → fsync of the subdirectory.
  absl::Status WriteDurably(const SafeDir& sub, const std::string& hex,
                            std::string_view data) const {
    const std::string temp_name = absl::StrCat(hex, ".", ::getpid(), ".", temp_counter_next());
    TS_ASSIGN_OR_RETURN(UniqueFd fd, tmp.CreateExclusive(temp_name));
    absl::Status status = WriteNewFile(fd.get(), data);
    if (status.ok()) status = DataSyncFd(fd.get(), absl::StrCat(tmp.path(), "/", temp_name));
    if (status.ok() && ::close(fd.release()) != 0 && errno != EINTR) {
      status = IoError(errno, absl::StrCat("close ", tmp.path(), "/", temp_name));
    }
    if (status.ok() && ::renameat(tmp.fd(), temp_name.c_str(), sub.fd(), hex.c_str()) != 0) {
      status = IoError(
          errno, absl::StrCat("rename ", tmp.path(), "/", temp_name, " to ", sub.path(), "/", hex));
    }
    if (!status.ok()) {
      RemoveEntry(tmp, temp_name);
      return status;
    }
    return sub.Sync();
  }

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
      ABSL_LOCKS_EXCLUDED(io_mu, mu) {
    auto annotate = [&](std::string_view what) {
      return absl::Status(failure.code(),
                          absl::StrCat(failure.message(), " (", common::AsAbsl(what), ")"));
    };
    auto kept = [&](std::string_view why) {
      return annotate(absl::StrCat("the ", written.size(), " chunk files it wrote are kept: ",
                                   common::AsAbsl(why), "; `artifact gc` removes them"));
    };
    if (keep_all) return kept("its index row may yet appear");
    absl::WriterMutexLock io(&io_mu);
    absl::flat_hash_set<std::string> removable;
    {
      absl::MutexLock lock(&mu);
      for (const std::string& hash : written) {
        auto pin = publish_pins.find(hash);
        const int own = own_pins.contains(hash) ? 1 : 0;
        if (pin != publish_pins.end() && pin->second > own) continue;
        bool fetched = false;
        for (const auto& [id, fetch] : fetches) {
          if (fetch.info->sizes.contains(hash)) {
            fetched = true;
            break;
          }
        }
        if (!fetched) removable.insert(hash);
      }
    }
    bool unreadable_row = false;
    absl::Status scanned = ScanRows(
        [&](const std::string& id, const pb::StoredArtifact* row) {
          if (row == nullptr) {
            unreadable_row = true;
            return absl::OkStatus();
          }
          TS_ASSIGN_OR_RETURN(pb::ManifestBody body, RowBody(id, *row));
          for (const pb::ManifestFile& file : body.files()) {
            for (const std::string& hash : file.chunks()) removable.erase(hash);
          }
          return absl::OkStatus();
        },
        /*unparsable_ok=*/true);
    if (!scanned.ok()) return kept(absl::StrCat("reading the index failed: ", scanned.message()));
    // A row that does not parse could name any chunk.
    if (unreadable_row) return kept("an index row does not parse");

    uint64_t removed_files = 0;
    uint64_t removed_bytes = 0;
    absl::flat_hash_set<std::string> touched;
    for (const std::string& hash : removable) {
      const std::string hex = Hex(hash);
      auto sub = ChunkSubdir(hex.substr(0, 2), /*create=*/false);
      if (!sub.ok() || !sub->has_value()) continue;
      auto st = StatAt(**sub, hex);
      if (!st.ok() || !st->has_value() || !S_ISREG((*st)->st_mode)) continue;
      if (!(*sub)->Remove(hex).ok()) continue;
      ++removed_files;
      removed_bytes += static_cast<uint64_t>((*st)->st_size);
      touched.insert(hex.substr(0, 2));
    }
    for (const std::string& sub_name : touched) {
      auto sub = chunks.OpenDir(sub_name, /*create=*/false);
      if (sub.ok()) (void)sub->Sync();
    }
    {
      absl::MutexLock lock(&mu);
      used_bytes -= std::min(used_bytes, removed_bytes);
      used_files -= std::min(used_files, removed_files);
    }
    std::string what = absl::StrCat("removed the ", removed_files, " chunk files it wrote, ",
                                    removed_bytes, " bytes");
    if (removed_files < written.size()) {
      what = absl::StrCat("removed ", removed_files, " of the ", written.size(),
                          " chunk files it wrote, ", removed_bytes, " bytes; the other ",
                          written.size() - removed_files,
                          " are named by another artifact, publish or fetch");
    }
    return annotate(what);
  }

  // Every chunk-named entry under chunks/: fn(subdir, name, hash, stat). Entries of chunks/ that
  // are not two-hex directories are skipped (never followed); so are names in a subdirectory
  // that are not chunk names, which go to `strays` when it is non-null.
  absl::Status WalkChunks(
      const std::function<absl::Status(const SafeDir&, const std::string& name,
                                       const std::string& hash, const struct stat&)>& fn,
      std::vector<std::pair<std::string, std::string>>* strays) const {
    TS_ASSIGN_OR_RETURN(std::vector<std::string> subs, ListNames(chunks));
    std::sort(subs.begin(), subs.end());
    for (const std::string& sub_name : subs) {
      if (sub_name.size() != 2 || !IsLowerHex(sub_name)) continue;
      auto sub = chunks.OpenDir(sub_name, /*create=*/false);
      if (!sub.ok()) {
        // A link or a file planted where a subdirectory goes holds no chunk of this store.
        if (absl::IsFailedPrecondition(sub.status()) || absl::IsNotFound(sub.status())) continue;
        return sub.status();
      }
      TS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(*sub));
      std::sort(names.begin(), names.end());
      for (const std::string& name : names) {
        TS_ASSIGN_OR_RETURN(std::optional<struct stat> st, StatAt(*sub, name));
        if (!st.has_value()) continue;
        std::string hash;
        if (!ParseChunkName(sub_name, name, &hash)) {
          if (strays != nullptr && !S_ISDIR(st->st_mode)) strays->emplace_back(sub_name, name);
          continue;
        }
        TS_RETURN_IF_ERROR(fn(*sub, name, hash, *st));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CountUsage() {
    uint64_t bytes = 0;
    uint64_t files = 0;
    TS_RETURN_IF_ERROR(WalkChunks(
        [&](const SafeDir&, const std::string&, const std::string&, const struct stat& st) {
          if (S_ISREG(st.st_mode)) {
            bytes += static_cast<uint64_t>(st.st_size);
            ++files;
          }
          return absl::OkStatus();
        },
        nullptr));
    absl::MutexLock lock(&mu);
    used_bytes = bytes;
    used_files = files;
    return absl::OkStatus();
  }

  // Removes every entry of tmp/ but directories. Called with no chunk write in flight.
  absl::Status EmptyTmp() const {
    TS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(tmp));
    for (const std::string& name : names) RemoveEntry(tmp, name);
    if (!names.empty()) TS_RETURN_IF_ERROR(tmp.Sync());
    return absl::OkStatus();
  }

  // Reads chunk `hash` (a regular file with one link, at most kMaxChunkSize bytes).
  absl::StatusOr<std::string> ReadChunkFile(std::string_view hash) const {
    std::string data;
    TS_RETURN_IF_ERROR(ReadChunkFile(hash, &data));
    return data;
  }
  // The same into `out`, whose capacity is reused: a buffer that already holds a chunk of the
  // same size is neither reallocated nor cleared before the read.
  absl::Status ReadChunkFile(std::string_view hash, std::string* out) const {
    const std::string hex = Hex(hash);
    uint64_t size = 0;
    TS_ASSIGN_OR_RETURN(UniqueFd fd,
                        chunks.OpenRead(ChunkName(hex), /*refuse_hardlinks=*/true, &size));
    if (size > kMaxChunkSize) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", hex, ": ", size, " bytes, more than ", kMaxChunkSize));
    }
    absl::Status status = ReadFull(fd.get(), 0, static_cast<size_t>(size), out);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("chunk ", hex, ": ", status.message()));
    }
    return absl::OkStatus();
  }
  // A stored chunk opened for reading: a regular file of at most kMaxChunkSize bytes.
  absl::StatusOr<UniqueFd> OpenChunkFile(std::string_view hash, uint64_t* size) const {
    const std::string hex = Hex(hash);
    TS_ASSIGN_OR_RETURN(UniqueFd fd,
                        chunks.OpenRead(ChunkName(hex), /*refuse_hardlinks=*/true, size));
    if (*size > kMaxChunkSize) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", hex, ": ", *size, " bytes, more than ", kMaxChunkSize));
    }
    return fd;
  }

  absl::Status ReadChunkFile(std::string_view hash,
                             const std::function<char*(size_t size)>& buffer_for) const {
    const std::string hex = Hex(hash);
    uint64_t size = 0;
    TS_ASSIGN_OR_RETURN(UniqueFd fd, OpenChunkFile(hash, &size));
    char* out = buffer_for(static_cast<size_t>(size));
    if (out == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("chunk ", hex, ": no buffer for ", size, " bytes"));
    }
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pread(fd.get(), out + done, size - done, static_cast<off_t>(done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::InternalError(
            absl::StrCat("chunk ", hex, ": pread at ", done, ": ", Errno(errno)));
      }
      if (n == 0) {
        return absl::OutOfRangeError(absl::StrCat("chunk ", hex, ": short read: ", done, " of ",
                                                  size, " bytes (the file shrank)"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
};

ArtifactStore::ArtifactStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ArtifactStore::~ArtifactStore() = default;

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(
    const std::string& dir, state::Db* db, std::string chain_id, uint64_t shard_id,
    StoreQuota quota, common::Clock* clock) {
  TS_CHECK(db != nullptr && clock != nullptr);
  if (dir.empty() || dir.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("store dir: \"", dir, "\" is not absolute"));
  }
  if (chain_id.empty()) return absl::InvalidArgumentError("store chain_id: is empty");
  TS_ASSIGN_OR_RETURN(SafeDir root, SafeDir::Open(dir, /*create=*/true));
  TS_ASSIGN_OR_RETURN(SafeDir chunks, root.OpenDir("chunks", /*create=*/true));
  TS_ASSIGN_OR_RETURN(SafeDir tmp, root.OpenDir("tmp", /*create=*/true));
  TS_RETURN_IF_ERROR(root.Sync());
  // Fails early if the Db was opened without the table.
  TS_RETURN_IF_ERROR(db->Scan(kTableArtifacts, state::EncodeU64Key(shard_id),
                              [](std::string_view, std::string_view) { return false; }));
  auto impl = std::make_unique<Impl>(dir, std::move(root), std::move(chunks), std::move(tmp), db,
                                     std::move(chain_id), shard_id, quota, clock);
  TS_RETURN_IF_ERROR(impl->EmptyTmp());
  TS_RETURN_IF_ERROR(impl->CountUsage());
  return std::unique_ptr<ArtifactStore>(new ArtifactStore(std::move(impl)));
}

uint64_t ArtifactStore::shard_id() const { return impl_->shard_id; }
const std::string& ArtifactStore::chain_id() const { return impl_->chain_id; }

StoreUsage ArtifactStore::Usage() const {
  absl::MutexLock lock(&impl_->mu);
  StoreUsage usage;
  usage.bytes = impl_->used_bytes;
  usage.files = impl_->used_files;
  usage.reserved_bytes = impl_->reserved_bytes;
  usage.reserved_files = impl_->reserved_files;
  return usage;
}

absl::StatusOr<VerifiedManifest> ArtifactStore::Publish(const PublishOptions& options,
                                                        const common::PrivateKey& key,
                                                        const ProgressFn& progress) {
  Impl& s = *impl_;
  if (options.chunk_size < kMinChunkSize || options.chunk_size > kMaxChunkSize) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_size: ", options.chunk_size,
                                                   " is outside [", kMinChunkSize, ", ",
                                                   kMaxChunkSize, "]"));
  }
  if (!ValidKind(options.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind: \"", absl::CHexEscape(options.kind), "\" is not [a-z0-9-]{1,32}"));
  }
  if (!options.parent.empty() && options.parent.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(
        absl::StrCat("parent: ", options.parent.size(), " bytes, want 0 or 32"));
  }
  if (options.source_dir.empty() || options.source_dir.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("source_dir: \"", options.source_dir, "\" is not absolute"));
  }
  const uint64_t chunk_size = options.chunk_size;
  TS_ASSIGN_OR_RETURN(SafeDir source, SafeDir::Open(options.source_dir));
  SafeListLimits limits;
  limits.files_max = kMaxManifestFiles;
  limits.bytes_max = kMaxManifestChunks * chunk_size;
  TS_ASSIGN_OR_RETURN(std::vector<SafeFileEntry> entries,
                      source.ListFiles(/*refuse_hardlinks=*/true, limits));
  if (entries.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("source_dir: ", options.source_dir, " holds no regular file"));
  }
  std::sort(entries.begin(), entries.end(),
            [](const SafeFileEntry& a, const SafeFileEntry& b) { return a.name < b.name; });
  uint64_t total_bytes = 0;
  uint64_t total_chunks = 0;
  for (const SafeFileEntry& entry : entries) {
    total_bytes += entry.size;
    total_chunks += (entry.size + chunk_size - 1) / chunk_size;
  }
  if (total_chunks > kMaxManifestChunks) {
    return absl::ResourceExhaustedError(absl::StrCat("source_dir: ", options.source_dir, " makes ",
                                                     total_chunks, " chunks of ", chunk_size,
                                                     " bytes, more than ", kMaxManifestChunks));
  }

  // The quota is checked on the listed sizes before anything is written; what is not turned
  // into chunk files is released on every way out, as are the pins that keep Gc off this
  // publish's chunks until its row is written.
  struct Held {
    explicit Held(Impl* store) : s(store) {}
    Impl* s;
    uint64_t bytes = 0;
    uint64_t files = 0;
    absl::flat_hash_set<std::string> pins;
    ~Held() {
      absl::MutexLock lock(&s->mu);
      s->ReleaseLocked(bytes, files);
      for (const std::string& hash : pins) {
        auto it = s->publish_pins.find(hash);
        if (it != s->publish_pins.end() && --it->second == 0) s->publish_pins.erase(it);
      }
    }
  } held(&s);
  {
    absl::MutexLock lock(&s.mu);
    TS_RETURN_IF_ERROR(s.ReserveLocked(total_bytes, total_chunks));
    held.bytes = total_bytes;
    held.files = total_chunks;
  }

  // Chunk files this publish created (absent before it). If it fails they are removed again,
  // unless something else names them by then, so a failed publish does not leave its chunks
  // taking the space the next one needs.
  absl::flat_hash_set<std::string> written;
  bool keep_written = false;
  absl::StatusOr<VerifiedManifest> result = [&]() -> absl::StatusOr<VerifiedManifest> {
    ProgressThrottle throttle(progress, s.clock);
    pb::ArtifactProgress report;
    report.set_phase("hashing");
    report.set_bytes_total(total_bytes);
    report.set_chunks_total(static_cast<uint32_t>(total_chunks));
    throttle.Report(report, /*force=*/true);

    pb::ManifestBody body;
    std::string buffer;
    uint32_t present = 0;
    for (const SafeFileEntry& entry : entries) {
      uint64_t size = 0;
      TS_ASSIGN_OR_RETURN(UniqueFd fd,
                          source.OpenRead(entry.name, /*refuse_hardlinks=*/true, &size));
      auto changed = [&](uint64_t now_size) {
        return absl::AbortedError(absl::StrCat("source_dir: \"", entry.name, "\" in ",
                                               options.source_dir, " changed size while read (",
                                               entry.size, " bytes listed, ", now_size, " now)"));
      };
      if (size != entry.size) return changed(size);
      pb::ManifestFile* file = body.add_files();
      file->set_name(entry.name);
      file->set_size(entry.size);
      for (uint64_t offset = 0; offset < size; offset += chunk_size) {
        const auto n = static_cast<size_t>(std::min(chunk_size, size - offset));
        absl::Status read = ReadFull(fd.get(), offset, n, &buffer);
        if (absl::IsOutOfRange(read)) return changed(offset + buffer.size());
        if (!read.ok()) {
          return absl::Status(read.code(),
                              absl::StrCat("source_dir: \"", entry.name, "\": ", read.message()));
        }
        std::string hash = common::Sha256(buffer);
        {
          absl::MutexLock lock(&s.mu);
          if (held.pins.insert(hash).second) ++s.publish_pins[hash];
        }
        bool wrote = false;
        {
          absl::ReaderMutexLock io(&s.io_mu);
          TS_ASSIGN_OR_RETURN(wrote, s.WriteChunk(hash, buffer, /*covered=*/true));
        }
        {
          absl::MutexLock lock(&s.mu);
          s.ReleaseLocked(n, 1);
          held.bytes -= n;
          held.files -= 1;
        }
        if (wrote) {
          written.insert(hash);
        } else {
          ++present;
        }
        file->add_chunks(std::move(hash));
        report.set_bytes_done(report.bytes_done() + n);
        report.set_chunks_done(report.chunks_done() + 1);
        report.set_chunks_present(present);
        throttle.Report(report, /*force=*/false);
      }
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) {
        return IoError(errno, absl::StrCat("fstat \"", entry.name, "\" in ", options.source_dir));
      }
      if (static_cast<uint64_t>(st.st_size) != size) {
        return changed(static_cast<uint64_t>(st.st_size));
      }
    }
    throttle.Report(report, /*force=*/true);

    body.set_chain_id(s.chain_id);
    body.set_shard_id(s.shard_id);
    body.set_round(options.round);
    body.set_parent(options.parent);
    body.set_publisher(common::AddressFromPublicKey(key.public_key()));
    body.set_kind(options.kind);
    body.set_chunk_size(options.chunk_size);
    TS_ASSIGN_OR_RETURN(pb::Manifest manifest, SignManifest(key, std::move(body)));
    TS_ASSIGN_OR_RETURN(VerifiedManifest verified,
                        VerifyManifest(manifest, s.chain_id, s.shard_id, /*expected_id=*/""));
    {
      absl::ReaderMutexLock io(&s.io_mu);
      TS_ASSIGN_OR_RETURN(std::optional<pb::StoredArtifact> before, s.GetRow(verified.id));
      absl::Status put = s.PutRow(verified, /*complete=*/true);
      if (!put.ok()) {
        // A failed write may still reach the database (a log record whose sync failed comes
        // back when it reopens), and a complete row must never name removed chunks: only a
        // synced delete makes removing them safe. A row that was there before (the same
        // artifact published again) names them itself and stays.
        if (before.has_value() || !s.DeleteRow(verified.id).ok()) keep_written = true;
        return put;
      }
    }
    report.set_phase("manifest");
    report.set_artifact_id(verified.id);
    throttle.Report(report, /*force=*/true);
    return verified;
  }();
  if (result.ok() || written.empty()) return result;
  return s.UndoPublish(result.status(), written, held.pins, keep_written);
}

absl::StatusOr<FetchPlan> ArtifactStore::BeginFetch(const VerifiedManifest& manifest) {
  Impl& s = *impl_;
  if (manifest.id.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest id: ", manifest.id.size(), " bytes, want 32"));
  }
  if (manifest.body.chain_id() != s.chain_id) {
    return absl::InvalidArgumentError(absl::StrCat("manifest chain_id: \"",
                                                   manifest.body.chain_id(),
                                                   "\" is not this store's \"", s.chain_id, "\""));
  }
  if (manifest.body.shard_id() != s.shard_id) {
    return absl::InvalidArgumentError(absl::StrCat("manifest shard_id: ", manifest.body.shard_id(),
                                                   " is not this store's ", s.shard_id));
  }
  auto info = std::make_shared<Impl::FetchInfo>();
  info->manifest = manifest;
  TS_ASSIGN_OR_RETURN(info->chunks, DistinctChunks(manifest.body));
  info->sizes.reserve(info->chunks.size());
  for (const auto& [hash, size] : info->chunks) info->sizes.emplace(hash, size);

  absl::ReaderMutexLock io(&s.io_mu);
  FetchPlan plan;
  plan.manifest = manifest;
  Impl::Fetch fetch;
  for (const auto& [hash, size] : info->chunks) {
    if (s.ChunkPresent(hash, size)) {
      ++plan.present;
    } else {
      plan.missing.push_back(hash);
      plan.missing_bytes += size;
      fetch.reserved.insert(hash);
    }
  }
  TS_ASSIGN_OR_RETURN(std::optional<pb::StoredArtifact> row, s.GetRow(manifest.id));
  if (row.has_value() && row->complete() && plan.missing.empty()) return plan;

  fetch.reserved_bytes = plan.missing_bytes;
  fetch.reserved_files = plan.missing.size();
  fetch.info = info;
  {
    absl::MutexLock lock(&s.mu);
    if (s.fetches.contains(manifest.id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("artifact ", Hex(manifest.id), ": a fetch is already in progress"));
    }
    TS_RETURN_IF_ERROR(s.ReserveLocked(fetch.reserved_bytes, fetch.reserved_files));
    s.fetches.emplace(manifest.id, std::move(fetch));
  }
  // A complete row whose chunks went missing (removed from the disk) is no longer complete.
  if (!row.has_value() || row->complete()) {
    absl::Status status = s.PutRow(manifest, /*complete=*/false);
    if (!status.ok()) {
      absl::MutexLock lock(&s.mu);
      auto it = s.fetches.find(manifest.id);
      if (it != s.fetches.end() && it->second.info == info) s.EndFetchLocked(it);
      return status;
    }
  }
  return plan;
}

absl::StatusOr<VerifiedChunk> ArtifactStore::VerifyChunk(std::string_view artifact_id,
                                                         std::string_view hash,
                                                         std::string_view data) const {
  Impl& s = *impl_;
  if (hash.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk hash: ", hash.size(), " bytes, want 32"));
  }
  VerifiedChunk chunk;
  chunk.artifact_id_.assign(artifact_id);
  chunk.hash_.assign(hash);
  chunk.data_ = data;
  uint32_t expected_size = 0;
  {
    absl::MutexLock lock(&s.mu);
    auto it = s.fetches.find(chunk.artifact_id_);
    if (it == s.fetches.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("artifact ", Hex(artifact_id), ": no fetch in progress"));
    }
    auto size = it->second.info->sizes.find(chunk.hash_);
    if (size == it->second.info->sizes.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", Hex(hash), ": not named by the manifest of artifact ", Hex(artifact_id)));
    }
    expected_size = size->second;
  }
  if (data.size() != expected_size) {
    return absl::DataLossError(absl::StrCat("chunk ", Hex(hash), ": ", data.size(),
                                            " bytes, the manifest says ", expected_size));
  }
  const std::string actual = common::Sha256(data);
  if (actual != chunk.hash_) {
    return absl::DataLossError(
        absl::StrCat("chunk ", Hex(hash), ": the data hashes to ", Hex(actual)));
  }
  return chunk;
}

absl::Status ArtifactStore::PutVerifiedChunk(const VerifiedChunk& chunk) {
  Impl& s = *impl_;
  const std::string& key = chunk.hash_;
  bool covered = false;
  {
    absl::MutexLock lock(&s.mu);
    auto it = s.fetches.find(chunk.artifact_id_);
    if (it == s.fetches.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("artifact ", Hex(chunk.artifact_id_), ": no fetch in progress"));
    }
    covered = it->second.reserved.contains(key);
  }
  absl::ReaderMutexLock io(&s.io_mu);
  TS_ASSIGN_OR_RETURN(bool written, s.WriteChunk(key, chunk.data_, covered));
  (void)written;
  absl::MutexLock lock(&s.mu);
  auto it = s.fetches.find(chunk.artifact_id_);
  if (it != s.fetches.end() && it->second.reserved.erase(key) > 0) {
    const uint64_t size = chunk.data_.size();
    s.ReleaseLocked(size, 1);
    it->second.reserved_bytes -= size;
    it->second.reserved_files -= 1;
  }
  return absl::OkStatus();
}

absl::Status ArtifactStore::PutChunk(std::string_view artifact_id, std::string_view hash,
                                     std::string_view data) {
  TS_ASSIGN_OR_RETURN(VerifiedChunk chunk, VerifyChunk(artifact_id, hash, data));
  return PutVerifiedChunk(chunk);
}

absl::Status ArtifactStore::CompleteFetch(std::string_view artifact_id) {
  Impl& s = *impl_;
  if (artifact_id.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact id: ", artifact_id.size(), " bytes, want 32"));
  }
  const std::string id(artifact_id);
  absl::ReaderMutexLock io(&s.io_mu);
  std::shared_ptr<const Impl::FetchInfo> info;
  {
    absl::MutexLock lock(&s.mu);
    auto it = s.fetches.find(id);
    if (it != s.fetches.end()) info = it->second.info;
  }
  if (info == nullptr) {
    // No fetch in this process (e.g. after a restart): the row decides.
    TS_ASSIGN_OR_RETURN(std::optional<pb::StoredArtifact> row, s.GetRow(id));
    if (!row.has_value()) {
      return absl::NotFoundError(absl::StrCat("artifact ", Hex(id), ": not stored"));
    }
    if (row->complete()) return absl::OkStatus();
    auto made = std::make_shared<Impl::FetchInfo>();
    TS_ASSIGN_OR_RETURN(made->manifest, s.VerifyRow(id, *row));
    TS_ASSIGN_OR_RETURN(made->chunks, DistinctChunks(made->manifest.body));
    info = std::move(made);
  }
  size_t missing = 0;
  for (const auto& [hash, size] : info->chunks) {
    if (!s.ChunkPresent(hash, size)) ++missing;
  }
  if (missing > 0) {
    return absl::FailedPreconditionError(absl::StrCat("artifact ", Hex(id), ": ", missing, " of ",
                                                      info->chunks.size(), " chunks are missing"));
  }
  TS_RETURN_IF_ERROR(s.PutRow(info->manifest, /*complete=*/true));
  absl::MutexLock lock(&s.mu);
  auto it = s.fetches.find(id);
  if (it != s.fetches.end() && it->second.info == info) s.EndFetchLocked(it);
  return absl::OkStatus();
}

void ArtifactStore::AbandonFetch(std::string_view artifact_id) {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.mu);
  auto it = s.fetches.find(std::string(artifact_id));
  if (it != s.fetches.end()) s.EndFetchLocked(it);
}

absl::StatusOr<VerifiedManifest> ArtifactStore::GetManifest(std::string_view artifact_id,
                                                            bool complete_only) const {
  const Impl& s = *impl_;
  if (artifact_id.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact id: ", artifact_id.size(), " bytes, want 32"));
  }
  if (std::shared_ptr<const VerifiedManifest> cached = s.CacheLookup(artifact_id)) {
    return *cached;
  }
  const uint64_t generation = s.CacheGeneration();
  TS_ASSIGN_OR_RETURN(std::optional<pb::StoredArtifact> row, s.GetRow(artifact_id));
  if (!row.has_value()) {
    return absl::NotFoundError(absl::StrCat("artifact ", Hex(artifact_id), ": not stored"));
  }
  if (complete_only && !row->complete()) {
    return absl::NotFoundError(
        absl::StrCat("artifact ", Hex(artifact_id), ": not complete here (a fetch is unfinished)"));
  }
  TS_ASSIGN_OR_RETURN(VerifiedManifest verified, s.VerifyRow(artifact_id, *row));
  if (row->complete()) {
    s.CacheInsert(std::make_shared<const VerifiedManifest>(verified), generation);
  }
  return verified;
}

absl::StatusOr<std::string> ArtifactStore::ReadChunk(std::string_view hash) const {
  if (hash.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk hash: ", hash.size(), " bytes, want 32"));
  }
  return impl_->ReadChunkFile(hash);
}

absl::Status ArtifactStore::ReadChunk(std::string_view hash, std::string* out) const {
  if (hash.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk hash: ", hash.size(), " bytes, want 32"));
  }
  return impl_->ReadChunkFile(hash, out);
}

absl::Status ArtifactStore::ReadChunkInto(
    std::string_view hash, const std::function<char*(size_t size)>& buffer_for) const {
  if (hash.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk hash: ", hash.size(), " bytes, want 32"));
  }
  return impl_->ReadChunkFile(hash, buffer_for);
}

absl::StatusOr<UniqueFd> ArtifactStore::OpenChunk(std::string_view hash, uint64_t* size) const {
  if (hash.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk hash: ", hash.size(), " bytes, want 32"));
  }
  return impl_->OpenChunkFile(hash, size);
}

bool ArtifactStore::HasChunk(std::string_view hash) const {
  if (hash.size() != common::kSha256Size) return false;
  return impl_->ChunkPresent(hash, std::nullopt);
}

absl::StatusOr<std::vector<pb::ArtifactSummary>> ArtifactStore::List(
    bool include_incomplete) const {
  const Impl& s = *impl_;
  std::vector<pb::ArtifactSummary> out;
  TS_RETURN_IF_ERROR(s.ScanRows(
      [&](const std::string& id, const pb::StoredArtifact* row_ptr) {
        const pb::StoredArtifact& row = *row_ptr;
        if (!row.complete() && !include_incomplete) return absl::OkStatus();
        TS_ASSIGN_OR_RETURN(pb::ManifestBody body, Impl::RowBody(id, row));
        pb::ArtifactSummary& summary = out.emplace_back();
        summary.set_artifact_id(id);
        summary.set_shard_id(s.shard_id);
        summary.set_round(body.round());
        summary.set_kind(body.kind());
        summary.set_publisher(body.publisher());
        summary.set_parent(body.parent());
        summary.set_total_bytes(row.total_bytes());
        summary.set_files(static_cast<uint32_t>(body.files_size()));
        summary.set_chunks(row.chunks());
        summary.set_complete(row.complete());
        summary.set_stored_unix_ms(row.stored_unix_ms());
        return absl::OkStatus();
      },
      /*unparsable_ok=*/false));
  return out;
}

absl::StatusOr<pb::VerifyArtifactsResponse> ArtifactStore::Verify() const {
  const Impl& s = *impl_;
  absl::WriterMutexLock io(&s.io_mu);
  pb::VerifyArtifactsResponse response;
  // Chunks some row or operation in progress names, and those a complete artifact needs.
  absl::flat_hash_set<std::string> referenced;
  absl::flat_hash_set<std::string> needed;
  {
    absl::MutexLock lock(&s.mu);
    for (const auto& [hash, count] : s.publish_pins) referenced.insert(hash);
    for (const auto& [id, fetch] : s.fetches) {
      for (const auto& [hash, size] : fetch.info->chunks) referenced.insert(hash);
    }
  }
  std::vector<std::string> incomplete;
  TS_RETURN_IF_ERROR(s.ScanRows(
      [&](const std::string& id, const pb::StoredArtifact* row_ptr) {
        const pb::StoredArtifact& row = *row_ptr;
        TS_ASSIGN_OR_RETURN(pb::ManifestBody body, Impl::RowBody(id, row));
        if (row.complete()) {
          response.set_artifacts_checked(response.artifacts_checked() + 1);
        } else {
          incomplete.push_back(Hex(id));
        }
        for (const pb::ManifestFile& file : body.files()) {
          for (const std::string& hash : file.chunks()) {
            referenced.insert(hash);
            if (row.complete()) needed.insert(hash);
          }
        }
        return absl::OkStatus();
      },
      /*unparsable_ok=*/false));

  absl::flat_hash_set<std::string> present;
  std::vector<std::string> modified;
  std::vector<std::string> unreferenced;
  TS_RETURN_IF_ERROR(s.WalkChunks(
      [&](const SafeDir&, const std::string& name, const std::string& hash,
          const struct stat& st) -> absl::Status {
        present.insert(hash);
        bool ok = false;
        if (S_ISREG(st.st_mode)) {
          auto data = s.ReadChunkFile(hash);
          if (data.ok()) {
            ok = common::Sha256(*data) == hash;
          } else if (absl::IsNotFound(data.status())) {
            present.erase(hash);  // removed from under us: not a chunk any more
            return absl::OkStatus();
          } else if (!absl::IsFailedPrecondition(data.status()) &&
                     !absl::IsOutOfRange(data.status())) {
            return data.status();
          }
        }
        if (!ok) {
          modified.push_back(name);
        } else if (referenced.contains(hash)) {
          response.set_chunks_ok(response.chunks_ok() + 1);
        } else {
          unreferenced.push_back(name);
          response.set_unreferenced_bytes(response.unreferenced_bytes() +
                                          static_cast<uint64_t>(st.st_size));
        }
        return absl::OkStatus();
      },
      nullptr));
  std::vector<std::string> missing;
  for (const std::string& hash : needed) {
    if (!present.contains(hash)) missing.push_back(Hex(hash));
  }
  std::sort(missing.begin(), missing.end());
  std::sort(incomplete.begin(), incomplete.end());
  for (std::string& hex : modified) response.add_modified(std::move(hex));
  for (std::string& hex : missing) response.add_missing(std::move(hex));
  for (std::string& hex : unreferenced) response.add_unreferenced(std::move(hex));
  for (std::string& hex : incomplete) response.add_incomplete(std::move(hex));
  return response;
}

absl::StatusOr<pb::GcArtifactsResponse> ArtifactStore::Gc(const std::vector<std::string>& drop_ids,
                                                          bool drop_incomplete) {
  Impl& s = *impl_;
  absl::flat_hash_set<std::string> drop;
  for (size_t i = 0; i < drop_ids.size(); ++i) {
    if (drop_ids[i].size() != common::kSha256Size) {
      return absl::InvalidArgumentError(
          absl::StrCat("drop_ids[", i, "]: ", drop_ids[i].size(), " bytes, want 32"));
    }
    drop.insert(drop_ids[i]);
  }
  absl::WriterMutexLock io(&s.io_mu);
  absl::flat_hash_set<std::string> keep;
  absl::flat_hash_set<std::string> in_progress;
  {
    absl::MutexLock lock(&s.mu);
    for (const auto& [hash, count] : s.publish_pins) keep.insert(hash);
    for (const auto& [id, fetch] : s.fetches) {
      in_progress.insert(id);
      for (const auto& [hash, size] : fetch.info->chunks) keep.insert(hash);
    }
  }
  for (size_t i = 0; i < drop_ids.size(); ++i) {
    // Read raw: a row whose value does not parse can still be dropped.
    absl::StatusOr<std::string> row =
        s.db->Get(kTableArtifacts, ArtifactKey(s.shard_id, drop_ids[i]));
    if (!row.ok() && !absl::IsNotFound(row.status())) return row.status();
    if (!row.ok()) {
      return absl::NotFoundError(
          absl::StrCat("drop_ids[", i, "]: artifact ", Hex(drop_ids[i]), " is not stored"));
    }
    if (in_progress.contains(drop_ids[i])) {
      return absl::FailedPreconditionError(
          absl::StrCat("drop_ids[", i, "]: artifact ", Hex(drop_ids[i]), " is being fetched"));
    }
  }

  state::WriteBatch batch;
  pb::GcArtifactsResponse response;
  std::vector<std::string> dropped_ids;
  TS_RETURN_IF_ERROR(s.ScanRows(
      [&](const std::string& id, const pb::StoredArtifact* row) {
        const bool dropped = drop.contains(id) || (drop_incomplete && row != nullptr &&
                                                   !row->complete() && !in_progress.contains(id));
        if (dropped) {
          batch.Delete(kTableArtifacts, ArtifactKey(s.shard_id, id));
          dropped_ids.push_back(id);
          return absl::OkStatus();
        }
        // A row that does not decode names chunks nobody can tell: collecting nothing is the
        // only safe answer until it is dropped by id.
        if (row == nullptr) {
          return absl::DataLossError(absl::StrCat("index row ", Hex(id),
                                                  ": does not parse as a StoredArtifact (drop it "
                                                  "by id to collect its chunks)"));
        }
        TS_ASSIGN_OR_RETURN(pb::ManifestBody body, Impl::RowBody(id, *row));
        for (const pb::ManifestFile& file : body.files()) {
          for (const std::string& hash : file.chunks()) keep.insert(hash);
        }
        return absl::OkStatus();
      },
      /*unparsable_ok=*/true));
  if (batch.size() > 0) TS_RETURN_IF_ERROR(s.db->Write(batch, /*sync=*/true));
  for (const std::string& id : dropped_ids) s.CacheErase(id);
  response.set_artifacts_dropped(static_cast<uint32_t>(dropped_ids.size()));

  std::vector<std::pair<std::string, std::string>> strays;
  absl::flat_hash_set<std::string> touched;
  uint64_t freed_files = 0;
  TS_RETURN_IF_ERROR(s.WalkChunks(
      [&](const SafeDir& sub, const std::string& name, const std::string& hash,
          const struct stat& st) -> absl::Status {
        if (S_ISDIR(st.st_mode)) return absl::OkStatus();
        if (S_ISREG(st.st_mode)) {
          if (keep.contains(hash)) return absl::OkStatus();
          absl::Status removed = sub.Remove(name);
          if (absl::IsNotFound(removed)) return absl::OkStatus();
          TS_RETURN_IF_ERROR(removed);
          response.set_chunks_removed(response.chunks_removed() + 1);
          response.set_bytes_freed(response.bytes_freed() + static_cast<uint64_t>(st.st_size));
          ++freed_files;
        } else {
          // A link, FIFO, device or socket where a chunk goes is no chunk: remove the entry
          // itself (never what it points to), so a fetch can put the real chunk back.
          RemoveEntry(sub, name);
        }
        touched.insert(name.substr(0, 2));
        return absl::OkStatus();
      },
      &strays));
  for (const auto& [sub_name, name] : strays) {
    auto sub = s.chunks.OpenDir(sub_name, /*create=*/false);
    if (!sub.ok()) continue;
    RemoveEntry(*sub, name);
    touched.insert(sub_name);
  }
  for (const std::string& sub_name : touched) {
    auto sub = s.chunks.OpenDir(sub_name, /*create=*/false);
    if (sub.ok()) TS_RETURN_IF_ERROR(sub->Sync());
  }
  {
    absl::MutexLock lock(&s.mu);
    s.used_bytes -= std::min(s.used_bytes, response.bytes_freed());
    s.used_files -= std::min(s.used_files, freed_files);
  }
  // No chunk write is in flight (this holds io_mu exclusively): whatever is in tmp/ is stray.
  TS_RETURN_IF_ERROR(s.EmptyTmp());
  return response;
}

absl::Status ArtifactStore::Export(std::string_view artifact_id, const std::string& out_dir,
                                   const ProgressFn& progress) const {
  const Impl& s = *impl_;
  if (out_dir.empty() || out_dir.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat("out_dir: \"", out_dir, "\" is not absolute"));
  }
  if (out_dir == s.path ||
      (out_dir.size() > s.path.size() && out_dir.compare(0, s.path.size(), s.path) == 0 &&
       out_dir[s.path.size()] == '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("out_dir: ", out_dir, " is inside the artifact store ", s.path));
  }
  TS_ASSIGN_OR_RETURN(VerifiedManifest manifest, GetManifest(artifact_id, /*complete_only=*/true));
  TS_ASSIGN_OR_RETURN(SafeDir out, SafeDir::Open(out_dir, /*create=*/true));
  TS_ASSIGN_OR_RETURN(bool empty, out.Empty());
  if (!empty) {
    return absl::FailedPreconditionError(absl::StrCat("out_dir: ", out_dir, " is not empty"));
  }

  ProgressThrottle throttle(progress, s.clock);
  pb::ArtifactProgress report;
  report.set_phase("exporting");
  report.set_bytes_total(manifest.total_bytes);
  report.set_chunks_total(manifest.total_chunks);
  report.set_artifact_id(manifest.id);
  throttle.Report(report, /*force=*/true);

  // Files written so far, removed again if the export fails half-way.
  std::vector<std::string> created;
  absl::flat_hash_set<std::string> parents;
  auto fail = [&](absl::Status status) {
    for (const std::string& name : created) (void)out.Remove(name);
    return status;
  };
  const uint64_t chunk_size = manifest.body.chunk_size();
  for (int i = 0; i < manifest.body.files_size(); ++i) {
    const pb::ManifestFile& file = manifest.body.files(i);
    auto fd = out.CreateExclusive(file.name());
    if (!fd.ok()) return fail(fd.status());
    created.push_back(file.name());
    for (int c = 0; c < file.chunks_size(); ++c) {
      const std::string& hash = file.chunks(c);
      const uint64_t want = std::min<uint64_t>(chunk_size, file.size() - c * chunk_size);
      const std::string where = absl::StrCat("chunk ", Hex(hash), " of files[", i, "] \"",
                                             file.name(), "\" (chunk ", c, ")");
      auto data = s.ReadChunkFile(hash);
      if (!data.ok()) {
        if (absl::IsNotFound(data.status()) || absl::IsFailedPrecondition(data.status()) ||
            absl::IsOutOfRange(data.status())) {
          return fail(absl::DataLossError(
              absl::StrCat(where, ": unusable in the store: ", data.status().message())));
        }
        return fail(data.status());
      }
      if (data->size() != want || common::Sha256(*data) != hash) {
        return fail(absl::DataLossError(
            absl::StrCat(where, ": the stored bytes fail verification (", data->size(),
                         " bytes, want ", want, "); the store was modified")));
      }
      absl::Status written = WriteFull(fd->get(), *data);
      if (!written.ok()) {
        return fail(absl::Status(
            written.code(), absl::StrCat("out_dir: \"", file.name(), "\": ", written.message())));
      }
      report.set_bytes_done(report.bytes_done() + want);
      report.set_chunks_done(report.chunks_done() + 1);
      throttle.Report(report, /*force=*/false);
    }
    absl::Status synced = FsyncFd(fd->get(), absl::StrCat(out_dir, "/", file.name()));
    if (!synced.ok()) return fail(synced);
    const size_t slash = file.name().rfind('/');
    if (slash != std::string::npos) parents.insert(file.name().substr(0, slash));
  }
  // CreateExclusive made the subdirectories durable; their new entries need an fsync too.
  for (const std::string& parent : parents) {
    auto dir = out.OpenDir(parent, /*create=*/false);
    absl::Status synced = dir.ok() ? dir->Sync() : dir.status();
    if (!synced.ok()) return fail(synced);
  }
  absl::Status synced = out.Sync();
  if (!synced.ok()) return fail(synced);
  throttle.Report(report, /*force=*/true);
  return absl::OkStatus();
}

}  // namespace ts::sidecar
