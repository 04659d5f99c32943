#include "proto/cosmos_tx_service.h"

#include "proto/hand_service.h"

namespace cosmos::tx::v1beta1 {

using ts::proto::UnaryCall;
using ts::proto::UnaryMethod;

TxServiceBase::TxServiceBase() {
  AddMethod(UnaryMethod(kSimulatePath, this, &TxServiceBase::Simulate));
  AddMethod(UnaryMethod(kBroadcastTxPath, this, &TxServiceBase::BroadcastTx));
  AddMethod(UnaryMethod(kGetTxPath, this, &TxServiceBase::GetTx));
  AddMethod(UnaryMethod(kGetBlockWithTxsPath, this, &TxServiceBase::GetBlockWithTxs));
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
  return UnaryCall(channel_.get(), simulate_, context, request, response);
}

grpc::Status TxServiceStub::BroadcastTx(grpc::ClientContext* context,
                                        const BroadcastTxRequest& request,
                                        BroadcastTxResponse* response) {
  return UnaryCall(channel_.get(), broadcast_tx_, context, request, response);
}

grpc::Status TxServiceStub::GetTx(grpc::ClientContext* context, const GetTxRequest& request,
                                  GetTxResponse* response) {
  return UnaryCall(channel_.get(), get_tx_, context, request, response);
}

grpc::Status TxServiceStub::GetBlockWithTxs(grpc::ClientContext* context,
                                            const GetBlockWithTxsRequest& request,
                                            GetBlockWithTxsResponse* response) {
  return UnaryCall(channel_.get(), get_block_with_txs_, context, request, response);
}

}  // namespace cosmos::tx::v1beta1
