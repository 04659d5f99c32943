#include "chain-bridge/module/amino_json.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "chain-bridge/module/str_cat.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace ts::bridge {
namespace {

// A JSON object whose members are written in key order.
class Object {
 public:
  Object& Raw(std::string_view key, std::string value) {
    members_[std::string(key)] = std::move(value);
    return *this;
  }
  Object& Text(std::string_view key, std::string_view value) {
    return Raw(key, AminoJsonString(value));
  }
  std::string Json() const {
    std::string out = "{";
    for (const auto& [key, value] : members_) {
      if (out.size() > 1) out.push_back(',');
      absl::StrAppend(&out, AminoJsonString(key), ":", value);
    }
    out.push_back('}');
    return out;
  }

 private:
  std::map<std::string, std::string> members_;
};

std::string Array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append(items[i]);
  }
  out.push_back(']');
  return out;
}

std::string Number(uint64_t value) { return AminoJsonString(Cat(value)); }

std::string Coins(const google::protobuf::RepeatedPtrField<cosmos::base::v1beta1::Coin>& coins) {
  std::vector<std::pair<std::string, std::string>> sorted;
  for (const auto& coin : coins) sorted.emplace_back(coin.denom(), coin.amount());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> items;
  for (const auto& [denom, amount] : sorted) {
    items.push_back(Object().Text("amount", amount).Text("denom", denom).Json());
  }
  return Array(items);
}

std::string Typed(std::string_view type, const Object& value) {
  return Object().Text("type", type).Raw("value", value.Json()).Json();
}

// The module's messages have no amino registration of their own in any Go codebase; their
// amino JSON follows the rules the SDK applies to a message without amino options: fields in
// name order, zero values, empty strings, empty lists and unset messages left out, 64-bit
// integers as strings, 32-bit ones and enums as numbers, bytes as standard base64.
std::string GenericJson(const google::protobuf::Message& message);

