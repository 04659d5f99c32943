// SIGN_MODE_LEGACY_AMINO_JSON, how Ledger devices and many wallets sign: the bytes signed are the
// Cosmos SDK's StdSignDoc as canonical JSON (keys sorted at every level, no whitespace, numbers
// as strings, '&', '<' and '>' escaped as \u0026, \u003c and \u003e), built here from the tx's
// decoded body and auth info. Messages with an amino JSON form here: cosmos-sdk/MsgSend,
// cosmos-sdk/v1/MsgVote, cosmos-sdk/v1/MsgDeposit, cosmos-sdk/v1/MsgSubmitProposal (its messages
// in their own forms) and the module's messages as "trainshard/<name>", written by the rules the
// SDK applies to a message without amino options (docs/protocol.md, "Transactions"); any other
// message must be signed in SIGN_MODE_DIRECT. Pure functions; thread-safe.
#ifndef TS_CHAIN_BRIDGE_MODULE_AMINO_JSON_H_
#define TS_CHAIN_BRIDGE_MODULE_AMINO_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cosmos/tx/v1beta1/tx.pb.h"

namespace ts::bridge {

// The StdSignDoc bytes of a tx's body and auth info for the signer's account number and
// sequence. INVALID_ARGUMENT naming the message for a message without an amino JSON form (or
// whose Any does not parse).
absl::StatusOr<std::string> AminoJsonSignBytes(const cosmos::tx::v1beta1::TxBody& body,
                                               const cosmos::tx::v1beta1::AuthInfo& auth_info,
                                               std::string_view chain_id, uint64_t account_number,
                                               uint64_t sequence);

// A JSON string literal as the SDK's sorted JSON writes it (Go's encoder with HTML escaping:
// \b, \f, \n, \r, \t, other control characters as \u00XX, &<> and U+2028, U+2029 as \uXXXX).
std::string AminoJsonString(std::string_view text);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_AMINO_JSON_H_
