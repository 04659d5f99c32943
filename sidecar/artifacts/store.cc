// ArtifactStore (store.h): opening a store, publishing, fetching and serving chunks. Impl's
// operations are in store_impl.cc; List, Verify, Gc and Export in store_maintenance.cc.
#include "sidecar/artifacts/store.h"

#include "sidecar/artifacts/store_internal.h"

namespace ts::sidecar {

using store_internal::Hex;
using store_internal::IoError;
using store_internal::ProgressThrottle;

namespace {

bool ValidKind(std::string_view kind) {
  if (kind.empty() || kind.size() > 32) return false;
  return std::all_of(kind.begin(), kind.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
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

}  // namespace

std::string ArtifactKey(uint64_t shard_id, std::string_view artifact_id) {
  return absl::StrCat(state::EncodeU64Key(shard_id), common::AsAbsl(artifact_id));
}

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

}  // namespace ts::sidecar
