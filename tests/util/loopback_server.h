// Test helper: a real gRPC server on a free port of the loopback interface, serving the services
// a test gives it (fakes of a peer or of a host's API, or the real services under test). For
// tests only: a server that does not start fails the test process at once.
#ifndef TS_TESTS_UTIL_LOOPBACK_SERVER_H_
#define TS_TESTS_UTIL_LOOPBACK_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <initializer_list>
#include <memory>
#include <string>

#include "common/status.h"

namespace ts::test_util {

struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;
  std::string endpoint;  // "127.0.0.1:PORT"
  int port = 0;
};

// Starts `services` (owned by the caller, outliving the server) on 127.0.0.1 at a port the
// kernel picks. max_receive_bytes > 0 raises gRPC's 4 MiB cap on a request.
inline LoopbackServer StartLoopbackServer(std::initializer_list<grpc::Service*> services,
                                          int max_receive_bytes = 0) {
  grpc::ServerBuilder builder;
  LoopbackServer s;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &s.port);
  if (max_receive_bytes > 0) builder.SetMaxReceiveMessageSize(max_receive_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  s.server = builder.BuildAndStart();
  TS_CHECK(s.server != nullptr && s.port > 0);
  s.endpoint = "127.0.0.1:" + std::to_string(s.port);
  return s;
}

}  // namespace ts::test_util

#endif  // TS_TESTS_UTIL_LOOPBACK_SERVER_H_
