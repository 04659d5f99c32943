#include "chain-bridge/devnet/event_query.h"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::bridge::devnet {
namespace {

using Events = google::protobuf::RepeatedPtrField<tendermint::abci::Event>;
using Op = QueryCondition::Op;
using ::testing::StartsWith;

EventQuery Parse(std::string_view text) {
  auto query = ParseEventQuery(text);
  EXPECT_TRUE(query.ok()) << text << ": " << query.status();
  return query.ok() ? *std::move(query) : EventQuery{};
}

// The refusal's message, or "" (a test failure) when the text parses.
std::string Refusal(std::string_view text) {
  auto query = ParseEventQuery(text);
  if (query.ok()) {
    ADD_FAILURE() << "parsed: " << text;
    return "";
  }
  EXPECT_EQ(query.status().code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(std::string(query.status().message()), StartsWith("query: ")) << text;
  return std::string(query.status().message());
}

void AddEvent(Events* events, std::string_view type,
              std::vector<std::pair<std::string, std::string>> attributes) {
  tendermint::abci::Event* event = events->Add();
  event->set_type(std::string(type));
  for (auto& [key, value] : attributes) {
    auto* attribute = event->add_attributes();
    attribute->set_key(key);
    attribute->set_value(value);
    attribute->set_index(true);
  }
}

// What a MsgSend tx emits: a transfer, its message, and a numeric attribute to compare.
Events TxEvents() {
  Events events;
  AddEvent(&events, "transfer",
           {{"recipient", "gonka1x"}, {"sender", "gonka1s"}, {"amount", "1000ngonka"}});
  AddEvent(&events, "message", {{"action", "/cosmos.bank.v1beta1.MsgSend"}, {"sender", "gonka1s"}});
  AddEvent(&events, "reserve", {{"shard_count", "12"}, {"offset", "-4"}});
  return events;
}

// What the block adds around a tx (the fee and the signer), searched as `more_events`.
Events BlockEvents() {
  Events events;
  AddEvent(&events, "tx", {{"fee", "171ngonka"}, {"acc_seq", "gonka1s/3"}});
  return events;
}

class MatchTest : public ::testing::Test {
 protected:
  MatchTest() : events_(TxEvents()), more_events_(BlockEvents()) {
    subject_.tm_event = "Tx";
    subject_.height = 5;
    subject_.tx_hash = "0A1B2C";
    subject_.events = &events_;
  }

  bool Matches(std::string_view text) { return devnet::Matches(Parse(text), subject_); }

  Events events_;
  Events more_events_;
  EventSubject subject_;
};

// ---------------------------------------------------------------------------------------------
// Parsing

TEST(EventQueryParseTest, TwoConditionsJoinedByAnd) {
  EventQuery query = Parse("tm.event='Tx' AND transfer.recipient='gonka1x'");
  ASSERT_EQ(query.conditions.size(), 2u);
  EXPECT_EQ(query.conditions[0].key, "tm.event");
  EXPECT_EQ(query.conditions[0].op, Op::kEq);
  EXPECT_EQ(query.conditions[0].text, "Tx");
  EXPECT_FALSE(query.conditions[0].number.has_value());
  EXPECT_EQ(query.conditions[1].key, "transfer.recipient");
  EXPECT_EQ(query.conditions[1].op, Op::kEq);
  EXPECT_EQ(query.conditions[1].text, "gonka1x");
  EXPECT_FALSE(query.conditions[1].number.has_value());
}

TEST(EventQueryParseTest, ComparisonWithoutSpaces) {
  EventQuery query = Parse("tx.height>=5");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].key, "tx.height");
  EXPECT_EQ(query.conditions[0].op, Op::kGe);
  EXPECT_EQ(query.conditions[0].text, "5");
  EXPECT_EQ(query.conditions[0].number, 5);
}

TEST(EventQueryParseTest, EqualityWithAnInteger) {
  EventQuery query = Parse("tx.height = 5");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].op, Op::kEq);
  EXPECT_EQ(query.conditions[0].text, "5");
  EXPECT_EQ(query.conditions[0].number, 5);
}

