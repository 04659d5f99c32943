#include "sidecar/artifacts/operator_service.h"

#include <functional>
#include <map>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/absl_view.h"
#include "common/crypto/bech32.h"
#include "common/hex.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/safe_fs.h"

namespace ts::sidecar {
namespace {

grpc::Status ToGrpc(const absl::Status& status) { return ToGrpcStatus(status); }

// A value from a request, quoted and cut so a long or odd one cannot flood a log or terminal.
std::string Quote(std::string_view text) {
  constexpr size_t kShownMax = 200;
  std::string shown;
  for (char c : text.substr(0, kShownMax)) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      shown.push_back(c);
    } else {
      absl::StrAppend(&shown, "\\x", common::HexEncode(std::string_view(&c, 1)));
    }
  }
  if (text.size() > kShownMax) shown += "...";
  return absl::StrCat("\"", shown, "\"");
}

absl::Status CheckShardId(uint64_t shard_id) {
  if (shard_id == 0) return absl::InvalidArgumentError("shard_id: 0 is not a shard id");
  return absl::OkStatus();
}

absl::Status CheckId(std::string_view field, std::string_view id, bool allow_empty) {
  if (id.size() == 32 || (allow_empty && id.empty())) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      common::AsAbsl(field), ": ", id.size(), " bytes, want 32", allow_empty ? " (or none)" : ""));
}

// An absolute path from the operator: trusted as a location (it may go through links the
// operator made), but it must be a plain absolute path without NUL, of bounded length.
absl::Status CheckAbsolutePath(std::string_view field, std::string_view path) {
  if (path.empty())
    return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(field), ": empty"));
  if (path.size() > kMaxOperatorPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(field), ": ", path.size(),
                                                   " bytes, more than ", kMaxOperatorPathBytes));
  }
  if (path.find('\0') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(field), ": ", Quote(path), " holds NUL"));
  }
  if (path.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(field), ": ", Quote(path), " is not absolute"));
  }
  return absl::OkStatus();
}

absl::Status CheckKind(std::string_view kind) {
  bool ok = !kind.empty() && kind.size() <= 32;
  for (char c : kind) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind: ", Quote(kind), " is not [a-z0-9-]{1,32}"));
  }
  return absl::OkStatus();
}

absl::Status CheckChunkSize(uint32_t chunk_size) {
  if (chunk_size == 0 || (chunk_size >= kMinChunkSize && chunk_size <= kMaxChunkSize)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("chunk_size: ", chunk_size, " is not in [",
                                                 kMinChunkSize, ", ", kMaxChunkSize, "]"));
}

// Holds one slot of the operation cap for the lifetime of a call.
class OperationSlot {
 public:
  OperationSlot(std::atomic<size_t>* count, size_t max) : count_(count) {
    acquired_ = count_->fetch_add(1) < max;
  }
  ~OperationSlot() { count_->fetch_sub(1); }
  OperationSlot(const OperationSlot&) = delete;
  OperationSlot& operator=(const OperationSlot&) = delete;
  bool acquired() const { return acquired_; }

 private:
  std::atomic<size_t>* count_;
  bool acquired_ = false;
};

// The latest progress of an operation running on its own thread, handed to the handler thread
// which alone writes to the stream.
class ProgressRelay {
 public:
  void Update(const pb::ArtifactProgress& progress) {
    absl::MutexLock lock(&mu_);
    latest_ = progress;
    latest_.set_done(false);
    ++version_;
  }
  void Finish(absl::StatusOr<pb::ArtifactProgress> result) {
    absl::MutexLock lock(&mu_);
    result_ = std::move(result);
    finished_ = true;
  }
  // Waits up to `timeout` for the operation to finish; returns whether it has, and copies the
  // latest progress and its version.
  bool Wait(absl::Duration timeout, pb::ArtifactProgress* latest, uint64_t* version) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
    *latest = latest_;
    *version = version_;
    return finished_;
  }
  absl::StatusOr<pb::ArtifactProgress> TakeResult() {
    absl::MutexLock lock(&mu_);
    return std::move(result_);
  }

 private:
  absl::Mutex mu_;
  pb::ArtifactProgress latest_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<pb::ArtifactProgress> result_ ABSL_GUARDED_BY(mu_) =
      absl::UnknownError("not finished");
};

