#include "chain-bridge/module/amino_json.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "chain-bridge/module/tx.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "gmock/gmock.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gtest/gtest.h"

namespace ts::bridge {
namespace {

using cosmos::tx::v1beta1::AuthInfo;
using cosmos::tx::v1beta1::TxBody;
using ::testing::HasSubstr;

constexpr char kFrom[] = "gonka1w508d6qejxtdg4y5r3zarvary0c5xw7k2gsyg6";
constexpr char kTo[] = "gonka17mjk6x9a4yp60ry2qeymj5jtx0fdxmq0yxlddj";

google::protobuf::Any Send(const std::string& from, const std::string& to,
                           const std::string& amount) {
  cosmos::bank::v1beta1::MsgSend msg;
  msg.set_from_address(from);
  msg.set_to_address(to);
  auto* coin = msg.add_amount();
  coin->set_denom("ngonka");
  coin->set_amount(amount);
  return PackMsg(msg);
}

google::protobuf::Any Vote(uint64_t proposal_id, cosmos::gov::v1::VoteOption option,
                           const std::string& voter, const std::string& metadata) {
  cosmos::gov::v1::MsgVote msg;
  msg.set_proposal_id(proposal_id);
  msg.set_option(option);
  msg.set_voter(voter);
  msg.set_metadata(metadata);
  return PackMsg(msg);
}

AuthInfo Fee(const std::string& amount, uint64_t gas_limit) {
  AuthInfo auth_info;
  auto* coin = auth_info.mutable_fee()->add_amount();
  coin->set_denom("ngonka");
  coin->set_amount(amount);
  auth_info.mutable_fee()->set_gas_limit(gas_limit);
  return auth_info;
}

std::string SignBytes(const TxBody& body, const AuthInfo& auth_info) {
  auto bytes = AminoJsonSignBytes(body, auth_info, "c-1", 7, 3);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

// ---------------------------------------------------------------------------------------------
// AminoJsonString

TEST(AminoJsonStringTest, PlainTextIsQuoted) {
  EXPECT_EQ(AminoJsonString(""), R"("")");
  EXPECT_EQ(AminoJsonString("gonka1abc"), R"("gonka1abc")");
  EXPECT_EQ(AminoJsonString("a/b 'c' ~"), R"("a/b 'c' ~")");
}

TEST(AminoJsonStringTest, EscapesQuoteBackslashAndNewline) {
  EXPECT_EQ(AminoJsonString("say \"hi\""), R"("say \"hi\"")");
  EXPECT_EQ(AminoJsonString("a\\b"), R"("a\\b")");
  EXPECT_EQ(AminoJsonString("a\nb"), R"("a\nb")");
  EXPECT_EQ(AminoJsonString("a\rb\tc"), R"("a\rb\tc")");
}

TEST(AminoJsonStringTest, EscapesHtmlCharacters) {
  EXPECT_EQ(AminoJsonString("&<>"), R"("\u0026\u003c\u003e")");
  EXPECT_EQ(AminoJsonString("m&m"), R"("m\u0026m")");
}

TEST(AminoJsonStringTest, EscapesOtherControlCharactersInLowerCaseHex) {
  EXPECT_EQ(AminoJsonString(std::string("\0", 1)), R"("\u0000")");
  EXPECT_EQ(AminoJsonString("\x01"), R"("\u0001")");
  EXPECT_EQ(AminoJsonString("\x1b[0m"), R"("\u001b[0m")");
  EXPECT_EQ(AminoJsonString("\x1f"), R"("\u001f")");
  EXPECT_EQ(AminoJsonString("\x0b"), R"("\u000b")");
  // DEL is not a control character to JSON.
  EXPECT_EQ(AminoJsonString("\x7f"), "\"\x7f\"");
}

TEST(AminoJsonStringTest, KeepsMultibyteUtf8AsItIs) {
  EXPECT_EQ(AminoJsonString("caf\xc3\xa9"), "\"caf\xc3\xa9\"");
  EXPECT_EQ(AminoJsonString("\xe4\xb8\xad\xe6\x96\x87"), "\"\xe4\xb8\xad\xe6\x96\x87\"");
  EXPECT_EQ(AminoJsonString("\xf0\x9f\x9a\x80"), "\"\xf0\x9f\x9a\x80\"");
}

// Go's encoding/json (which the SDK's sorted sign doc goes through) writes backspace and form
// feed as \b and \f (Go 1.22 on, as JavaScript's JSON.stringify does), and always escapes
// U+2028 and U+2029; a memo holding any of them is signed by wallets in that form.
TEST(AminoJsonStringTest, MatchesGoForBackspaceFormFeedAndLineSeparators) {
  EXPECT_EQ(AminoJsonString("a\bb"), R"("a\bb")");
  EXPECT_EQ(AminoJsonString("a\fb"), R"("a\fb")");
  EXPECT_EQ(AminoJsonString("a\u2028b"), R"("a\u2028b")");
  EXPECT_EQ(AminoJsonString("a\u2029b"), R"("a\u2029b")");
}

// ---------------------------------------------------------------------------------------------
// AminoJsonSignBytes

TEST(AminoJsonSignBytesTest, MsgSendIsTheSdkStdSignDoc) {
  TxBody body;
  *body.add_messages() = Send("A", "B", "1000");
  body.set_memo("m&m");
  EXPECT_EQ(SignBytes(body, Fee("171", 85400)),
            R"({"account_number":"7","chain_id":"c-1",)"
            R"("fee":{"amount":[{"amount":"171","denom":"ngonka"}],"gas":"85400"},)"
            R"("memo":"m\u0026m",)"
            R"("msgs":[{"type":"cosmos-sdk/MsgSend","value":{"amount":[{"amount":"1000",)"
            R"("denom":"ngonka"}],"from_address":"A","to_address":"B"}}],"sequence":"3"})");
}

TEST(AminoJsonSignBytesTest, MsgSendWithAddresses) {
  TxBody body;
  *body.add_messages() = Send(kFrom, kTo, "1000");
  body.set_memo("m&m");
  EXPECT_EQ(SignBytes(body, Fee("171", 85400)),
            std::string(R"({"account_number":"7","chain_id":"c-1",)"
                        R"("fee":{"amount":[{"amount":"171","denom":"ngonka"}],"gas":"85400"},)"
                        R"("memo":"m\u0026m",)"
                        R"("msgs":[{"type":"cosmos-sdk/MsgSend","value":{"amount":[{"amount":)"
                        R"("1000","denom":"ngonka"}],"from_address":")") +
                kFrom + R"(","to_address":")" + kTo + R"("}}],"sequence":"3"})");
}