TEST(EventQueryParseTest, Contains) {
  EventQuery query = Parse("message.action CONTAINS 'Send'");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].key, "message.action");
  EXPECT_EQ(query.conditions[0].op, Op::kContains);
  EXPECT_EQ(query.conditions[0].text, "Send");
  EXPECT_FALSE(query.conditions[0].number.has_value());
}

TEST(EventQueryParseTest, Exists) {
  EventQuery query = Parse("transfer.amount EXISTS");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].key, "transfer.amount");
  EXPECT_EQ(query.conditions[0].op, Op::kExists);
  EXPECT_EQ(query.conditions[0].text, "");
  EXPECT_FALSE(query.conditions[0].number.has_value());
}

TEST(EventQueryParseTest, NegativeIntegerRightAfterTheOperator) {
  EventQuery query = Parse("a.b<-3");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].key, "a.b");
  EXPECT_EQ(query.conditions[0].op, Op::kLt);
  EXPECT_EQ(query.conditions[0].text, "-3");
  EXPECT_EQ(query.conditions[0].number, -3);
}

TEST(EventQueryParseTest, EveryComparisonOperator) {
  EventQuery query = Parse("a.b < 1 AND a.b <= 2 AND a.b > 3 AND a.b >= 4 AND a.b = 5");
  ASSERT_EQ(query.conditions.size(), 5u);
  EXPECT_EQ(query.conditions[0].op, Op::kLt);
  EXPECT_EQ(query.conditions[1].op, Op::kLe);
  EXPECT_EQ(query.conditions[2].op, Op::kGt);
  EXPECT_EQ(query.conditions[3].op, Op::kGe);
  EXPECT_EQ(query.conditions[4].op, Op::kEq);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(query.conditions[i].number, i + 1);
}

TEST(EventQueryParseTest, QuotedIntegerAlsoHasItsNumber) {
  EventQuery query = Parse("a.b = '42' AND a.c = ''");
  ASSERT_EQ(query.conditions.size(), 2u);
  EXPECT_EQ(query.conditions[0].text, "42");
  EXPECT_EQ(query.conditions[0].number, 42);
  EXPECT_EQ(query.conditions[1].text, "");
  EXPECT_FALSE(query.conditions[1].number.has_value());
}

TEST(EventQueryParseTest, StringsKeepSpacesAndOperatorsAsWritten) {
  EventQuery query = Parse("a.b = 'x AND y = <z>'");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].text, "x AND y = <z>");
}

TEST(EventQueryParseTest, KeywordsMayTouchAQuote) {
  EventQuery query = Parse("a.b CONTAINS'x'");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].op, Op::kContains);
  EXPECT_EQ(query.conditions[0].text, "x");
}

TEST(EventQueryParseTest, SpaceAroundAndBetweenIsAnyWhitespace) {
  EventQuery query = Parse("\t a.b EXISTS\nAND\tc.d = 'y'  ");
  ASSERT_EQ(query.conditions.size(), 2u);
  EXPECT_EQ(query.conditions[0].op, Op::kExists);
  EXPECT_EQ(query.conditions[1].key, "c.d");
}

TEST(EventQueryParseTest, KeysTakeDashesSlashesAndUnderscores) {
  EventQuery query = Parse("gonka.trainshard-v1/reserved.shard_id = 3");
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].key, "gonka.trainshard-v1/reserved.shard_id");
}

TEST(EventQueryParseTest, RefusesEmptyText) {
  EXPECT_EQ(Refusal(""), "query: empty at offset 0");
  EXPECT_EQ(Refusal("   "), "query: empty at offset 3");
}

TEST(EventQueryParseTest, RefusesAMissingOperand) {
  EXPECT_EQ(Refusal("a.b ="), "query: expected a 'string' or an integer at offset 5");
  EXPECT_EQ(Refusal("a.b = -"), "query: expected a 'string' or an integer at offset 7");
}

TEST(EventQueryParseTest, RefusesAnUnterminatedString) {
  EXPECT_EQ(Refusal("a.b = 'x"), "query: unterminated string at offset 7");
  EXPECT_EQ(Refusal("tm.event='Tx' AND a.b='x"), "query: unterminated string at offset 23");
}

