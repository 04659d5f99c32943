// Server base and client stub for `cosmos.tx.v1beta1.Service` (Simulate, BroadcastTx, GetTx,
// GetBlockWithTxs), written by hand because gRPC's C++ generator cannot emit a service named
// "Service". Method paths and messages are those of the Cosmos SDK, so the wire is identical.
//
// Thread-safety: the stub is thread-safe; the server base is called by gRPC's threads, as any
// generated service.
#ifndef TS_PROTO_COSMOS_TX_SERVICE_H_
#define TS_PROTO_COSMOS_TX_SERVICE_H_

#include <memory>

#include <grpcpp/client_context.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/method_handler.h>

#include "cosmos/tx/v1beta1/service.pb.h"

namespace cosmos::tx::v1beta1 {

inline constexpr char kSimulatePath[] = "/cosmos.tx.v1beta1.Service/Simulate";
inline constexpr char kBroadcastTxPath[] = "/cosmos.tx.v1beta1.Service/BroadcastTx";
inline constexpr char kGetTxPath[] = "/cosmos.tx.v1beta1.Service/GetTx";
inline constexpr char kGetBlockWithTxsPath[] = "/cosmos.tx.v1beta1.Service/GetBlockWithTxs";

// Derive, override the four calls, and register with grpc::ServerBuilder::RegisterService.
// The defaults answer UNIMPLEMENTED.
class TxServiceBase : public grpc::Service {
 public:
  TxServiceBase();
  ~TxServiceBase() override;

  virtual grpc::Status Simulate(grpc::ServerContext* context, const SimulateRequest* request,
                                SimulateResponse* response);
  virtual grpc::Status BroadcastTx(grpc::ServerContext* context, const BroadcastTxRequest* request,
                                   BroadcastTxResponse* response);
  virtual grpc::Status GetTx(grpc::ServerContext* context, const GetTxRequest* request,
                             GetTxResponse* response);
  virtual grpc::Status GetBlockWithTxs(grpc::ServerContext* context,
                                       const GetBlockWithTxsRequest* request,
                                       GetBlockWithTxsResponse* response);
};

class TxServiceStub {
 public:
  explicit TxServiceStub(std::shared_ptr<grpc::ChannelInterface> channel);

  grpc::Status Simulate(grpc::ClientContext* context, const SimulateRequest& request,
                        SimulateResponse* response);
  grpc::Status BroadcastTx(grpc::ClientContext* context, const BroadcastTxRequest& request,
                           BroadcastTxResponse* response);
  grpc::Status GetTx(grpc::ClientContext* context, const GetTxRequest& request,
                     GetTxResponse* response);
  grpc::Status GetBlockWithTxs(grpc::ClientContext* context, const GetBlockWithTxsRequest& request,
                               GetBlockWithTxsResponse* response);

 private:
  std::shared_ptr<grpc::ChannelInterface> channel_;
  grpc::internal::RpcMethod simulate_;
  grpc::internal::RpcMethod broadcast_tx_;
  grpc::internal::RpcMethod get_tx_;
  grpc::internal::RpcMethod get_block_with_txs_;
};

}  // namespace cosmos::tx::v1beta1

#endif  // TS_PROTO_COSMOS_TX_SERVICE_H_