TEST(AminoJsonSignBytesTest, ChainIdAccountNumberAndSequenceAreWrittenAsGiven) {
  TxBody body;
  *body.add_messages() = Send("A", "B", "1");
  auto bytes = AminoJsonSignBytes(body, Fee("1", 1), "gonka<mainnet>", UINT64_MAX, 0);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_THAT(*bytes, HasSubstr(R"({"account_number":"18446744073709551615",)"));
  EXPECT_THAT(*bytes, HasSubstr(R"("chain_id":"gonka\u003cmainnet\u003e",)"));
  EXPECT_THAT(*bytes, HasSubstr(R"("sequence":"0"})"));
}

TEST(AminoJsonSignBytesTest, GovV1VoteWithoutMetadata) {
  TxBody body;
  *body.add_messages() = Vote(5, cosmos::gov::v1::VOTE_OPTION_YES, "V", "");
  EXPECT_EQ(SignBytes(body, Fee("171", 85400)),
            R"({"account_number":"7","chain_id":"c-1",)"
            R"("fee":{"amount":[{"amount":"171","denom":"ngonka"}],"gas":"85400"},"memo":"",)"
            R"("msgs":[{"type":"cosmos-sdk/v1/MsgVote",)"
            R"("value":{"option":1,"proposal_id":"5","voter":"V"}}],"sequence":"3"})");
}

TEST(AminoJsonSignBytesTest, GovV1VoteWithMetadata) {
  TxBody body;
  *body.add_messages() = Vote(5, cosmos::gov::v1::VOTE_OPTION_YES, "V", "x");
  EXPECT_THAT(SignBytes(body, Fee("171", 85400)),
              HasSubstr(R"("msgs":[{"type":"cosmos-sdk/v1/MsgVote",)"
                        R"("value":{"metadata":"x","option":1,"proposal_id":"5","voter":"V"}}])"));
}

TEST(AminoJsonSignBytesTest, EmptyFee) {
  TxBody body;
  *body.add_messages() = Send("A", "B", "1000");
  EXPECT_THAT(SignBytes(body, AuthInfo()), HasSubstr(R"("fee":{"amount":[],"gas":"0"},)"));
}

TEST(AminoJsonSignBytesTest, FeeCoinsSortedByDenom) {
  TxBody body;
  *body.add_messages() = Send("A", "B", "1000");
  AuthInfo auth_info = Fee("171", 85400);
  auto* coin = auth_info.mutable_fee()->add_amount();
  coin->set_denom("atoken");
  coin->set_amount("2");
  EXPECT_THAT(SignBytes(body, auth_info),
              HasSubstr(R"("fee":{"amount":[{"amount":"2","denom":"atoken"},)"
                        R"({"amount":"171","denom":"ngonka"}],"gas":"85400"},)"));
}

TEST(AminoJsonSignBytesTest, FeePayerAndGranterInSortedPosition) {
  TxBody body;
  *body.add_messages() = Send("A", "B", "1000");
  AuthInfo auth_info = Fee("171", 85400);
  auth_info.mutable_fee()->set_payer("P");
  auth_info.mutable_fee()->set_granter("G");
  EXPECT_THAT(SignBytes(body, auth_info),
              HasSubstr(R"("fee":{"amount":[{"amount":"171","denom":"ngonka"}],"gas":"85400",)"
                        R"("granter":"G","payer":"P"},)"));
}

