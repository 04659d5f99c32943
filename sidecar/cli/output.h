// Output formatting for `trainshard`: protobuf JSON with the project's options (proto field
// names, every primitive field printed, so uint64 values are strings and enums are names),
// chain events as JSON, and the human forms (aligned key: value lines and tables).
//
// Thread-safety: pure functions, safe from any thread (the type resolver is built once and then
// only read).
#ifndef TS_SIDECAR_CLI_OUTPUT_H_
#define TS_SIDECAR_CLI_OUTPUT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "gonka/trainshard/v1/chain.pb.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"
#include "tendermint/abci/types.pb.h"

namespace ts::sidecar {

// Protobuf JSON (preserve_proto_field_names, always_print_primitive_fields), one line. Any
// fields with Cosmos-style type URLs ("/cosmos.tx.v1beta1.Tx") are printed decoded; an Any of a
// type this build does not know is left out (all Any fields are, then).
std::string ProtoToJson(const google::protobuf::Message& message);
nlohmann::ordered_json ProtoToJsonValue(const google::protobuf::Message& message);

// {"height":"<h>","index":i,"type":t,"attributes":{k:v}}; a repeated key keeps its last value.
nlohmann::ordered_json EventToJson(int64_t height, uint32_t index,
                                   const tendermint::abci::Event& event);

// "SHARD_STATUS_OPEN" with prefix "SHARD_STATUS_" → "open".
std::string ShortEnumName(const std::string& full_name, const std::string& prefix);

// The value of the first attribute named `key` in `event`, or "" if none.
std::string EventAttribute(const tendermint::abci::Event& event, const std::string& key);

// Aligned "key: value" lines.
using KeyValues = std::vector<std::pair<std::string, std::string>>;
void PrintKeyValues(std::ostream& out, const KeyValues& lines);

// A table with a header row, columns padded to their widest cell.
void PrintTable(std::ostream& out, const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);

// One line per event: height, index, type, then key=value pairs.
std::string EventLine(int64_t height, uint32_t index, const tendermint::abci::Event& event);

// A settlement's fields and payouts table.
void PrintSettlement(std::ostream& out, const gonka::trainshard::v1::Settlement& settlement);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_OUTPUT_H_
