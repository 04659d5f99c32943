// `cosmos.base.node.v1beta1.Service` written by hand, as cosmos.tx.v1beta1.Service is (see
// proto/hand_service.h): a server base whose Config the devnet answers, and the client call.
// The SDK's Status method is not served (UNIMPLEMENTED, as any method a server lacks).
//
// Thread-safety: called by gRPC's threads, as any generated service.
#ifndef TS_PROTO_COSMOS_NODE_SERVICE_H_
#define TS_PROTO_COSMOS_NODE_SERVICE_H_

#include <memory>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_context.h>

#include "cosmos/base/node/v1beta1/query.pb.h"

namespace cosmos::base::node::v1beta1 {

inline constexpr char kConfigPath[] = "/cosmos.base.node.v1beta1.Service/Config";

// Derive, override Config, and register with grpc::ServerBuilder::RegisterService. The default
// answers UNIMPLEMENTED.
class NodeServiceBase : public grpc::Service {
 public:
  NodeServiceBase();
  ~NodeServiceBase() override;

  virtual grpc::Status Config(grpc::ServerContext* context, const ConfigRequest* request,
                              ConfigResponse* response);
};

// Calls Config on `channel`.
grpc::Status CallConfig(const std::shared_ptr<grpc::ChannelInterface>& channel,
                        grpc::ClientContext* context, const ConfigRequest& request,
                        ConfigResponse* response);

}  // namespace cosmos::base::node::v1beta1

#endif  // TS_PROTO_COSMOS_NODE_SERVICE_H_
