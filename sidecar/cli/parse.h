// Parsing of `trainshard` flag values. Every error is INVALID_ARGUMENT and names the flag and the
// value it refused, e.g. `--account "gonka1xyz=12": ...`, so the user sees what to fix.
//
// Thread-safety: pure functions, safe from any thread.
#ifndef TS_SIDECAR_CLI_PARSE_H_
#define TS_SIDECAR_CLI_PARSE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"

namespace ts::sidecar {

// Caps on what one invocation may carry; the chain has its own, lower ones.
inline constexpr size_t kFlagValuesMax = 10000;
inline constexpr size_t kInputFileBytesMax = 1 << 20;

struct AddressValue {
  std::string address;
  uint64_t value = 0;
};

// "ADDR=AMOUNT": a gonka bech32 address and an ngonka amount (base-10, no sign, no leading
// zeros).
absl::StatusOr<AddressValue> ParseAddressAmount(const std::string& flag, const std::string& text);
// "ADDR=WEIGHT": the same shape, for PoC weights.
absl::StatusOr<AddressValue> ParseAddressWeight(const std::string& flag, const std::string& text);
// Every value of a repeated flag; also refuses the same address twice and more than
// kFlagValuesMax values.
absl::StatusOr<std::vector<AddressValue>> ParseAddressAmounts(
    const std::string& flag, const std::vector<std::string>& texts);
absl::StatusOr<std::vector<AddressValue>> ParseAddressWeights(
    const std::string& flag, const std::vector<std::string>& texts);

// A gonka bech32 account address.
absl::StatusOr<std::string> ParseAccountAddress(const std::string& flag, const std::string& text);
// An ngonka amount.
absl::StatusOr<uint64_t> ParseAmountFlag(const std::string& flag, const std::string& text);

// 64 hex characters → 32 bytes.
absl::StatusOr<std::string> ParseHex32(const std::string& flag, const std::string& text);

// "HOST:PORT" of a gRPC endpoint (port 1..65535; HOST non-empty, "[v6]" allowed).
absl::StatusOr<std::string> ParseEndpoint(const std::string& flag, const std::string& text);
// A listen address: as ParseEndpoint, except that port 0 (any free port) is allowed.
absl::StatusOr<std::string> ParseListenAddress(const std::string& flag, const std::string& text);
// "A,B,C" of endpoints; empty items, duplicates and more than kFlagValuesMax are refused.
absl::StatusOr<std::vector<std::string>> ParseEndpointList(const std::string& flag,
                                                           const std::string& text);

// A host sidecar's operator API as a gRPC target. The sidecar serves it on a Unix socket only
// (docs/host-sidecar.md), named here as "unix:PATH" (what <data_dir>/operator.addr holds), as
// the sidecar's data dir (its operator.addr is read), or as the socket's path; "HOST:PORT" is
// also taken, for an operator API reached through a tunnel. INVALID_ARGUMENT naming the flag and
// the value when it is none of these (a data dir without operator.addr: "is the sidecar
// running?").
absl::StatusOr<std::string> ParseHostTarget(const std::string& flag, const std::string& text);
// "A,B,C" of host targets, as ParseEndpointList.
absl::StatusOr<std::vector<std::string>> ParseHostTargetList(const std::string& flag,
                                                             const std::string& text);

// proposed|open|running|settled|expired|rejected.
absl::StatusOr<gonka::trainshard::v1::ShardStatus> ParseShardStatus(const std::string& flag,
                                                                    const std::string& text);
// yes|no|abstain|veto.
absl::StatusOr<cosmos::gov::v1::VoteOption> ParseVoteOption(const std::string& flag,
                                                            const std::string& text);

// Reads a whole file of at most kInputFileBytesMax bytes. NOT_FOUND / PERMISSION_DENIED /
// FAILED_PRECONDITION (too large, not a regular file), each naming the flag and the path.
absl::StatusOr<std::string> ReadInputFile(const std::string& flag, const std::string& path);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_PARSE_H_
