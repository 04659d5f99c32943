// How a refused tx is reported: the Cosmos SDK's registered errors (codespace "sdk") for what
// the ante step and the bank refuse, as a Cosmos node reports them, Gonka's inference module's
// (codespace "inference") in the gonka-v0 profile, and this module's own errors (codespace
// "trainshard", the code being the absl::StatusCode number) for everything else. docs/protocol.md,
// "Error codes", lists both. Pure functions; thread-safe.
#ifndef TS_CHAIN_BRIDGE_MODULE_TX_ERRORS_H_
#define TS_CHAIN_BRIDGE_MODULE_TX_ERRORS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ts::bridge {

// Codespace of this module's own errors; the code is the absl::StatusCode number.
inline constexpr std::string_view kCodespace = "trainshard";
// Codespace of the Cosmos SDK's root errors (cosmossdk.io/errors, types/errors).
inline constexpr std::string_view kSdkCodespace = "sdk";

// The SDK's numbers, as registered in its root codespace.
enum class SdkCode : uint32_t {
  kTxDecode = 2,
  kUnauthorized = 4,
  kInsufficientFunds = 5,
  kUnknownRequest = 6,
  kInvalidAddress = 7,
  kInvalidPubKey = 8,
  kUnknownAddress = 9,
  kInvalidCoins = 10,
  kOutOfGas = 11,
  kMemoTooLarge = 12,
  kInsufficientFee = 13,
  kTooManySignatures = 14,
  kNoSignatures = 15,
  kInvalidRequest = 18,
  kTxInMempoolCache = 19,
  kMempoolIsFull = 20,
  kTxTooLarge = 21,
  kTxTimeoutHeight = 30,
  kWrongSequence = 32,
  kInvalidGasLimit = 41,
};

// The SDK's description of `code` ("tx parse error", "insufficient funds", ...).
std::string_view SdkDescription(SdkCode code);

// A status that reports as SDK `code`: its message reads "<detail>: <description>", as the
// SDK's wrapped errors do, and its absl code is the nearest one (INVALID_ARGUMENT for a decode
// error, FAILED_PRECONDITION for funds and sequences, UNAUTHENTICATED for signatures, ...), so
// callers inside the project may still test it with absl::Is*.
absl::Status SdkError(SdkCode code, std::string_view detail);
// SdkError with the message of `cause` as the detail.
absl::Status SdkError(SdkCode code, const absl::Status& cause);

// `status` reporting as `code` of another module's codespace (Gonka's "inference" in the
// gonka-v0 profile), its message and absl code kept.
absl::Status WithCodespace(absl::Status status, std::string_view codespace, uint32_t code);

// The codespace and code a TxResponse carries for a non-OK `status`.
struct TxCode {
  std::string codespace;
  uint32_t code = 0;
};
TxCode TxCodeOf(const absl::Status& status);

// How a refusal travels in the message of a gRPC error (the devnet's Simulate answers a tx that
// would fail so): "<log> (codespace C, code N)".
std::string RefusalMessage(std::string_view log, const TxCode& code);
// The inverse: false when `message` does not end that way (or names code 0).
bool ParseRefusalMessage(std::string_view message, std::string* log, TxCode* code);

// `status` with `prefix` before its message, keeping what it reports as (its payloads).
absl::Status PrefixStatus(std::string_view prefix, const absl::Status& status);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_TX_ERRORS_H_
