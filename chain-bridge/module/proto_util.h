// Protobuf helpers the chain module applies to every untrusted or consensus-relevant message:
// strict parsing that refuses unknown fields; the canonical (deterministic) serialization is
// ts::DeterministicBytes (proto/deterministic.h), included here for the module.
// Internal to the module. Pure functions; thread-safe.
#ifndef TS_CHAIN_BRIDGE_MODULE_PROTO_UTIL_H_
#define TS_CHAIN_BRIDGE_MODULE_PROTO_UTIL_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "proto/deterministic.h"

namespace ts::bridge {

// Parses `bytes` into `msg`. INVALID_ARGUMENT naming `field` if the bytes are not a valid
// encoding of the message, or if they carry a field the message (or any message nested in it)
// does not define: what is executed must be exactly what was signed, with nothing hidden.
absl::Status ParseMessageStrict(std::string_view field, std::string_view bytes,
                                google::protobuf::Message* msg);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_PROTO_UTIL_H_
