// Fuzz target: the devnet's CometBFT event query parser, which reads the `query` of tx_search,
// block_search and WebSocket subscriptions from any client. Checks that refusals are
// INVALID_ARGUMENT "query: ...", that an accepted query keeps the caps and has well-formed
// conditions, and that matching it against a fixed tx and picking its indexable condition only
// answer, the same way twice.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "chain-bridge/devnet/event_query.h"
#include "common/status.h"
#include "tendermint/abci/types.pb.h"

namespace {

using ts::bridge::devnet::EventQuery;
using ts::bridge::devnet::EventSubject;
using ts::bridge::devnet::QueryCondition;
using Events = google::protobuf::RepeatedPtrField<tendermint::abci::Event>;

void AddAttribute(tendermint::abci::Event* event, const char* key, const char* value) {
  auto* attribute = event->add_attributes();
  attribute->set_key(key);
  attribute->set_value(value);
}

// A MsgSend tx's events, and the block's events around it.
struct Subject {
  Subject() {
    auto* transfer = events.Add();
    transfer->set_type("transfer");
    AddAttribute(transfer, "recipient", "gonka1x");
    AddAttribute(transfer, "sender", "gonka1s");
    AddAttribute(transfer, "amount", "1000ngonka");
    auto* message = events.Add();
    message->set_type("message");
    AddAttribute(message, "action", "/cosmos.bank.v1beta1.MsgSend");
    AddAttribute(message, "msg_index", "0");
    auto* tx = more_events.Add();
    tx->set_type("tx");
    AddAttribute(tx, "fee", "171ngonka");
    AddAttribute(tx, "height", "-5");
    subject.tm_event = "Tx";
    subject.height = 5;
    subject.tx_hash = "0A1B2C";
    subject.events = &events;
    subject.more_events = &more_events;
  }
  Events events;
  Events more_events;
  EventSubject subject;
};

bool IsReserved(std::string_view key) {
  return key == "tm.event" || key == "tx.height" || key == "tx.hash" || key == "block.height";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Subject* const fixed = new Subject();
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto query = ts::bridge::devnet::ParseEventQuery(text);
  if (!query.ok()) {
    TS_CHECK(query.status().code() == absl::StatusCode::kInvalidArgument);
    TS_CHECK(query.status().message().substr(0, 7) == "query: ");
    return 0;
  }

  TS_CHECK(size <= ts::bridge::devnet::kMaxQueryBytes);
  TS_CHECK(!query->conditions.empty());
  TS_CHECK(query->conditions.size() <= ts::bridge::devnet::kMaxConditions);
  for (const QueryCondition& c : query->conditions) {
    TS_CHECK(!c.key.empty());
    TS_CHECK(text.find(c.key) != std::string_view::npos);
    TS_CHECK(c.text.size() <= size);
    if (c.op == QueryCondition::Op::kExists) {
      TS_CHECK(c.text.empty() && !c.number.has_value());
    }
  }

  const bool matches = ts::bridge::devnet::Matches(*query, fixed->subject);
  TS_CHECK(matches == ts::bridge::devnet::Matches(*query, fixed->subject));
  // Without any events only conditions on reserved keys can hold.
  EventSubject bare = fixed->subject;
  bare.events = nullptr;
  bare.more_events = nullptr;
  const bool bare_matches = ts::bridge::devnet::Matches(*query, bare);
  if (bare_matches) {
    for (const QueryCondition& c : query->conditions) TS_CHECK(IsReserved(c.key));
  }

  const QueryCondition* indexable = ts::bridge::devnet::IndexableCondition(*query);
  if (indexable != nullptr) {
    TS_CHECK(indexable >= query->conditions.data() &&
             indexable < query->conditions.data() + query->conditions.size());
    TS_CHECK(indexable->op == QueryCondition::Op::kEq);
    TS_CHECK(!IsReserved(indexable->key));
  } else {
    for (const QueryCondition& c : query->conditions) {
      TS_CHECK(c.op != QueryCondition::Op::kEq || IsReserved(c.key));
    }
  }
  return 0;
}
