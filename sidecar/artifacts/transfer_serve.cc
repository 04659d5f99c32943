// The serving side of the artifact transfer (transfer.h): ArtifactTransferService's methods,
// the checks of a chunk request, and GetChunks answers encoded by hand around the chunk's bytes.
#include "sidecar/artifacts/transfer.h"

#include <cstring>
#include <exception>
#include <utility>

#include <grpc/slice.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/method_handler.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/transfer_internal.h"

namespace ts::sidecar {

using transfer_internal::CheckArtifactId;
using transfer_internal::Hex;

namespace {

// Runs a handler body, mapping its status and any exception (the RPC edge catches) to gRPC.
template <typename Fn>
grpc::Status Serve(Fn&& fn) {
  try {
    return ToGrpcStatus(fn());
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("internal error: ", e.what()));
  }
}

size_t VarintBytes(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

// Bytes of a ChunkData's encoding before its data: hash (field 1, 32 bytes), then the data's
// tag and length (field 2).
size_t ChunkDataHeaderBytes(size_t data_size) {
  return 2 + common::kSha256Size + 1 + VarintBytes(data_size);
}

// Writes that header to out (ChunkDataHeaderBytes(data_size) bytes); returns its size. The same
// bytes protobuf writes for a ChunkData with hash and data set, so either side may be generated.
size_t EncodeChunkDataHeader(std::string_view hash, size_t data_size, char* out) {
  char* p = out;
  *p++ = static_cast<char>((1 << 3) | 2);
  *p++ = static_cast<char>(hash.size());
  std::memcpy(p, hash.data(), hash.size());
  p += hash.size();
  *p++ = static_cast<char>((2 << 3) | 2);
  uint64_t value = data_size;
  while (value >= 0x80) {
    *p++ = static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  *p++ = static_cast<char>(value);
  return static_cast<size_t>(p - out);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ArtifactTransferService

absl::Status ArtifactTransferService::CheckReadable(ShardRole role, std::string_view kind,
                                                    std::string_view artifact_id) {
  if (role == ShardRole::kMember || kind == kReaderKind) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("artifact ", Hex(artifact_id), " is a ", common::AsAbsl(kind).substr(0, 32),
                   "; a reader of the shard may fetch checkpoints only"));
}

ArtifactTransferService::ArtifactTransferService(StoreRegistry* stores, ShardDirectory* directory,
                                                 PeerRequestVerifier* verifier,
                                                 TransferServiceOptions options)
    : stores_(stores), directory_(directory), verifier_(verifier), options_(options) {
  MarkMethodStreamed(
      kGetChunksMethodIndex,
      new grpc::internal::SplitServerStreamingHandler<pb::GetChunksRequest, grpc::ByteBuffer>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<pb::GetChunksRequest, grpc::ByteBuffer>* stream) {
            return GetChunksRaw(context, stream);
          }));
}

grpc::Status ArtifactTransferService::GetManifest(grpc::ServerContext* context,
                                                  const pb::GetManifestRequest* request,
                                                  pb::GetManifestResponse* response) {
  return Serve([&]() -> absl::Status {
    TS_ASSIGN_OR_RETURN(ShardRole role, Authorize(*request, kMethodGetManifest));
    TS_RETURN_IF_ERROR(CheckArtifactId("artifact_id", request->artifact_id()));
    TS_ASSIGN_OR_RETURN(ArtifactStore * store, stores_->StoreFor(request->shard_id()));
    TS_ASSIGN_OR_RETURN(VerifiedManifest manifest,
                        store->GetManifest(request->artifact_id(), /*complete_only=*/true));
    TS_RETURN_IF_ERROR(CheckReadable(role, manifest.body.kind(), request->artifact_id()));
    *response->mutable_manifest() = std::move(manifest.manifest);
    return absl::OkStatus();
  });
}

absl::StatusOr<ChunkServing> ArtifactTransferService::BeginChunks(
    const pb::GetChunksRequest& request, std::string_view method) {
  TS_ASSIGN_OR_RETURN(ShardRole role, Authorize(request, method));
  TS_RETURN_IF_ERROR(CheckArtifactId("artifact_id", request.artifact_id()));
  const size_t count = static_cast<size_t>(request.chunks_size());
  if (count == 0) return absl::InvalidArgumentError("chunks: empty");
  if (count > options_.max_chunks_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunks: ", count, " hashes, at most ", options_.max_chunks_per_request, " per request"));
  }
  absl::flat_hash_set<std::string_view> wanted;
  for (size_t i = 0; i < count; ++i) {
    const std::string& hash = request.chunks(static_cast<int>(i));
    if (hash.size() != common::kSha256Size) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks[", i, "]: ", hash.size(), " bytes, want ", common::kSha256Size));
    }
    wanted.insert(hash);
  }