TEST(EventQueryParseTest, AnIntegerEndsAtItsLastDigit) {
  // "1" is the operand; the "x" after it is where AND or the end was expected.
  EXPECT_EQ(Refusal("a.b = 1x"), "query: expected AND or the end at offset 7");
}

TEST(EventQueryParseTest, RefusesAnIntegerOutOfRange) {
  EXPECT_EQ(Refusal("a.b = 99999999999999999999"),
            "query: expected a 'string' or an integer at offset 26");
}

TEST(EventQueryParseTest, RefusesContainsWithAnInteger) {
  EXPECT_EQ(Refusal("a.b CONTAINS 5"), "query: CONTAINS takes a 'string' at offset 14");
}

TEST(EventQueryParseTest, RefusesAnUnknownOperator) {
  EXPECT_EQ(Refusal("a.b ~ 'x'"),
            "query: expected =, <, <=, >, >=, CONTAINS or EXISTS at offset 4");
  // Keywords are whole words, in upper case.
  EXPECT_EQ(Refusal("a.b EXISTSx"),
            "query: expected =, <, <=, >, >=, CONTAINS or EXISTS at offset 4");
  EXPECT_EQ(Refusal("a.b contains 'x'"),
            "query: expected =, <, <=, >, >=, CONTAINS or EXISTS at offset 4");
}

TEST(EventQueryParseTest, RefusesOr) {
  EXPECT_EQ(Refusal("a.b = 'x' OR c.d = 'y'"), "query: expected AND or the end at offset 10");
  EXPECT_EQ(Refusal("a.b = 'x' and c.d = 'y'"), "query: expected AND or the end at offset 10");
}

TEST(EventQueryParseTest, RefusesAMissingKey) {
  EXPECT_EQ(Refusal("= 'x'"), "query: expected a key at offset 0");
  EXPECT_EQ(Refusal("a.b = 'x' AND"), "query: expected a key at offset 13");
  EXPECT_EQ(Refusal("a.b = 'x' AND AND c.d = 'y'"),
            "query: expected =, <, <=, >, >=, CONTAINS or EXISTS at offset 18");
}

// "k0.a = 0 AND k1.a = 1 AND ..." with `count` conditions; each is 8 bytes, each " AND " 5.
std::string Conditions(int count) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    if (i > 0) text += " AND ";
    absl::StrAppend(&text, "k", i, ".a = ", i);
  }
  return text;
}

TEST(EventQueryParseTest, TakesAsManyConditionsAsTheCap) {
  EventQuery query = Parse(Conditions(kMaxConditions));
  ASSERT_EQ(query.conditions.size(), kMaxConditions);
  EXPECT_EQ(query.conditions.back().key, "k7.a");
  EXPECT_EQ(query.conditions.back().number, 7);
}

TEST(EventQueryParseTest, RefusesOneConditionMoreThanTheCap) {
  // The ninth condition starts after eight conditions and eight " AND ": 8 * 13 = 104.
  EXPECT_EQ(Refusal(Conditions(kMaxConditions + 1)), "query: more than 8 conditions at offset 104");
}

TEST(EventQueryParseTest, TakesATextOfTheCapInBytes) {
  std::string text = "a.b = '" + std::string(kMaxQueryBytes - 8, 'x') + "'";
  ASSERT_EQ(text.size(), kMaxQueryBytes);
  EventQuery query = Parse(text);
  ASSERT_EQ(query.conditions.size(), 1u);
  EXPECT_EQ(query.conditions[0].text.size(), kMaxQueryBytes - 8);
}

TEST(EventQueryParseTest, RefusesAByteMoreThanTheCap) {
  std::string text = "a.b = '" + std::string(kMaxQueryBytes - 7, 'x') + "'";
  ASSERT_EQ(text.size(), kMaxQueryBytes + 1);
  EXPECT_EQ(Refusal(text), "query: 513 bytes exceed the cap of 512");
}

// ---------------------------------------------------------------------------------------------
// Matching

