// CometBFT's event query language, as `tx_search`, `block_search` and `/websocket` subscriptions
// take it: conditions joined by AND, each `composite.key OP operand` with OP one of =, <, <=,
// >, >=, CONTAINS, or `composite.key EXISTS`; operands are 'quoted strings' or numbers (dates and
// times are not supported). `tm.event`, `tx.height`, `tx.hash` and `block.height` are the
// reserved keys, matched against what the caller supplies.
//
// Parsing untrusted text is bounded: at most kMaxQueryBytes and kMaxConditions. Pure functions;
// thread-safe.
#ifndef TS_CHAIN_BRIDGE_DEVNET_EVENT_QUERY_H_
#define TS_CHAIN_BRIDGE_DEVNET_EVENT_QUERY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tendermint/abci/types.pb.h"

namespace ts::bridge::devnet {

inline constexpr size_t kMaxQueryBytes = 512;
inline constexpr size_t kMaxConditions = 8;

struct QueryCondition {
  enum class Op { kEq, kLt, kLe, kGt, kGe, kContains, kExists };
  std::string key;  // "type.attribute", or a reserved key
  Op op = Op::kEq;
  std::string text;               // the operand as written (unquoted)
  std::optional<int64_t> number;  // the operand when it is an integer
};

struct EventQuery {
  std::vector<QueryCondition> conditions;
};

// INVALID_ARGUMENT "query: ..." naming the position and what was expected.
absl::StatusOr<EventQuery> ParseEventQuery(std::string_view text);

// What a query is matched against: the events and the reserved keys' values.
struct EventSubject {
  std::string_view tm_event;  // "Tx" or "NewBlock"
  int64_t height = 0;         // tx.height and block.height
  std::string_view tx_hash;   // upper-case hex, empty for a block
  const google::protobuf::RepeatedPtrField<tendermint::abci::Event>* events = nullptr;
  const google::protobuf::RepeatedPtrField<tendermint::abci::Event>* more_events = nullptr;
};

// Every condition holds for some attribute (an attribute `key` of an event of `type` for
// "type.key"); numeric comparisons need both sides to be integers.
bool Matches(const EventQuery& query, const EventSubject& subject);

// The first `key = 'value'` condition on a non-reserved key, for an index lookup.
const QueryCondition* IndexableCondition(const EventQuery& query);

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_EVENT_QUERY_H_