  // The stream slot is taken only once the request is known to be worth serving, so
  // refused requests cannot crowd out members' transfers.
  if (streams_.fetch_add(1) >= options_.max_concurrent_streams) {
    streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "chunk requests: ", options_.max_concurrent_streams, " streams already running here"));
  }
  ChunkServing slot(/*store=*/nullptr, &streams_);  // given back on every early return

  TS_ASSIGN_OR_RETURN(ArtifactStore * store, stores_->StoreFor(request.shard_id()));
  TS_ASSIGN_OR_RETURN(VerifiedManifest manifest,
                      store->GetManifest(request.artifact_id(), /*complete_only=*/true));
  TS_RETURN_IF_ERROR(CheckReadable(role, manifest.body.kind(), request.artifact_id()));
  // One pass over the manifest against the (at most a few hundred) wanted hashes, rather than
  // a set of every chunk of a possibly large manifest per call.
  absl::flat_hash_set<std::string_view> named;
  for (const pb::ManifestFile& file : manifest.body.files()) {
    for (const std::string& hash : file.chunks()) {
      if (wanted.contains(hash)) named.insert(hash);
    }
    if (named.size() == wanted.size()) break;
  }
  for (size_t i = 0; i < count; ++i) {
    const std::string& hash = request.chunks(static_cast<int>(i));
    if (!named.contains(hash)) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "]: ", Hex(hash),
                                                     " is not named by the manifest of ",
                                                     Hex(request.artifact_id())));
    }
  }
  return ChunkServing(store, slot.Release());
}

grpc::Status ArtifactTransferService::ServeChunks(grpc::ServerContext* context,
                                                  const pb::GetChunksRequest& request_message,
                                                  const ChunkSender& send) {
  const pb::GetChunksRequest* request = &request_message;
  return Serve([&]() -> absl::Status {
    TS_ASSIGN_OR_RETURN(ChunkServing serving, BeginChunks(*request, kMethodGetChunks));
    ArtifactStore* store = serving.store();
    const size_t count = static_cast<size_t>(request->chunks_size());
    for (size_t i = 0; i < count; ++i) {
      if (context->IsCancelled()) return absl::CancelledError("GetChunks: cancelled by the peer");
      // The receiver hashes every chunk before storing it, so serving skips a second hash; a
      // chunk file modified on this disk shows up as this host being reported corrupt, and in
      // its own Verify.
      absl::Status sent = send(store, request->chunks(static_cast<int>(i)));
      if (absl::IsCancelled(sent)) {
        return absl::CancelledError(
            absl::StrCat("GetChunks: the peer went away after ", i, " of ", count, " chunks"));
      }
      TS_RETURN_IF_ERROR(sent);
    }
    return absl::OkStatus();
  });
}

grpc::Status ArtifactTransferService::GetChunks(grpc::ServerContext* context,
                                                const pb::GetChunksRequest* request,
                                                grpc::ServerWriter<pb::ChunkData>* writer) {
  pb::ChunkData message;
  return ServeChunks(
      context, *request, [&](ArtifactStore* store, const std::string& hash) -> absl::Status {
        // Read into the message's own buffer, which keeps its capacity.
        TS_RETURN_IF_ERROR(store->ReadChunk(hash, message.mutable_data()));
        message.set_hash(hash);
        if (!writer->Write(message)) return absl::CancelledError("write failed");
        ChunkServed(request->auth().signer(), kServedOverGrpc, message.data().size());
        return absl::OkStatus();
      });
}

grpc::Status ArtifactTransferService::GetChunksRaw(
    grpc::ServerContext* context,
    grpc::ServerSplitStreamer<pb::GetChunksRequest, grpc::ByteBuffer>* stream) {
  pb::GetChunksRequest request;
  if (!stream->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "GetChunks: no request");
  }
  return ServeChunks(context, request,
                     [&](ArtifactStore* store, const std::string& hash) -> absl::Status {
                       grpc_slice slice = grpc_empty_slice();
                       size_t chunk_bytes = 0;
                       absl::Status read = store->ReadChunkInto(hash, [&](size_t size) {
                         chunk_bytes = size;
                         slice = grpc_slice_malloc(ChunkDataHeaderBytes(size) + size);
                         char* begin = reinterpret_cast<char*>(GRPC_SLICE_START_PTR(slice));
                         return begin + EncodeChunkDataHeader(hash, size, begin);
                       });
                       // The message owns the slice from here, also on error.
                       grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
                       TS_RETURN_IF_ERROR(read);
                       grpc::ByteBuffer message(&owned, 1);
                       if (!stream->Write(message)) return absl::CancelledError("write failed");
                       ChunkServed(request.auth().signer(), kServedOverGrpc, chunk_bytes);
                       return absl::OkStatus();
                     });
}

grpc::Status ArtifactTransferService::ListArtifacts(grpc::ServerContext* context,
                                                    const pb::ListArtifactsRequest* request,
                                                    pb::ListArtifactsResponse* response) {
  return Serve([&]() -> absl::Status {
    TS_ASSIGN_OR_RETURN(ShardRole role, Authorize(*request, kMethodListArtifacts));
    TS_ASSIGN_OR_RETURN(ArtifactStore * store, stores_->StoreFor(request->shard_id()));
    TS_ASSIGN_OR_RETURN(std::vector<pb::ArtifactSummary> list,
                        store->List(/*include_incomplete=*/false));
    for (pb::ArtifactSummary& summary : list) {
      if (role == ShardRole::kReader && summary.kind() != kReaderKind) continue;
      *response->add_artifacts() = std::move(summary);
    }
    return absl::OkStatus();
  });
}

grpc::Status ArtifactTransferService::GetChunkStream(grpc::ServerContext* context,
                                                     const pb::GetChunkStreamRequest* request,
                                                     pb::GetChunkStreamResponse* response) {
  return Serve([&]() -> absl::Status {
    TS_RETURN_IF_ERROR(Authorize(*request, kMethodGetChunkStream).status());
    response->set_port(options_.chunk_stream_port);
    return absl::OkStatus();
  });
}

}  // namespace ts::sidecar
