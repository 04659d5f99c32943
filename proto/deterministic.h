// Deterministic protobuf serialization: the one encoding that hashes, signatures, app hashes and
// artifact ids are computed over (docs/protocol.md, "Consensus statements"). Map entries are
// sorted; fields are written in field-number order. Pure function; thread-safe.
#ifndef TS_PROTO_DETERMINISTIC_H_
#define TS_PROTO_DETERMINISTIC_H_

#include <string>

#include "google/protobuf/message_lite.h"

namespace ts {

std::string DeterministicBytes(const google::protobuf::MessageLite& message);

}  // namespace ts

#endif  // TS_PROTO_DETERMINISTIC_H_
