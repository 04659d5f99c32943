#include "chain-bridge/devnet/event_query.h"

#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ts::bridge::devnet {
namespace {

using Op = QueryCondition::Op;

absl::string_view Absl(std::string_view s) { return {s.data(), s.size()}; }

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<EventQuery> Parse() {
    EventQuery query;
    SkipSpace();
    if (AtEnd()) return Error("empty");
    for (;;) {
      if (query.conditions.size() >= kMaxConditions) {
        return Error(absl::StrCat("more than ", kMaxConditions, " conditions"));
      }
      auto condition = Condition();
      if (!condition.ok()) return condition.status();
      query.conditions.push_back(*std::move(condition));
      SkipSpace();
      if (AtEnd()) return query;
      if (!Keyword("AND")) return Error("expected AND or the end");
    }
  }

 private:
  absl::StatusOr<QueryCondition> Condition() {
    QueryCondition c;
    SkipSpace();
    size_t start = pos_;
    while (!AtEnd() && (std::isalnum(static_cast<unsigned char>(Peek())) || Peek() == '.' ||
                        Peek() == '_' || Peek() == '-' || Peek() == '/')) {
      ++pos_;
    }
    c.key = std::string(text_.substr(start, pos_ - start));
    if (c.key.empty()) return Error("expected a key");
    SkipSpace();
    if (Keyword("EXISTS")) {
      c.op = Op::kExists;
      return c;
    }
    if (Keyword("CONTAINS")) {
      c.op = Op::kContains;
    } else if (Take("<=")) {
      c.op = Op::kLe;
    } else if (Take(">=")) {
      c.op = Op::kGe;
    } else if (Take("<")) {
      c.op = Op::kLt;
    } else if (Take(">")) {
      c.op = Op::kGt;
    } else if (Take("=")) {
      c.op = Op::kEq;
    } else {
      return Error("expected =, <, <=, >, >=, CONTAINS or EXISTS");
    }
    SkipSpace();
    if (Take("'")) {
      size_t end = text_.find('\'', pos_);
      if (end == std::string_view::npos) return Error("unterminated string");
      c.text = std::string(text_.substr(pos_, end - pos_));
      pos_ = end + 1;
    } else {
      size_t begin = pos_;
      if (!AtEnd() && Peek() == '-') ++pos_;
      while (!AtEnd() && std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
      c.text = std::string(text_.substr(begin, pos_ - begin));
      int64_t value = 0;
      if (!absl::SimpleAtoi(Absl(c.text), &value))
        return Error("expected a 'string' or an integer");
      if (c.op == Op::kContains) return Error("CONTAINS takes a 'string'");
    }
    int64_t value = 0;
    if (absl::SimpleAtoi(Absl(c.text), &value)) c.number = value;
    return c;
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }
  void SkipSpace() {
    while (!AtEnd() && std::isspace(static_cast<unsigned char>(Peek()))) ++pos_;
  }
  bool Take(std::string_view token) {
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  // A keyword ends at a space, a quote or the end.
  bool Keyword(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    size_t after = pos_ + word.size();
    if (after < text_.size() && !std::isspace(static_cast<unsigned char>(text_[after])) &&
        text_[after] != '\'') {
      return false;
    }
    pos_ = after;
    SkipSpace();
    return true;
  }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("query: ", Absl(what), " at offset ", pos_));
  }

  std::string_view text_;
  size_t pos_ = 0;
};

bool Compare(const QueryCondition& c, std::string_view value) {
  switch (c.op) {
    case Op::kExists:
      return true;
    case Op::kContains:
      return value.find(c.text) != std::string_view::npos;
    case Op::kEq:
      return value == c.text;
    default:
      break;
  }
  int64_t number = 0;
  if (!c.number.has_value() || !absl::SimpleAtoi(Absl(value), &number)) return false;
  switch (c.op) {
    case Op::kLt:
      return number < *c.number;
    case Op::kLe:
      return number <= *c.number;
    case Op::kGt:
      return number > *c.number;
    case Op::kGe:
      return number >= *c.number;
    default:
      return false;
  }
}

bool AnyAttribute(const QueryCondition& c,
                  const google::protobuf::RepeatedPtrField<tendermint::abci::Event>* events) {
  if (events == nullptr) return false;
  size_t dot = c.key.rfind('.');
  if (dot == std::string::npos) return false;
  std::string_view type = std::string_view(c.key).substr(0, dot);
  std::string_view attribute = std::string_view(c.key).substr(dot + 1);
  for (const auto& event : *events) {
    if (event.type() != type) continue;
    for (const auto& a : event.attributes()) {
      if (a.key() == attribute && Compare(c, a.value())) return true;
    }
  }
  return false;
}

bool IsReserved(std::string_view key) {
  return key == "tm.event" || key == "tx.height" || key == "tx.hash" || key == "block.height";
}

}  // namespace

absl::StatusOr<EventQuery> ParseEventQuery(std::string_view text) {
  if (text.size() > kMaxQueryBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("query: ", text.size(), " bytes exceed the cap of ", kMaxQueryBytes));
  }
  return Parser(text).Parse();
}

bool Matches(const EventQuery& query, const EventSubject& subject) {
  for (const auto& c : query.conditions) {
    bool holds = false;
    if (c.key == "tm.event") {
      holds = Compare(c, subject.tm_event);
    } else if (c.key == "tx.height" || c.key == "block.height") {
      holds = Compare(c, absl::StrCat(subject.height));
    } else if (c.key == "tx.hash") {
      holds = !subject.tx_hash.empty() && Compare(c, subject.tx_hash);
    } else {
      holds = AnyAttribute(c, subject.events) || AnyAttribute(c, subject.more_events);
    }
    if (!holds) return false;
  }
  return true;
}

const QueryCondition* IndexableCondition(const EventQuery& query) {
  for (const auto& c : query.conditions) {
    if (c.op == Op::kEq && !IsReserved(c.key)) return &c;
  }
  return nullptr;
}

}  // namespace ts::bridge::devnet
