#include "proto/cosmos_node_service.h"

#include "proto/hand_service.h"

namespace cosmos::base::node::v1beta1 {

NodeServiceBase::NodeServiceBase() {
  AddMethod(ts::proto::UnaryMethod(kConfigPath, this, &NodeServiceBase::Config));
}

NodeServiceBase::~NodeServiceBase() = default;

grpc::Status NodeServiceBase::Config(grpc::ServerContext*, const ConfigRequest*, ConfigResponse*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "Config");
}

grpc::Status CallConfig(const std::shared_ptr<grpc::ChannelInterface>& channel,
                        grpc::ClientContext* context, const ConfigRequest& request,
                        ConfigResponse* response) {
  const grpc::internal::RpcMethod method(kConfigPath, grpc::internal::RpcMethod::NORMAL_RPC,
                                         channel);
  return ts::proto::UnaryCall(channel.get(), method, context, request, response);
}

}  // namespace cosmos::base::node::v1beta1