TEST_F(MatchTest, AttributeEquality) {
  EXPECT_TRUE(Matches("transfer.recipient = 'gonka1x'"));
  EXPECT_TRUE(Matches("transfer.amount = '1000ngonka'"));
  EXPECT_FALSE(Matches("transfer.recipient = 'gonka1y'"));
  EXPECT_FALSE(Matches("transfer.recipient = 'gonka1'"));
  EXPECT_FALSE(Matches("transfer.amount = 1000"));
}

TEST_F(MatchTest, NumericComparisonsOnAttributes) {
  EXPECT_TRUE(Matches("reserve.shard_count > 10"));
  EXPECT_TRUE(Matches("reserve.shard_count >= 12"));
  EXPECT_TRUE(Matches("reserve.shard_count <= 12"));
  EXPECT_TRUE(Matches("reserve.shard_count = 12"));
  EXPECT_FALSE(Matches("reserve.shard_count > 12"));
  EXPECT_FALSE(Matches("reserve.shard_count < 12"));
  EXPECT_TRUE(Matches("reserve.offset < -3"));
  EXPECT_FALSE(Matches("reserve.offset >= 0"));
  // A quoted integer compares as a number too.
  EXPECT_TRUE(Matches("reserve.shard_count > '9'"));
}

TEST_F(MatchTest, NumericComparisonsNeedIntegersOnBothSides) {
  EXPECT_FALSE(Matches("transfer.amount > 5"));
  EXPECT_FALSE(Matches("transfer.amount < 5000"));
  EXPECT_FALSE(Matches("reserve.shard_count > 'ten'"));
}

TEST_F(MatchTest, HeightIsTxHeightAndBlockHeight) {
  EXPECT_TRUE(Matches("tx.height = 5"));
  EXPECT_TRUE(Matches("tx.height >= 5"));
  EXPECT_TRUE(Matches("tx.height > 4"));
  EXPECT_TRUE(Matches("tx.height <= 5"));
  EXPECT_FALSE(Matches("tx.height < 5"));
  EXPECT_FALSE(Matches("tx.height = 6"));
  EXPECT_TRUE(Matches("block.height = 5"));
  EXPECT_TRUE(Matches("block.height < 6"));
  EXPECT_FALSE(Matches("block.height > 5"));
}

TEST_F(MatchTest, TxHash) {
  EXPECT_TRUE(Matches("tx.hash = '0A1B2C'"));
  EXPECT_FALSE(Matches("tx.hash = '0a1b2c'"));
  EXPECT_TRUE(Matches("tx.hash EXISTS"));
  // A block has no tx hash: no condition on it holds.
  subject_.tx_hash = "";
  EXPECT_FALSE(Matches("tx.hash EXISTS"));
  EXPECT_FALSE(Matches("tx.hash = ''"));
}

TEST_F(MatchTest, TmEvent) {
  EXPECT_TRUE(Matches("tm.event = 'Tx'"));
  EXPECT_FALSE(Matches("tm.event = 'NewBlock'"));
  subject_.tm_event = "NewBlock";
  EXPECT_TRUE(Matches("tm.event = 'NewBlock'"));
  EXPECT_FALSE(Matches("tm.event = 'Tx'"));
}

TEST_F(MatchTest, Contains) {
  EXPECT_TRUE(Matches("message.action CONTAINS 'MsgSend'"));
  EXPECT_TRUE(Matches("message.action CONTAINS '/cosmos.bank.v1beta1.MsgSend'"));
  EXPECT_TRUE(Matches("message.action CONTAINS ''"));
  EXPECT_FALSE(Matches("message.action CONTAINS 'MsgVote'"));
  EXPECT_TRUE(Matches("tm.event CONTAINS 'T'"));
}

TEST_F(MatchTest, Exists) {
  EXPECT_TRUE(Matches("transfer.amount EXISTS"));
  EXPECT_TRUE(Matches("message.sender EXISTS"));
  EXPECT_FALSE(Matches("transfer.memo EXISTS"));
  EXPECT_FALSE(Matches("burn.amount EXISTS"));
}

