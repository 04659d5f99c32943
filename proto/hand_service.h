// Building blocks for gRPC services written by hand: those named "Service", which gRPC's C++
// generator cannot emit (its nested class would share the enclosing class's name). A server base
// adds each method with UnaryMethod; a client stub calls each with UnaryCall. The wire is that of
// a generated service: the same paths, the same serialized messages.
#ifndef TS_PROTO_HAND_SERVICE_H_
#define TS_PROTO_HAND_SERVICE_H_

#include <functional>

#include <grpcpp/client_context.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/method_handler.h>

namespace ts::proto {

// A unary method at `path` answered by `service`'s member `call` (virtual calls dispatch as
// usual). For grpc::Service::AddMethod, which takes ownership.
template <typename Service, typename Request, typename Response>
grpc::internal::RpcServiceMethod* UnaryMethod(const char* path, Service* service,
                                              grpc::Status (Service::*call)(grpc::ServerContext*,
                                                                            const Request*,
                                                                            Response*)) {
  using Handler =
      grpc::internal::RpcMethodHandler<Service, Request, Response, grpc::protobuf::MessageLite,
                                       grpc::protobuf::MessageLite>;
  return new grpc::internal::RpcServiceMethod(
      path, grpc::internal::RpcMethod::NORMAL_RPC,
      new Handler([call](Service* self, grpc::ServerContext* context, const Request* request,
                         Response* response) { return (self->*call)(context, request, response); },
                  service));
}

// A blocking unary call of `method` on `channel`.
template <typename Request, typename Response>
grpc::Status UnaryCall(grpc::ChannelInterface* channel, const grpc::internal::RpcMethod& method,
                       grpc::ClientContext* context, const Request& request, Response* response) {
  return grpc::internal::BlockingUnaryCall<Request, Response, grpc::protobuf::MessageLite,
                                           grpc::protobuf::MessageLite>(channel, method, context,
                                                                        request, response);
}

}  // namespace ts::proto

#endif  // TS_PROTO_HAND_SERVICE_H_
