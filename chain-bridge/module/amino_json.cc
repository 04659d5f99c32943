#include "chain-bridge/module/amino_json.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "chain-bridge/module/str_cat.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "cosmos/gov/v1/tx.pb.h"

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