std::string FieldValue(const google::protobuf::Message& message,
                       const google::protobuf::FieldDescriptor* field, int index) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = message.GetReflection();
  const bool repeated = field->is_repeated();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return Cat(repeated ? r->GetRepeatedInt32(message, field, index)
                          : r->GetInt32(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return Cat(repeated ? r->GetRepeatedUInt32(message, field, index)
                          : r->GetUInt32(message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return AminoJsonString(
          Cat(repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field)));
    case FieldDescriptor::CPPTYPE_UINT64:
      return Number(repeated ? r->GetRepeatedUInt64(message, field, index)
                             : r->GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return (repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                 ? "true"
                 : "false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return Cat(repeated ? r->GetRepeatedEnumValue(message, field, index)
                          : r->GetEnumValue(message, field));
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& value =
          repeated ? r->GetRepeatedStringReference(message, field, index, &scratch)
                   : r->GetStringReference(message, field, &scratch);
      if (field->type() == FieldDescriptor::TYPE_BYTES) {
        return AminoJsonString(absl::Base64Escape(value));
      }
      return AminoJsonString(value);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return GenericJson(repeated ? r->GetRepeatedMessage(message, field, index)
                                  : r->GetMessage(message, field));
    default:
      return "null";  // floats: no message of the module has one
  }
}

std::string GenericJson(const google::protobuf::Message& message) {
  const google::protobuf::Reflection* r = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(message, &fields);  // only those set: the zero values are left out
  Object out;
  for (const auto* field : fields) {
    if (field->is_repeated()) {
      std::vector<std::string> items;
      for (int i = 0; i < r->FieldSize(message, field); ++i) {
        items.push_back(FieldValue(message, field, i));
      }
      out.Raw(field->name(), Array(items));
    } else {
      out.Raw(field->name(), FieldValue(message, field, 0));
    }
  }
  return out.Json();
}

constexpr absl::string_view kModuleMsgPrefix = "/gonka.trainshard.v1.Msg";

absl::StatusOr<std::string> AminoMsg(int index, const google::protobuf::Any& any);

// cosmos-sdk/v1/MsgSubmitProposal, its messages in their own amino form.
absl::StatusOr<std::string> AminoSubmitProposal(int index,
                                                const cosmos::gov::v1::MsgSubmitProposal& msg) {
  Object value;
  std::vector<std::string> messages;
  for (const auto& inner : msg.messages()) {
    auto json = AminoMsg(index, inner);
    if (!json.ok()) return json.status();
    messages.push_back(*std::move(json));
  }
  if (!messages.empty()) value.Raw("messages", Array(messages));
  value.Raw("initial_deposit", Coins(msg.initial_deposit()));  // present even when empty
  if (!msg.proposer().empty()) value.Text("proposer", msg.proposer());
  if (!msg.metadata().empty()) value.Text("metadata", msg.metadata());
  if (!msg.title().empty()) value.Text("title", msg.title());
  if (!msg.summary().empty()) value.Text("summary", msg.summary());
  return Typed("cosmos-sdk/v1/MsgSubmitProposal", value);
}

absl::StatusOr<std::string> AminoMsg(int index, const google::protobuf::Any& any) {
  auto unparsable = [&] {
    return absl::InvalidArgumentError(
        Cat("tx.body.messages[", index, "]: does not parse as ", any.type_url()));
  };
  if (any.type_url() == "/cosmos.bank.v1beta1.MsgSend") {
    cosmos::bank::v1beta1::MsgSend msg;
    if (!msg.ParseFromString(any.value())) return unparsable();
    return Typed("cosmos-sdk/MsgSend", Object()
                                           .Raw("amount", Coins(msg.amount()))
                                           .Text("from_address", msg.from_address())
                                           .Text("to_address", msg.to_address()));
  }
  if (any.type_url() == "/cosmos.gov.v1.MsgVote") {
    cosmos::gov::v1::MsgVote msg;
    if (!msg.ParseFromString(any.value())) return unparsable();
    Object value;
    value.Raw("option", Cat(static_cast<int>(msg.option())))
        .Raw("proposal_id", Number(msg.proposal_id()))
        .Text("voter", msg.voter());
    if (!msg.metadata().empty()) value.Text("metadata", msg.metadata());
    return Typed("cosmos-sdk/v1/MsgVote", value);
  }
  if (any.type_url() == "/cosmos.gov.v1.MsgDeposit") {
    cosmos::gov::v1::MsgDeposit msg;
    if (!msg.ParseFromString(any.value())) return unparsable();
    return Typed("cosmos-sdk/v1/MsgDeposit", Object()
                                                 .Raw("amount", Coins(msg.amount()))
                                                 .Text("depositor", msg.depositor())
                                                 .Raw("proposal_id", Number(msg.proposal_id())));
  }
  if (any.type_url() == "/cosmos.gov.v1.MsgSubmitProposal") {
    cosmos::gov::v1::MsgSubmitProposal msg;
    if (!msg.ParseFromString(any.value())) return unparsable();
    return AminoSubmitProposal(index, msg);
  }
  if (absl::StartsWith(any.type_url(), kModuleMsgPrefix)) {
    const std::string name = any.type_url().substr(1);
    const google::protobuf::Descriptor* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(name);
    if (descriptor != nullptr) {
      std::unique_ptr<google::protobuf::Message> msg(
          google::protobuf::MessageFactory::generated_factory()->GetPrototype(descriptor)->New());
      if (!msg->ParseFromString(any.value())) return unparsable();
      // "trainshard/MsgReserveTrainshard", as the SDK names a module's messages.
      return Object()
          .Text("type", Cat("trainshard/", descriptor->name()))
          .Raw("value", GenericJson(*msg))
          .Json();
    }
  }
  return absl::InvalidArgumentError(
      Cat("tx.body.messages[", index, "] (", any.type_url().substr(0, 128),
          "): has no amino JSON form here; sign it with SIGN_MODE_DIRECT"));
}

}  // namespace

std::string AminoJsonString(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    // U+2028 and U+2029 (E2 80 A8 / A9), which Go's encoder escapes.
    if (c == 0xe2 && i + 2 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0x80 &&
        (static_cast<unsigned char>(text[i + 2]) == 0xa8 ||
         static_cast<unsigned char>(text[i + 2]) == 0xa9)) {
      out.append(static_cast<unsigned char>(text[i + 2]) == 0xa8 ? "\\u2028" : "\\u2029");
      i += 2;
      continue;
    }
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      case '\b':
        out.append("\\b");
        break;
      case '\f':
        out.append("\\f");
        break;
      case '&':
      case '<':
      case '>':
        out.append(absl::StrFormat("\\u%04x", c));
        break;
      default:
        if (c < 0x20) {
          out.append(absl::StrFormat("\\u%04x", c));
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

absl::StatusOr<std::string> AminoJsonSignBytes(const cosmos::tx::v1beta1::TxBody& body,
                                               const cosmos::tx::v1beta1::AuthInfo& auth_info,
                                               std::string_view chain_id, uint64_t account_number,
                                               uint64_t sequence) {
  std::vector<std::string> msgs;
  for (int i = 0; i < body.messages_size(); ++i) {
    auto msg = AminoMsg(i, body.messages(i));
    if (!msg.ok()) return msg.status();
    msgs.push_back(*std::move(msg));
  }
  Object fee;
  fee.Raw("amount", Coins(auth_info.fee().amount()))
      .Raw("gas", Number(auth_info.fee().gas_limit()));
  if (!auth_info.fee().payer().empty()) fee.Text("payer", auth_info.fee().payer());
  if (!auth_info.fee().granter().empty()) fee.Text("granter", auth_info.fee().granter());
  Object doc;
  doc.Raw("account_number", Number(account_number))
      .Text("chain_id", chain_id)
      .Raw("fee", fee.Json())
      .Text("memo", body.memo())
      .Raw("msgs", Array(msgs))
      .Raw("sequence", Number(sequence));
  if (body.timeout_height() != 0) doc.Raw("timeout_height", Number(body.timeout_height()));
  return doc.Json();
}

}  // namespace ts::bridge
