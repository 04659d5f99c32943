#include "chain-bridge/module/tx_errors.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "chain-bridge/module/str_cat.h"

namespace ts::bridge {
namespace {

// Where an SDK status keeps its code: a payload, so the code survives copies of the status.
constexpr absl::string_view kSdkCodePayload = "type.googleapis.com/trainshard.SdkCode";
// "<codespace> <code>" of another module's error.
constexpr absl::string_view kCodespacePayload = "type.googleapis.com/trainshard.Codespace";

absl::StatusCode NearestCode(SdkCode code) {
  switch (code) {
    case SdkCode::kUnauthorized:
      return absl::StatusCode::kUnauthenticated;
    case SdkCode::kInsufficientFunds:
    case SdkCode::kInsufficientFee:
    case SdkCode::kWrongSequence:
    case SdkCode::kTxTimeoutHeight:
      return absl::StatusCode::kFailedPrecondition;
    case SdkCode::kUnknownAddress:
      return absl::StatusCode::kNotFound;
    case SdkCode::kOutOfGas:
    case SdkCode::kMempoolIsFull:
      return absl::StatusCode::kResourceExhausted;
    case SdkCode::kTxInMempoolCache:
      return absl::StatusCode::kAlreadyExists;
    default:
      return absl::StatusCode::kInvalidArgument;
  }
}

}  // namespace

std::string_view SdkDescription(SdkCode code) {
  switch (code) {
    case SdkCode::kTxDecode:
      return "tx parse error";
    case SdkCode::kUnauthorized:
      return "unauthorized";
    case SdkCode::kInsufficientFunds:
      return "insufficient funds";
    case SdkCode::kUnknownRequest:
      return "unknown request";
    case SdkCode::kInvalidAddress:
      return "invalid address";
    case SdkCode::kInvalidPubKey:
      return "invalid pubkey";
    case SdkCode::kUnknownAddress:
      return "unknown address";
    case SdkCode::kInvalidCoins:
      return "invalid coins";
    case SdkCode::kOutOfGas:
      return "out of gas";
    case SdkCode::kMemoTooLarge:
      return "memo too large";
    case SdkCode::kInsufficientFee:
      return "insufficient fee";
    case SdkCode::kTooManySignatures:
      return "maximum number of signatures exceeded";
    case SdkCode::kNoSignatures:
      return "no signatures supplied";
    case SdkCode::kInvalidRequest:
      return "invalid request";
    case SdkCode::kTxInMempoolCache:
      return "tx already in mempool";
    case SdkCode::kMempoolIsFull:
      return "mempool is full";
    case SdkCode::kTxTooLarge:
      return "tx too large";
    case SdkCode::kTxTimeoutHeight:
      return "tx timeout height";
    case SdkCode::kWrongSequence:
      return "incorrect account sequence";
    case SdkCode::kInvalidGasLimit:
      return "invalid gas limit";
  }
  return "unknown";
}

absl::Status SdkError(SdkCode code, std::string_view detail) {
  absl::Status status(NearestCode(code), Cat(detail, ": ", SdkDescription(code)));
  status.SetPayload(kSdkCodePayload, absl::Cord(absl::StrCat(static_cast<uint32_t>(code))));
  return status;
}

absl::Status SdkError(SdkCode code, const absl::Status& cause) {
  absl::string_view message = cause.message();
  return SdkError(code, std::string_view(message.data(), message.size()));
}

absl::Status WithCodespace(absl::Status status, std::string_view codespace, uint32_t code) {
  status.SetPayload(kCodespacePayload, absl::Cord(Cat(codespace, " ", code)));
  return status;
}

TxCode TxCodeOf(const absl::Status& status) {
  auto payload = status.GetPayload(kSdkCodePayload);
  uint32_t sdk_code = 0;
  if (payload.has_value() && absl::SimpleAtoi(std::string(*payload), &sdk_code)) {
    return TxCode{std::string(kSdkCodespace), sdk_code};
  }
  if (auto other = status.GetPayload(kCodespacePayload); other.has_value()) {
    std::string text(*other);
    size_t space = text.find(' ');
    uint32_t code = 0;
    if (space != std::string::npos &&
        absl::SimpleAtoi(absl::string_view(text).substr(space + 1), &code) && code != 0) {
      return TxCode{text.substr(0, space), code};
    }
  }
  return TxCode{std::string(kCodespace), static_cast<uint32_t>(status.code())};
}

std::string RefusalMessage(std::string_view log, const TxCode& code) {
  return Cat(log, " (codespace ", code.codespace, ", code ", code.code, ")");
}

bool ParseRefusalMessage(std::string_view message, std::string* log, TxCode* code) {
  constexpr std::string_view kOpen = " (codespace ";
  constexpr std::string_view kCode = ", code ";
  size_t open = message.rfind(kOpen);
  if (open == std::string_view::npos || !message.ends_with(")")) return false;
  std::string_view tail = message.substr(open + kOpen.size());
  tail.remove_suffix(1);
  size_t comma = tail.find(kCode);
  if (comma == std::string_view::npos) return false;
  std::string_view number = tail.substr(comma + kCode.size());
  uint32_t value = 0;
  if (!absl::SimpleAtoi(absl::string_view(number.data(), number.size()), &value) || value == 0) {
    return false;
  }
  *log = std::string(message.substr(0, open));
  code->codespace = std::string(tail.substr(0, comma));
  code->code = value;
  return true;
}

absl::Status PrefixStatus(std::string_view prefix, const absl::Status& status) {
  absl::Status out(status.code(), Cat(prefix, status.message()));
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    out.SetPayload(type_url, payload);
  });
  return out;
}

}  // namespace ts::bridge
