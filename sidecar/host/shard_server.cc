#include "sidecar/host/shard_server.h"

#include <atomic>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/crypto/tls_session.h"
#include "common/status.h"
#include "sidecar/peer/peer_tls.h"

namespace ts::sidecar {

// Forwards to the transfer service once it exists; UNAVAILABLE before.
class ShardServer::Gate final : public pb::ArtifactTransfer::Service {
 public:
  // GetChunks answers go out pre-encoded around the chunk file's bytes (GetChunksRaw), skipping
  // the generated handler's serialization copy of every chunk.
  Gate() {
    MarkMethodStreamed(
        kGetChunksMethodIndex,
        new grpc::internal::SplitServerStreamingHandler<pb::GetChunksRequest, grpc::ByteBuffer>(
            [this](grpc::ServerContext* context,
                   grpc::ServerSplitStreamer<pb::GetChunksRequest, grpc::ByteBuffer>* stream) {
              ArtifactTransferService* inner = inner_.load();
              if (inner == nullptr) return NotReady();
              return inner->GetChunksRaw(context, stream);
            }));
  }
  void Open(ArtifactTransferService* inner) { inner_.store(inner); }

  grpc::Status GetManifest(grpc::ServerContext* context, const pb::GetManifestRequest* request,
                           pb::GetManifestResponse* response) override {
    ArtifactTransferService* inner = inner_.load();
    if (inner == nullptr) return NotReady();
    return inner->GetManifest(context, request, response);
  }
  grpc::Status GetChunks(grpc::ServerContext* context, const pb::GetChunksRequest* request,
                         grpc::ServerWriter<pb::ChunkData>* writer) override {
    ArtifactTransferService* inner = inner_.load();
    if (inner == nullptr) return NotReady();
    return inner->GetChunks(context, request, writer);
  }
  grpc::Status ListArtifacts(grpc::ServerContext* context, const pb::ListArtifactsRequest* request,
                             pb::ListArtifactsResponse* response) override {
    ArtifactTransferService* inner = inner_.load();
    if (inner == nullptr) return NotReady();
    return inner->ListArtifacts(context, request, response);
  }
  grpc::Status GetChunkStream(grpc::ServerContext* context,
                              const pb::GetChunkStreamRequest* request,
                              pb::GetChunkStreamResponse* response) override {
    ArtifactTransferService* inner = inner_.load();
    if (inner == nullptr) return NotReady();
    return inner->GetChunkStream(context, request, response);
  }

 private:
  static grpc::Status NotReady() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "this host has not reached its chain yet and cannot check peer requests");
  }
  std::atomic<ArtifactTransferService*> inner_{nullptr};
};

ShardServer::ShardServer(StoreRegistry* stores, ShardDirectory* directory, std::string self_address,
                         common::Clock* clock, TransferServiceOptions options)
    : stores_(stores),
      directory_(directory),
      self_address_(std::move(self_address)),
      clock_(clock),
      options_(options),
      gate_(std::make_unique<Gate>()) {}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    const std::string& listen, StoreRegistry* stores, ShardDirectory* directory,
    std::string self_address, common::Clock* clock, bool chunk_stream,
    TransferServiceOptions options, const std::vector<grpc::Service*>& extra_services,
    const common::TlsIdentity* tls) {
  std::unique_ptr<ShardServer> out(
      new ShardServer(stores, directory, std::move(self_address), clock, options));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, PeerServerCredentials(tls), &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxTransferRequestBytes);
  builder.RegisterService(out->gate_.get());
  for (grpc::Service* service : extra_services) builder.RegisterService(service);
  out->server_ = builder.BuildAndStart();
  if (out->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("shard_listen: cannot bind ", listen));
  }
  out->address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  if (chunk_stream) {
    ChunkStreamServerOptions stream_options;
    if (tls != nullptr) {
      // The chunk stream speaks TLS with the same certificate as the listener.
      TS_ASSIGN_OR_RETURN(stream_options.tls, common::TlsContext::New(*tls));
    }
    auto stream = ChunkStreamServer::Start(EndpointHost(listen), clock, stream_options);
    if (!stream.ok()) {
      return absl::UnavailableError(
          absl::StrCat("shard_listen: chunk stream: ", stream.status().message()));
    }
    out->chunk_stream_ = *std::move(stream);
    out->options_.chunk_stream_port = out->chunk_stream_->port();
  }
  return out;
}

ShardServer::~ShardServer() {
  Shutdown(std::chrono::system_clock::now());
  // The transfer service and verifier outlive every handler that could use them.
  if (server_ != nullptr) server_->Wait();
}

void ShardServer::Activate(const std::string& chain_id) {
  absl::MutexLock lock(&mu_);
  if (service_ != nullptr || shut_down_) return;
  verifier_ = std::make_unique<PeerRequestVerifier>(self_address_, chain_id, clock_);
  service_ =
      std::make_unique<ArtifactTransferService>(stores_, directory_, verifier_.get(), options_);
  gate_->Open(service_.get());
  if (chunk_stream_ != nullptr) chunk_stream_->Open(service_.get());
}

uint16_t ShardServer::chunk_stream_port() const {
  return chunk_stream_ == nullptr ? 0 : chunk_stream_->port();
}

bool ShardServer::active() const {
  absl::MutexLock lock(&mu_);
  return service_ != nullptr;
}

void ShardServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Outside the lock: handlers in flight may still be running and never take it, but Activate
  // must not wait behind a shutdown's grace period.
  if (server_ != nullptr) server_->Shutdown(deadline);
  if (chunk_stream_ != nullptr) chunk_stream_->Shutdown();
}

}  // namespace ts::sidecar
