// ArtifactStore::Impl's operations (store_internal.h): quota, index rows, the manifest cache and
// chunk files; the file helpers they use, and those the store's files share.
#include "sidecar/artifacts/store_internal.h"

namespace ts::sidecar {

using store_internal::Hex;
using store_internal::IoError;
using store_internal::kWriteStripes;
using store_internal::RemoveEntry;

namespace {

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

std::string Errno(int err) { return std::strerror(err); }

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

}  // namespace

namespace store_internal {

std::string Hex(std::string_view bytes) { return common::HexEncode(bytes); }

absl::Status IoError(int err, std::string_view what) {
  const std::string message = absl::StrCat(common::AsAbsl(what), ": ", Errno(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

void RemoveEntry(const SafeDir& dir, const std::string& name) {
  ::unlinkat(dir.fd(), name.c_str(), 0);
}

void ProgressThrottle::Report(const pb::ArtifactProgress& progress, bool force) {
  if (!fn_) return;
  const int64_t now_ms = clock_->MonotonicMs();
  if (!force && last_ms_.has_value() && now_ms - *last_ms_ < kProgressIntervalMs) return;
  last_ms_ = now_ms;
  fn_(progress);
}

}  // namespace store_internal

absl::Status ArtifactStore::Impl::ReserveLocked(uint64_t bytes, uint64_t files) {
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

absl::Status ArtifactStore::Impl::PutRow(const VerifiedManifest& manifest, bool complete) {
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

absl::Status ArtifactStore::Impl::DeleteRow(std::string_view id) {
  state::WriteBatch batch;
  batch.Delete(kTableArtifacts, ArtifactKey(shard_id, id));
  absl::Status status = db->Write(batch, /*sync=*/true);
  CacheErase(id);
  return status;
}

absl::StatusOr<std::optional<pb::StoredArtifact>> ArtifactStore::Impl::GetRow(
    std::string_view id) const {
  pb::StoredArtifact row;
  absl::Status status = db->GetProto(kTableArtifacts, ArtifactKey(shard_id, id), &row);
  if (absl::IsNotFound(status)) return std::optional<pb::StoredArtifact>();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("index row ", Hex(id), ": ", status.message()));
  }
  return std::optional<pb::StoredArtifact>(std::move(row));
}

absl::Status ArtifactStore::Impl::ScanRows(
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

void ArtifactStore::Impl::CacheInsert(std::shared_ptr<const VerifiedManifest> manifest,
                                      uint64_t generation) const {
  // A parsed body takes about as much memory again as its encoding.
  const size_t bytes = 2 * manifest->manifest.body().size();
  if (bytes > kManifestCacheBytesMax) return;
  absl::MutexLock lock(&cache_mu);
  if (generation != cache_generation || cache.contains(manifest->id)) return;
  while (!cache.empty() &&
         (cache.size() >= kManifestCacheEntries || cache_bytes + bytes > kManifestCacheBytesMax)) {
    cache_bytes -= 2 * cache.begin()->second->manifest.body().size();
    cache.erase(cache.begin());
  }
  cache_bytes += bytes;
  cache.emplace(manifest->id, std::move(manifest));
}

void ArtifactStore::Impl::CacheErase(std::string_view id) const {
  absl::MutexLock lock(&cache_mu);
  ++cache_generation;
  auto it = cache.find(std::string(id));
  if (it == cache.end()) return;
  cache_bytes -= 2 * it->second->manifest.body().size();
  cache.erase(it);
}

absl::StatusOr<pb::ManifestBody> ArtifactStore::Impl::RowBody(const std::string& id,
                                                              const pb::StoredArtifact& row) {
  pb::ManifestBody body;
  if (!body.ParseFromString(row.manifest().body())) {
    return absl::DataLossError(
        absl::StrCat("index row ", Hex(id), ": manifest body does not parse"));
  }
  return body;
}

absl::StatusOr<VerifiedManifest> ArtifactStore::Impl::VerifyRow(
    std::string_view id, const pb::StoredArtifact& row) const {
  auto verified = VerifyManifest(row.manifest(), chain_id, shard_id, id);
  if (!verified.ok()) {
    return absl::DataLossError(absl::StrCat("index row ", Hex(id), ": stored manifest fails ",
                                            "verification: ", verified.status().message()));
  }
  return verified;
}

absl::StatusOr<std::optional<SafeDir>> ArtifactStore::Impl::ChunkSubdir(std::string_view sub,
                                                                        bool create) const {
  auto dir = chunks.OpenDir(sub, /*create=*/false);
  if (dir.ok()) return std::optional<SafeDir>(*std::move(dir));
  if (!absl::IsNotFound(dir.status())) return dir.status();
  if (!create) return std::optional<SafeDir>();
  TS_ASSIGN_OR_RETURN(SafeDir made, chunks.OpenDir(sub, /*create=*/true));
  return std::optional<SafeDir>(std::move(made));
}

absl::StatusOr<std::optional<struct stat>> ArtifactStore::Impl::StatChunk(
    std::string_view hash) const {
  const std::string hex = Hex(hash);
  TS_ASSIGN_OR_RETURN(std::optional<SafeDir> sub, ChunkSubdir(hex.substr(0, 2), false));
  if (!sub.has_value()) return std::optional<struct stat>();
  return StatAt(*sub, hex);
}

bool ArtifactStore::Impl::ChunkPresent(std::string_view hash, std::optional<uint64_t> size) const {
  auto st = StatChunk(hash);
  if (!st.ok() || !st->has_value()) return false;
  const struct stat& s = **st;
  if (!S_ISREG(s.st_mode) || s.st_nlink != 1) return false;
  const auto file_size = static_cast<uint64_t>(s.st_size);
  return size.has_value() ? file_size == *size : file_size <= kMaxChunkSize;
}

absl::StatusOr<bool> ArtifactStore::Impl::WriteChunk(const std::string& hash, std::string_view data,
                                                     bool covered) {
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

absl::Status ArtifactStore::Impl::WriteDurably(const SafeDir& sub, const std::string& hex,
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

absl::Status ArtifactStore::Impl::UndoPublish(const absl::Status& failure,
                                              const absl::flat_hash_set<std::string>& written,
                                              const absl::flat_hash_set<std::string>& own_pins,
                                              bool keep_all) {
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

absl::Status ArtifactStore::Impl::WalkChunks(
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

absl::Status ArtifactStore::Impl::CountUsage() {
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

absl::Status ArtifactStore::Impl::EmptyTmp() const {
  TS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(tmp));
  for (const std::string& name : names) RemoveEntry(tmp, name);
  if (!names.empty()) TS_RETURN_IF_ERROR(tmp.Sync());
  return absl::OkStatus();
}

absl::StatusOr<std::string> ArtifactStore::Impl::ReadChunkFile(std::string_view hash) const {
  std::string data;
  TS_RETURN_IF_ERROR(ReadChunkFile(hash, &data));
  return data;
}

absl::Status ArtifactStore::Impl::ReadChunkFile(std::string_view hash, std::string* out) const {
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

absl::StatusOr<UniqueFd> ArtifactStore::Impl::OpenChunkFile(std::string_view hash,
                                                            uint64_t* size) const {
  const std::string hex = Hex(hash);
  TS_ASSIGN_OR_RETURN(UniqueFd fd,
                      chunks.OpenRead(ChunkName(hex), /*refuse_hardlinks=*/true, size));
  if (*size > kMaxChunkSize) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", hex, ": ", *size, " bytes, more than ", kMaxChunkSize));
  }
  return fd;
}

absl::Status ArtifactStore::Impl::ReadChunkFile(
    std::string_view hash, const std::function<char*(size_t size)>& buffer_for) const {
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
      return absl::OutOfRangeError(absl::StrCat("chunk ", hex, ": short read: ", done, " of ", size,
                                                " bytes (the file shrank)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace ts::sidecar
