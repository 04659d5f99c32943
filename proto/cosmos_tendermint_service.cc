#include "proto/cosmos_tendermint_service.h"

#include "proto/hand_service.h"

namespace cosmos::base::tendermint::v1beta1 {

using ts::proto::UnaryMethod;

TendermintServiceBase::TendermintServiceBase() {
  AddMethod(UnaryMethod(kGetNodeInfoPath, this, &TendermintServiceBase::GetNodeInfo));
  AddMethod(UnaryMethod(kGetSyncingPath, this, &TendermintServiceBase::GetSyncing));
  AddMethod(UnaryMethod(kGetLatestBlockPath, this, &TendermintServiceBase::GetLatestBlock));
  AddMethod(UnaryMethod(kGetBlockByHeightPath, this, &TendermintServiceBase::GetBlockByHeight));
  AddMethod(
      UnaryMethod(kGetLatestValidatorSetPath, this, &TendermintServiceBase::GetLatestValidatorSet));
  AddMethod(UnaryMethod(kGetValidatorSetByHeightPath, this,
                        &TendermintServiceBase::GetValidatorSetByHeight));
}

TendermintServiceBase::~TendermintServiceBase() = default;

grpc::Status TendermintServiceBase::GetNodeInfo(grpc::ServerContext*, const GetNodeInfoRequest*,
                                                GetNodeInfoResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetNodeInfo");
}
grpc::Status TendermintServiceBase::GetSyncing(grpc::ServerContext*, const GetSyncingRequest*,
                                               GetSyncingResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetSyncing");
}
grpc::Status TendermintServiceBase::GetLatestBlock(grpc::ServerContext*,
                                                   const GetLatestBlockRequest*,
                                                   GetLatestBlockResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetLatestBlock");
}
grpc::Status TendermintServiceBase::GetBlockByHeight(grpc::ServerContext*,
                                                     const GetBlockByHeightRequest*,
                                                     GetBlockByHeightResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetBlockByHeight");
}
grpc::Status TendermintServiceBase::GetLatestValidatorSet(grpc::ServerContext*,
                                                          const GetLatestValidatorSetRequest*,
                                                          GetLatestValidatorSetResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetLatestValidatorSet");
}
grpc::Status TendermintServiceBase::GetValidatorSetByHeight(grpc::ServerContext*,
                                                            const GetValidatorSetByHeightRequest*,
                                                            GetValidatorSetByHeightResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "GetValidatorSetByHeight");
}

}  // namespace cosmos::base::tendermint::v1beta1
