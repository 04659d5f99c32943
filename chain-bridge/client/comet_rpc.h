// A client of a CometBFT node's JSON-RPC (docs/devnet.md, "CometBFT JSON-RPC"): one POST per
// call over plain HTTP/1.1, with a deadline and a cap on the answer. The host sidecar reads each
// height's events through `block_results` here, as it would from a real node: every tx's events
// in order, then the block's finalize events.
//
// Thread-safety: the functions are thread-safe (each call opens its own connection).
#ifndef TS_CHAIN_BRIDGE_CLIENT_COMET_RPC_H_
#define TS_CHAIN_BRIDGE_CLIENT_COMET_RPC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tendermint/abci/types.pb.h"

namespace ts::bridge {

// The largest JSON-RPC answer read (a block's results with every event of up to 5,000 txs).
inline constexpr size_t kMaxCometRpcResponseBytes = 64 << 20;

// POSTs {"jsonrpc":"2.0","id":1,"method":method,"params":params_json} to http://target/ and
// returns the answer's "result" as JSON text. Errors: UNAVAILABLE (cannot connect, the
// connection broke), DEADLINE_EXCEEDED, DATA_LOSS (not HTTP, too big, not JSON-RPC), and for a
// JSON-RPC error: NOT_FOUND when its data says "must be less than or equal to the current
// blockchain height" (a height not reached yet), else INVALID_ARGUMENT with its message.
absl::StatusOr<std::string> CometRpcCall(const std::string& target, std::string_view method,
                                         std::string_view params_json, int64_t timeout_ms);

// block_results at `height`: each tx's events, then the finalize-block events. NOT_FOUND past
// the latest height.
absl::StatusOr<std::vector<tendermint::abci::Event>> CometBlockEvents(const std::string& target,
                                                                      int64_t height,
                                                                      int64_t timeout_ms);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_CLIENT_COMET_RPC_H_
