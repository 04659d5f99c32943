// Server base for `cosmos.base.tendermint.v1beta1.Service` (node info, syncing, latest block,
// block by height, validator sets), written by hand as cosmos.tx.v1beta1.Service is (see
// proto/hand_service.h): the method paths and messages are the Cosmos SDK's. ABCIQuery is not
// served (UNIMPLEMENTED, as any method a server lacks).
//
// Thread-safety: called by gRPC's threads, as any generated service.
#ifndef TS_PROTO_COSMOS_TENDERMINT_SERVICE_H_
#define TS_PROTO_COSMOS_TENDERMINT_SERVICE_H_

#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_context.h>

#include "cosmos/base/tendermint/v1beta1/query.pb.h"

namespace cosmos::base::tendermint::v1beta1 {

inline constexpr char kGetNodeInfoPath[] = "/cosmos.base.tendermint.v1beta1.Service/GetNodeInfo";
inline constexpr char kGetSyncingPath[] = "/cosmos.base.tendermint.v1beta1.Service/GetSyncing";
inline constexpr char kGetLatestBlockPath[] =
    "/cosmos.base.tendermint.v1beta1.Service/GetLatestBlock";
inline constexpr char kGetBlockByHeightPath[] =
    "/cosmos.base.tendermint.v1beta1.Service/GetBlockByHeight";
inline constexpr char kGetLatestValidatorSetPath[] =
    "/cosmos.base.tendermint.v1beta1.Service/GetLatestValidatorSet";
inline constexpr char kGetValidatorSetByHeightPath[] =
    "/cosmos.base.tendermint.v1beta1.Service/GetValidatorSetByHeight";

// Derive, override the calls, and register with grpc::ServerBuilder::RegisterService. The
// defaults answer UNIMPLEMENTED.
class TendermintServiceBase : public grpc::Service {
 public:
  TendermintServiceBase();
  ~TendermintServiceBase() override;

  virtual grpc::Status GetNodeInfo(grpc::ServerContext* context, const GetNodeInfoRequest* request,
                                   GetNodeInfoResponse* response);
  virtual grpc::Status GetSyncing(grpc::ServerContext* context, const GetSyncingRequest* request,
                                  GetSyncingResponse* response);
  virtual grpc::Status GetLatestBlock(grpc::ServerContext* context,
                                      const GetLatestBlockRequest* request,
                                      GetLatestBlockResponse* response);
  virtual grpc::Status GetBlockByHeight(grpc::ServerContext* context,
                                        const GetBlockByHeightRequest* request,
                                        GetBlockByHeightResponse* response);
  virtual grpc::Status GetLatestValidatorSet(grpc::ServerContext* context,
                                             const GetLatestValidatorSetRequest* request,
                                             GetLatestValidatorSetResponse* response);
  virtual grpc::Status GetValidatorSetByHeight(grpc::ServerContext* context,
                                               const GetValidatorSetByHeightRequest* request,
                                               GetValidatorSetByHeightResponse* response);
};

}  // namespace cosmos::base::tendermint::v1beta1

#endif  // TS_PROTO_COSMOS_TENDERMINT_SERVICE_H_