using Operation = std::function<absl::StatusOr<pb::ArtifactProgress>(
    const ProgressFn& progress, const std::function<bool()>& cancelled)>;

// Runs `operation` on its own thread while this (the handler's) thread streams its progress:
// `first` at once, then the latest progress at most every kProgressIntervalMs and at least every
// kProgressHeartbeatMs, then the final message (done = true). A failed write means the client is
// gone: the operation sees `cancelled` and the call ends once it returns. `observer` (may be
// null) is told when the operation (`kind`) starts and ends, timed by `clock`.
grpc::Status StreamOperation(grpc::ServerContext* context,
                             grpc::ServerWriter<pb::ArtifactProgress>* writer,
                             const pb::ArtifactProgress& first, std::string_view kind,
                             TransferObserver* observer, common::Clock* clock,
                             const Operation& operation) {
  std::atomic<bool> client_gone{!writer->Write(first)};
  if (client_gone.load()) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  ProgressRelay relay;
  std::function<bool()> cancelled = [&] { return client_gone.load() || context->IsCancelled(); };
  std::thread worker([&] {
    if (observer != nullptr) observer->TransferStarted(kind);
    const int64_t start_ms = clock->MonotonicMs();
    absl::StatusOr<pb::ArtifactProgress> result =
        operation([&relay](const pb::ArtifactProgress& p) { relay.Update(p); }, cancelled);
    if (observer != nullptr) {
      observer->TransferEnded(kind, static_cast<double>(clock->MonotonicMs() - start_ms) / 1e3,
                              result.ok() ? &*result : nullptr);
    }
    relay.Finish(std::move(result));
  });
  uint64_t written_version = 0;
  absl::Time last_write = absl::Now();
  while (true) {
    pb::ArtifactProgress latest;
    uint64_t version = 0;
    bool finished = relay.Wait(absl::Milliseconds(kProgressIntervalMs), &latest, &version);
    if (finished) break;
    if (client_gone.load() || context->IsCancelled()) continue;
    bool heartbeat_due = absl::Now() - last_write >= absl::Milliseconds(kProgressHeartbeatMs);
    if (version == written_version && !heartbeat_due) continue;
    if (version == 0) latest = first;
    if (!writer->Write(latest)) {
      client_gone.store(true);
      continue;
    }
    written_version = version;
    last_write = absl::Now();
  }
  worker.join();
  absl::StatusOr<pb::ArtifactProgress> result = relay.TakeResult();
  if (!result.ok()) return ToGrpc(result.status());
  result->set_done(true);
  result->set_phase("done");
  if (client_gone.load() || !writer->Write(*result)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  return grpc::Status::OK;
}

// OK when `out_dir` does not exist or is an empty directory.
absl::Status CheckOutDirUsable(const std::string& out_dir) {
  auto existing = SafeDir::Open(out_dir);
  if (existing.ok()) {
    TS_ASSIGN_OR_RETURN(bool empty, existing->Empty());
    if (!empty) {
      return absl::FailedPreconditionError(
          absl::StrCat("out_dir: ", Quote(out_dir), " exists and is not empty"));
    }
  } else if (!absl::IsNotFound(existing.status())) {
    return absl::Status(existing.status().code(),
                        absl::StrCat("out_dir: ", existing.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ShardStoreRegistry

ShardStoreRegistry::ShardStoreRegistry(state::Db* db, ShardDirectory* directory,
                                       common::Clock* clock, ShardStoreRegistryOptions options)
    : db_(db),
      directory_(directory),
      clock_(clock),
      artifacts_dir_(std::move(options.artifacts_dir)),
      self_address_(std::move(options.self_address)),
      chain_id_(std::move(options.chain_id)) {}

ShardStoreRegistry::~ShardStoreRegistry() = default;

void ShardStoreRegistry::SetChainId(const std::string& chain_id) {
  absl::MutexLock lock(&mu_);
  if (chain_id_.empty()) chain_id_ = chain_id;
}

absl::StatusOr<ArtifactStore*> ShardStoreRegistry::StoreFor(uint64_t shard_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(shard_id);
    if (it != stores_.end()) return it->second.get();
  }
  absl::MutexLock open_lock(&open_mu_);
  std::string chain_id;
  {
    absl::MutexLock lock(&mu_);
    auto it = stores_.find(shard_id);
    if (it != stores_.end()) return it->second.get();
    chain_id = chain_id_;
  }
  if (chain_id.empty()) {
    return absl::UnavailableError(
        "artifact stores: the chain id is not known yet (the host has not reached the chain)");
  }
  TS_ASSIGN_OR_RETURN(ShardView view, directory_->Get(shard_id));
  if (view.Find(self_address_) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("this host (", self_address_, ") is not a member of shard ", shard_id));
  }
  StoreQuota quota;
  quota.bytes_max = view.quota_bytes_max;
  quota.files_max = view.quota_files_max;
  TS_ASSIGN_OR_RETURN(std::unique_ptr<ArtifactStore> store,
                      ArtifactStore::Open(absl::StrCat(artifacts_dir_, "/", shard_id), db_,
                                          chain_id, shard_id, quota, clock_));
  absl::MutexLock lock(&mu_);
  ArtifactStore* raw = store.get();
  stores_.emplace(shard_id, std::move(store));
  return raw;
}

// ---------------------------------------------------------------------------------------------
// ArtifactOperatorService

ArtifactOperatorService::ArtifactOperatorService(StoreRegistry* stores, ShardDirectory* directory,
                                                 common::PrivateKey key, common::Clock* clock,
                                                 ArtifactOperatorOptions options)
    : stores_(stores),
      directory_(directory),
      key_(std::move(key)),
      self_address_(common::AddressFromPublicKey(key_.public_key())),
      clock_(clock),
      options_(std::move(options)) {}

grpc::Status ArtifactOperatorService::Publish(grpc::ServerContext* context,
                                              const pb::PublishArtifactRequest* request,
                                              grpc::ServerWriter<pb::ArtifactProgress>* writer) {
  absl::Status valid = CheckShardId(request->shard_id());
  if (valid.ok()) valid = CheckAbsolutePath("source_dir", request->source_dir());
  if (valid.ok()) {
    valid = CheckPathAllowed("source_dir", request->source_dir(), request->shard_id());
  }
  if (valid.ok()) valid = CheckId("parent", request->parent(), /*allow_empty=*/true);
  if (valid.ok() && !request->kind().empty()) valid = CheckKind(request->kind());
  if (valid.ok()) valid = CheckChunkSize(request->chunk_size());
  if (!valid.ok()) return ToGrpc(valid);

  OperationSlot slot(&operations_, options_.max_concurrent_operations);
  if (!slot.acquired()) {
    return ToGrpc(absl::ResourceExhaustedError(
        absl::StrCat("too many publish and fetch calls running (at most ",
                     options_.max_concurrent_operations, "); try again later")));
  }
  auto store = stores_->StoreFor(request->shard_id());
  if (!store.ok()) return ToGrpc(store.status());

  PublishOptions options;
  options.source_dir = request->source_dir();
  options.round = request->round();
  options.parent = request->parent();
  if (!request->kind().empty()) options.kind = request->kind();
  if (request->chunk_size() != 0) options.chunk_size = request->chunk_size();

  pb::ArtifactProgress first;
  first.set_phase("hashing");
  ArtifactStore* const s = *store;
  return StreamOperation(context, writer, first, kTransferPublish, options_.observer, clock_,
                         [&](const ProgressFn& progress,
                             const std::function<bool()>&) -> absl::StatusOr<pb::ArtifactProgress> {
                           // Publishing has no cancellation point; it ends on its own, bounded by
                           // the source.
                           absl::Mutex last_mu;
                           pb::ArtifactProgress last;
                           auto manifest =
                               s->Publish(options, key_, [&](const pb::ArtifactProgress& p) {
                                 {
                                   absl::MutexLock lock(&last_mu);
                                   last = p;
                                 }
                                 progress(p);
                               });
                           if (!manifest.ok()) return manifest.status();
                           absl::MutexLock lock(&last_mu);
                           last.set_artifact_id(manifest->id);
                           last.set_bytes_total(manifest->total_bytes);
                           last.set_bytes_done(manifest->total_bytes);
                           last.set_chunks_total(manifest->total_chunks);
                           last.set_chunks_done(manifest->total_chunks);
                           return last;
                         });
}

grpc::Status ArtifactOperatorService::Fetch(grpc::ServerContext* context,
                                            const pb::FetchArtifactRequest* request,
                                            grpc::ServerWriter<pb::ArtifactProgress>* writer) {
  absl::Status valid = CheckShardId(request->shard_id());
  if (valid.ok()) valid = CheckId("artifact_id", request->artifact_id(), /*allow_empty=*/false);
  if (valid.ok() && static_cast<size_t>(request->peers_size()) > kMaxFetchPeers) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("peers: ", request->peers_size(), " entries, at most ", kMaxFetchPeers));
  }
  absl::flat_hash_set<std::string> named;
  for (int i = 0; valid.ok() && i < request->peers_size(); ++i) {
    const std::string& peer = request->peers(i);
    std::string field = absl::StrCat("peers[", i, "]");
    valid = common::ParseAddress(field, peer).status();
    if (valid.ok() && peer == self_address_) {
      valid = absl::InvalidArgumentError(absl::StrCat(field, ": ", peer, " is this host"));
    }
    if (valid.ok() && !named.insert(peer).second) {
      valid = absl::InvalidArgumentError(absl::StrCat(field, ": ", peer, " is given twice"));
    }
  }
  if (valid.ok() && !request->out_dir().empty()) {
    valid = CheckAbsolutePath("out_dir", request->out_dir());
    if (valid.ok()) valid = CheckPathAllowed("out_dir", request->out_dir(), request->shard_id());
  }
  FetcherOptions fetcher_options = options_.fetcher;
  if (valid.ok()) {
    const std::string& transport = request->transport();
    if (transport == "grpc") {
      fetcher_options.use_chunk_stream = false;
    } else if (!transport.empty() && transport != "auto") {
      valid = absl::InvalidArgumentError(absl::StrCat(
          "transport: \"", common::AsAbsl(transport.substr(0, 64)), "\" is not auto or grpc"));
    }
  }
  if (!valid.ok()) return ToGrpc(valid);

  OperationSlot slot(&operations_, options_.max_concurrent_operations);
  if (!slot.acquired()) {
    return ToGrpc(absl::ResourceExhaustedError(
        absl::StrCat("too many publish and fetch calls running (at most ",
                     options_.max_concurrent_operations, "); try again later")));
  }
  auto store = stores_->StoreFor(request->shard_id());
  if (!store.ok()) return ToGrpc(store.status());
  auto view = directory_->Get(request->shard_id());
  if (!view.ok()) return ToGrpc(view.status());

  FetchRequest fetch;
  fetch.shard_id = request->shard_id();
  fetch.artifact_id = request->artifact_id();
  if (request->peers_size() > 0) {
    for (int i = 0; i < request->peers_size(); ++i) {
      const ShardMember* member = view->Find(request->peers(i));
      if (member == nullptr) {
        return ToGrpc(absl::FailedPreconditionError(
            absl::StrCat("peers[", i, "]: ", request->peers(i), " is not a member of shard ",
                         request->shard_id())));
      }
      if (member->endpoint.empty()) {
        return ToGrpc(absl::FailedPreconditionError(absl::StrCat(
            "peers[", i, "]: member ", member->address, " advertises no shard endpoint")));
      }
      fetch.peers.push_back(PeerOf(*member));
    }
  } else {
    for (const ShardMember& member : view->members) {
      if (member.address == self_address_ || member.endpoint.empty()) continue;
      fetch.peers.push_back(PeerOf(member));
    }
    if (fetch.peers.empty()) {
      return ToGrpc(absl::FailedPreconditionError(absl::StrCat(
          "peers: shard ", request->shard_id(), " has no other member to fetch from")));
    }
  }
  // Refuse an unusable out_dir before a long transfer rather than after it.
  if (!request->out_dir().empty()) {
    if (absl::Status usable = CheckOutDirUsable(request->out_dir()); !usable.ok()) {
      return ToGrpc(usable);
    }
  }

  pb::ArtifactProgress first;
  first.set_phase("manifest");
  first.set_artifact_id(request->artifact_id());
  ArtifactStore* const s = *store;
  const std::string out_dir = request->out_dir();
  return StreamOperation(
      context, writer, first, kTransferFetch, options_.observer, clock_,
      [&](const ProgressFn& progress,
          const std::function<bool()>& cancelled) -> absl::StatusOr<pb::ArtifactProgress> {
        FetchContext fetch_context;
        fetch_context.key = &key_;
        fetch_context.self_address = self_address_;
        fetch_context.store = s;
        fetch_context.directory = directory_;
        fetch_context.clock = clock_;
        fetch_context.progress = progress;
        fetch_context.cancelled = cancelled;
        fetch_context.tls = options_.tls;
        auto result = FetchArtifact(fetch_context, fetch, fetcher_options);
        if (!result.ok()) {
          // UNAVAILABLE from the fetcher means the peers, not this host, could not be reached;
          // the client must not take it for its own connection failing.
          if (absl::IsUnavailable(result.status()) || absl::IsDeadlineExceeded(result.status())) {
            return absl::AbortedError(absl::StrCat("fetch incomplete (run it again to resume): ",
                                                   result.status().message()));
          }
          return result.status();
        }
        if (out_dir.empty()) return result;
        pb::ArtifactProgress done = *result;
        absl::Status exported =
            s->Export(fetch.artifact_id, out_dir, [&](const pb::ArtifactProgress& p) {
              pb::ArtifactProgress shown = done;
              shown.set_phase("exporting");
              shown.set_bytes_done(p.bytes_done());
              shown.set_bytes_total(p.bytes_total());
              shown.set_chunks_done(p.chunks_done());
              shown.set_chunks_total(p.chunks_total());
              progress(shown);
            });
        if (!exported.ok()) {
          return absl::Status(exported.code(),
                              absl::StrCat("fetched (complete in the store), but not exported: ",
                                           exported.message()));
        }
        return done;
      });
}

grpc::Status ArtifactOperatorService::List(grpc::ServerContext*,
                                           const pb::ListLocalArtifactsRequest* request,
                                           pb::ListArtifactsResponse* response) {
  if (absl::Status valid = CheckShardId(request->shard_id()); !valid.ok()) return ToGrpc(valid);
  auto store = stores_->StoreFor(request->shard_id());
  if (!store.ok()) return ToGrpc(store.status());
  auto list = (*store)->List(request->include_incomplete());
  if (!list.ok()) return ToGrpc(list.status());
  for (auto& summary : *list) *response->add_artifacts() = std::move(summary);
  return grpc::Status::OK;
}

grpc::Status ArtifactOperatorService::Verify(grpc::ServerContext*,
                                             const pb::VerifyArtifactsRequest* request,
                                             pb::VerifyArtifactsResponse* response) {
  if (absl::Status valid = CheckShardId(request->shard_id()); !valid.ok()) return ToGrpc(valid);
  auto store = stores_->StoreFor(request->shard_id());
  if (!store.ok()) return ToGrpc(store.status());
  auto report = (*store)->Verify();
  if (!report.ok()) return ToGrpc(report.status());
  *response = *std::move(report);
  return grpc::Status::OK;
}

grpc::Status ArtifactOperatorService::Gc(grpc::ServerContext*,
                                         const pb::GcArtifactsRequest* request,
                                         pb::GcArtifactsResponse* response) {
  absl::Status valid = CheckShardId(request->shard_id());
  if (valid.ok() && static_cast<size_t>(request->drop_artifacts_size()) > kMaxGcDrops) {
    valid = absl::InvalidArgumentError(absl::StrCat(
        "drop_artifacts: ", request->drop_artifacts_size(), " entries, at most ", kMaxGcDrops));
  }
  std::vector<std::string> drops;
  for (int i = 0; valid.ok() && i < request->drop_artifacts_size(); ++i) {
    valid = CheckId(absl::StrCat("drop_artifacts[", i, "]"), request->drop_artifacts(i),
                    /*allow_empty=*/false);
    drops.push_back(request->drop_artifacts(i));
  }
  if (!valid.ok()) return ToGrpc(valid);
  auto store = stores_->StoreFor(request->shard_id());
  if (!store.ok()) return ToGrpc(store.status());
  auto result = (*store)->Gc(drops, request->drop_incomplete());
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status ArtifactOperatorService::Find(grpc::ServerContext*,
                                           const pb::FindArtifactsRequest* request,
                                           pb::FindArtifactsResponse* response) {
  absl::Status valid = CheckShardId(request->shard_id());
  if (valid.ok() && !request->kind().empty()) valid = CheckKind(request->kind());
  if (!valid.ok()) return ToGrpc(valid);
  auto store = stores_->StoreFor(request->shard_id());
  if (!store.ok()) return ToGrpc(store.status());
  auto view = directory_->Get(request->shard_id());
  if (!view.ok()) return ToGrpc(view.status());
  std::vector<FetchPeer> peers;
  for (const ShardMember& member : view->members) {
    if (member.address == self_address_ || member.endpoint.empty()) continue;
    peers.push_back(PeerOf(member));
  }
  FetchContext context;
  context.key = &key_;
  context.self_address = self_address_;
  context.store = *store;
  context.directory = directory_;
  context.clock = clock_;
  context.tls = options_.tls;
  const std::vector<PeerArtifacts> answers = ListPeerArtifacts(
      context, request->shard_id(), peers, clock_->MonotonicMs() + kFindDeadlineMs);
  // One entry per artifact, with every member that holds it complete.
  std::map<std::string, pb::FoundArtifact> found;
  for (const PeerArtifacts& answer : answers) {
    if (!answer.artifacts.ok()) {
      response->add_unanswered(
          absl::StrCat(answer.address, ": ", answer.artifacts.status().message()));
      continue;
    }
    for (const pb::ArtifactSummary& a : *answer.artifacts) {
      if (!request->kind().empty() && a.kind() != request->kind()) continue;
      pb::FoundArtifact& entry = found[a.artifact_id()];
      if (!entry.has_summary()) *entry.mutable_summary() = a;
      entry.add_holders(answer.address);
    }
  }
  for (auto& [id, entry] : found) *response->add_artifacts() = std::move(entry);
  return grpc::Status::OK;
}

absl::Status ArtifactOperatorService::CheckPathAllowed(std::string_view field,
                                                       const std::string& path,
                                                       uint64_t shard_id) const {
  if (!options_.file_policy.has_value()) return absl::OkStatus();
  return CheckOperatorPath(*options_.file_policy, field, path, shard_id);
}

grpc::Status ArtifactOperatorService::Export(grpc::ServerContext*,
                                             const pb::ExportArtifactRequest* request,
                                             pb::ArtifactProgress* response) {
  absl::Status valid = CheckShardId(request->shard_id());
  if (valid.ok()) valid = CheckId("artifact_id", request->artifact_id(), /*allow_empty=*/false);
  if (valid.ok()) valid = CheckAbsolutePath("out_dir", request->out_dir());
  if (valid.ok()) valid = CheckPathAllowed("out_dir", request->out_dir(), request->shard_id());
  if (valid.ok()) valid = CheckOutDirUsable(request->out_dir());
  if (!valid.ok()) return ToGrpc(valid);
  auto store = stores_->StoreFor(request->shard_id());
  if (!store.ok()) return ToGrpc(store.status());
  pb::ArtifactProgress last;
  absl::Status exported = (*store)->Export(request->artifact_id(), request->out_dir(),
                                           [&](const pb::ArtifactProgress& p) { last = p; });
  if (!exported.ok()) return ToGrpc(exported);
  *response = last;
  response->set_phase("done");
  response->set_done(true);
  response->set_artifact_id(request->artifact_id());
  return grpc::Status::OK;
}

}  // namespace ts::sidecar