TEST(AminoJsonSignBytesTest, TimeoutHeightComesAfterSequence) {
  TxBody body;
  *body.add_messages() = Send("A", "B", "1000");
  body.set_timeout_height(9);
  std::string bytes = SignBytes(body, Fee("171", 85400));
  EXPECT_THAT(bytes, HasSubstr(R"(,"sequence":"3","timeout_height":"9"})"));
  // Absent when zero.
  body.set_timeout_height(0);
  EXPECT_THAT(SignBytes(body, Fee("171", 85400)), ::testing::Not(HasSubstr("timeout_height")));
}

TEST(AminoJsonSignBytesTest, MessagesKeepTheirOrder) {
  TxBody body;
  *body.add_messages() = Vote(2, cosmos::gov::v1::VOTE_OPTION_NO, "V", "");
  *body.add_messages() = Send("A", "B", "1");
  std::string bytes = SignBytes(body, Fee("171", 85400));
  EXPECT_THAT(bytes, HasSubstr(R"("msgs":[{"type":"cosmos-sdk/v1/MsgVote",)"
                               R"("value":{"option":3,"proposal_id":"2","voter":"V"}},)"
                               R"({"type":"cosmos-sdk/MsgSend",)"));
}

// A shard proposal as a wallet signs it: the gov v1 envelope, the module's message inside in
// its own form (fields by name, zero values left out, uint64 as strings, uint32 and enums as
// numbers, bytes as base64), the initial deposit present even when empty.
TEST(AminoJsonSignBytesTest, GovV1SubmitProposalWithTheModulesMessage) {
  namespace pb = ::gonka::trainshard::v1;
  pb::MsgCreateTrainshardProposal create;
  create.set_authority("GOV");
  create.set_creator("C");
  pb::ShardSpec* spec = create.mutable_spec();
  spec->set_run_spec_hash(std::string("\x01\x02\xff", 3));
  spec->set_hardware_profile("cpu-small");
  spec->set_min_nodes(2);
  spec->set_max_nodes(3);
  spec->set_max_duration_blocks(40);
  spec->mutable_escrow()->set_denom("ngonka");
  spec->mutable_escrow()->set_amount("900000");
  spec->mutable_reward_policy()->set_kind(pb::RewardPolicy::KIND_VERIFIED_WORK);
  spec->add_readers("R1");
  spec->add_readers("R2");
  cosmos::gov::v1::MsgSubmitProposal proposal;
  *proposal.add_messages() = PackMsg(create);
  proposal.set_proposer("C");
  proposal.set_title("t<1>");
  TxBody body;
  *body.add_messages() = PackMsg(proposal);
  EXPECT_EQ(SignBytes(body, Fee("171", 85400)),
            R"({"account_number":"7","chain_id":"c-1",)"
            R"("fee":{"amount":[{"amount":"171","denom":"ngonka"}],"gas":"85400"},"memo":"",)"
            R"("msgs":[{"type":"cosmos-sdk/v1/MsgSubmitProposal","value":{"initial_deposit":[],)"
            R"("messages":[{"type":"trainshard/MsgCreateTrainshardProposal","value":{)"
            R"("authority":"GOV","creator":"C","spec":{"escrow":{"amount":"900000",)"
            R"("denom":"ngonka"},"hardware_profile":"cpu-small","max_duration_blocks":"40",)"
            R"("max_nodes":3,"min_nodes":2,"readers":["R1","R2"],"reward_policy":{"kind":1},)"
            R"("run_spec_hash":"AQL/"}}}],"proposer":"C","title":"t\u003c1\u003e"}}],)"
            R"("sequence":"3"})");
}

TEST(AminoJsonSignBytesTest, RefusesAMessageWithoutAnAminoForm) {
  TxBody body;
  *body.add_messages() = Send("A", "B", "1");
  google::protobuf::Any* other = body.add_messages();
  other->set_type_url("/gonka.trainshard.v1.MsgNoSuchThing");
  auto bytes = AminoJsonSignBytes(body, Fee("171", 85400), "c-1", 7, 3);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("tx.body.messages[1]"));
  EXPECT_THAT(std::string(bytes.status().message()),
              HasSubstr("/gonka.trainshard.v1.MsgNoSuchThing"));
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("SIGN_MODE_DIRECT"));

  TxBody alone;
  alone.add_messages()->set_type_url("/cosmos.staking.v1beta1.MsgDelegate");
  bytes = AminoJsonSignBytes(alone, Fee("171", 85400), "c-1", 7, 3);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("tx.body.messages[0]"));
  EXPECT_THAT(std::string(bytes.status().message()), HasSubstr("SIGN_MODE_DIRECT"));
}

TEST(AminoJsonSignBytesTest, RefusesAMessageThatDoesNotParse) {
  TxBody body;
  google::protobuf::Any* send = body.add_messages();
  send->set_type_url("/cosmos.bank.v1beta1.MsgSend");
  send->set_value("\xff\xff\xff");
  auto bytes = AminoJsonSignBytes(body, Fee("171", 85400), "c-1", 7, 3);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bytes.status().message(),
            "tx.body.messages[0]: does not parse as /cosmos.bank.v1beta1.MsgSend");
}

}  // namespace
}  // namespace ts::bridge