TEST_F(MatchTest, EveryConditionMustHold) {
  EXPECT_TRUE(Matches("tm.event = 'Tx' AND transfer.recipient = 'gonka1x' AND tx.height = 5"));
  EXPECT_FALSE(Matches("tm.event = 'Tx' AND transfer.recipient = 'gonka1y'"));
  EXPECT_FALSE(Matches("transfer.recipient = 'gonka1x' AND tx.height > 5"));
  EXPECT_FALSE(Matches("tm.event = 'NewBlock' AND transfer.recipient = 'gonka1x'"));
}

TEST_F(MatchTest, AnAttributeOfAnotherEventTypeDoesNotMatch) {
  // `recipient` is an attribute of the transfer event, not of the message event.
  EXPECT_FALSE(Matches("message.recipient = 'gonka1x'"));
  EXPECT_FALSE(Matches("message.amount EXISTS"));
  // `sender` is on both.
  EXPECT_TRUE(Matches("message.sender = 'gonka1s'"));
  // A key without a type matches nothing.
  EXPECT_FALSE(Matches("recipient = 'gonka1x'"));
}

TEST_F(MatchTest, MoreEventsAreSearchedToo) {
  EXPECT_FALSE(Matches("tx.fee = '171ngonka'"));
  subject_.more_events = &more_events_;
  EXPECT_TRUE(Matches("tx.fee = '171ngonka'"));
  EXPECT_TRUE(Matches("tx.acc_seq CONTAINS 'gonka1s'"));
  // One condition holds in the events and the other in the more events.
  EXPECT_TRUE(Matches("transfer.recipient = 'gonka1x' AND tx.fee = '171ngonka'"));
  EXPECT_FALSE(Matches("transfer.recipient = 'gonka1x' AND tx.fee = '172ngonka'"));
}

TEST_F(MatchTest, WithoutEventsOnlyReservedKeysCanHold) {
  subject_.events = nullptr;
  subject_.more_events = nullptr;
  EXPECT_TRUE(Matches("tm.event = 'Tx' AND tx.height = 5"));
  EXPECT_FALSE(Matches("transfer.amount EXISTS"));
  subject_.more_events = &more_events_;
  EXPECT_TRUE(Matches("tx.fee EXISTS"));
}

TEST_F(MatchTest, AnEmptyQueryMatchesEverything) {
  EXPECT_TRUE(devnet::Matches(EventQuery{}, subject_));
}

// ---------------------------------------------------------------------------------------------
// IndexableCondition

TEST(IndexableConditionTest, FirstNonReservedEquality) {
  EventQuery query = Parse(
      "tm.event = 'Tx' AND tx.height = 5 AND transfer.amount EXISTS AND "
      "message.action CONTAINS 'Send' AND reserve.shard_count > 3 AND "
      "transfer.recipient = 'gonka1x' AND message.sender = 'gonka1s'");
  const QueryCondition* condition = IndexableCondition(query);
  ASSERT_NE(condition, nullptr);
  EXPECT_EQ(condition, &query.conditions[5]);
  EXPECT_EQ(condition->key, "transfer.recipient");
  EXPECT_EQ(condition->text, "gonka1x");
}

TEST(IndexableConditionTest, AnIntegerEqualityIsIndexableToo) {
  EventQuery query = Parse("reserve.shard_count = 12");
  const QueryCondition* condition = IndexableCondition(query);
  ASSERT_NE(condition, nullptr);
  EXPECT_EQ(condition->text, "12");
}

TEST(IndexableConditionTest, NoneWhenOnlyReservedKeysAreEqualities) {
  EventQuery query =
      Parse("tm.event = 'Tx' AND tx.height = 5 AND tx.hash = 'AB' AND block.height = 5");
  EXPECT_EQ(IndexableCondition(query), nullptr);
}

TEST(IndexableConditionTest, NoneWhenNoConditionIsAnEquality) {
  EventQuery query =
      Parse("transfer.amount EXISTS AND message.action CONTAINS 'Send' AND a.b < 3 AND a.b >= 1");
  EXPECT_EQ(IndexableCondition(query), nullptr);
  EXPECT_EQ(IndexableCondition(EventQuery{}), nullptr);
}

}  // namespace
}  // namespace ts::bridge::devnet
