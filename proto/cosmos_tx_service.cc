#include "proto/cosmos_tx_service.h"

#include <grpcpp/impl/codegen/client_unary_call.h>

namespace cosmos::tx::v1beta1 {
namespace {

template <typename Request, typename Response>
using Handler =
    grpc::internal::RpcMethodHandler<TxServiceBase, Request, Response, grpc::protobuf::MessageLite,
                                     grpc::protobuf::MessageLite>;

}  // namespace

TxServiceBase::TxServiceBase() {
  AddMethod(new grpc::internal::RpcServiceMethod(
      kSimulatePath, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler<SimulateRequest, SimulateResponse>(
          [](TxServiceBase* service, grpc::ServerContext* ctx, const SimulateRequest* req,
             SimulateResponse* resp) { return service->Simulate(ctx, req, resp); },
          this)));
  AddMethod(new grpc::internal::RpcServiceMethod(
      kBroadcastTxPath, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler<BroadcastTxRequest, BroadcastTxResponse>(
          [](TxServiceBase* service, grpc::ServerContext* ctx, const BroadcastTxRequest* req,
             BroadcastTxResponse* resp) { return service->BroadcastTx(ctx, req, resp); },
          this)));
  AddMethod(new grpc::internal::RpcServiceMethod(
      kGetTxPath, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler<GetTxRequest, GetTxResponse>(
          [](TxServiceBase* service, grpc::ServerContext* ctx, const GetTxRequest* req,
             GetTxResponse* resp) { return service->GetTx(ctx, req, resp); },
          this)));
  AddMethod(new grpc::internal::RpcServiceMethod(
      kGetBlockWithTxsPath, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler<GetBlockWithTxsRequest, GetBlockWithTxsResponse>(
          [](TxServiceBase* service, grpc::ServerContext* ctx, const GetBlockWithTxsRequest* req,
             GetBlockWithTxsResponse* resp) { return service->GetBlockWithTxs(ctx, req, resp); },
          this)));
}

TxServiceBase::~TxServiceBase() = default;

grpc::Status TxServiceBase::Simulate(grpc::ServerContext*, const SimulateRequest*,
                                     SimulateResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "Simulate");
}
grpc::Status TxServiceBase::BroadcastTx(grpc::ServerContext*, const BroadcastTxRequest*,
                                        BroadcastTxResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "BroadcastTx");
}
grpc::Status TxServiceBase::GetTx(grpc::ServerContext*, const GetTxRequest*, GetTxResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetTx");
}
grpc::Status TxServiceBase::GetBlockWithTxs(grpc::ServerContext*, const GetBlockWithTxsRequest*,
                                            GetBlockWithTxsResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetBlockWithTxs");
}

TxServiceStub::TxServiceStub(std::shared_ptr<grpc::ChannelInterface> channel)
    : channel_(std::move(channel)),
      simulate_(kSimulatePath, grpc::internal::RpcMethod::NORMAL_RPC, channel_),
      broadcast_tx_(kBroadcastTxPath, grpc::internal::RpcMethod::NORMAL_RPC, channel_),
      get_tx_(kGetTxPath, grpc::internal::RpcMethod::NORMAL_RPC, channel_),
      get_block_with_txs_(kGetBlockWithTxsPath, grpc::internal::RpcMethod::NORMAL_RPC, channel_) {}

grpc::Status TxServiceStub::Simulate(grpc::ClientContext* context, const SimulateRequest& request,
                                     SimulateResponse* response) {
  return grpc::internal::BlockingUnaryCall<
      SimulateRequest, SimulateResponse, grpc::protobuf::MessageLite, grpc::protobuf::MessageLite>(
      channel_.get(), simulate_, context, request, response);
}

grpc::Status TxServiceStub::BroadcastTx(grpc::ClientContext* context,
                                        const BroadcastTxRequest& request,
                                        BroadcastTxResponse* response) {
  return grpc::internal::BlockingUnaryCall<BroadcastTxRequest, BroadcastTxResponse,
                                           grpc::protobuf::MessageLite,
                                           grpc::protobuf::MessageLite>(
      channel_.get(), broadcast_tx_, context, request, response);
}

grpc::Status TxServiceStub::GetTx(grpc::ClientContext* context, const GetTxRequest& request,
                                  GetTxResponse* response) {
  return grpc::internal::BlockingUnaryCall<GetTxRequest, GetTxResponse, grpc::protobuf::MessageLite,
                                           grpc::protobuf::MessageLite>(channel_.get(), get_tx_,
                                                                        context, request, response);
}

grpc::Status TxServiceStub::GetBlockWithTxs(grpc::ClientContext* context,
                                            const GetBlockWithTxsRequest& request,
                                            GetBlockWithTxsResponse* response) {
  return grpc::internal::BlockingUnaryCall<GetBlockWithTxsRequest, GetBlockWithTxsResponse,
                                           grpc::protobuf::MessageLite,
                                           grpc::protobuf::MessageLite>(
      channel_.get(), get_block_with_txs_, context, request, response);
}

}  // namespace cosmos::tx::v1beta1
