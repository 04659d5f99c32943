// ArtifactStore's maintenance (store.h): listing, re-verifying, collecting and exporting
// artifacts (List, Verify, Gc, Export).
#include "sidecar/artifacts/store_internal.h"

namespace ts::sidecar {

using store_internal::Hex;
using store_internal::IoError;
using store_internal::ProgressThrottle;
using store_internal::RemoveEntry;

namespace {

absl::Status FsyncFd(int fd, std::string_view what) {
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return IoError(errno, absl::StrCat("fsync ", common::AsAbsl(what)));
  return absl::OkStatus();
}

}  // namespace

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
