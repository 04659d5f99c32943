// Parsing of JSON-RPC requests from untrusted clients for the devnet's CometBFT JSON-RPC: a
// POST body (one request or a batch), the URI form's query string, and the typed parameters the
// methods take. Internal to the devnet's RPC server; the fuzz target fuzz_rpc_request drives it.
// Pure functions; thread-safe.
#ifndef TS_CHAIN_BRIDGE_DEVNET_RPC_REQUEST_H_
#define TS_CHAIN_BRIDGE_DEVNET_RPC_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ts::bridge::devnet {

using Json = nlohmann::json;

// Requests in one batch at most.
inline constexpr size_t kMaxBatch = 10;
inline constexpr int kMaxPerPage = 100;
inline constexpr int kDefaultPerPage = 30;
// Parameters of the URI form at most.
inline constexpr size_t kMaxUriParams = 16;
// Arrays and objects nested in a request at most (copying and writing JSON recurse per level).
inline constexpr int kMaxJsonDepth = 32;

struct RpcRequest {
  Json id = -1;
  std::string method;
  Json params = Json::object();
};

// A body's requests. Errors carry the JSON-RPC code in their message's first word:
// INVALID_ARGUMENT "-32700 ..." (not JSON, or nested deeper than kMaxJsonDepth), "-32600 ..."
// (not a request, an empty or too big batch). A single request is a batch of one; `batch` says
// which it was.
absl::StatusOr<std::vector<RpcRequest>> ParseRpcBody(std::string_view body, bool* batch);
// JSON text parsed only if it nests at most kMaxJsonDepth deep (a discarded value otherwise, or
// for text that is not JSON).
Json ParseBoundedJson(std::string_view text);

// One request (a WebSocket message, or an element of a batch).
absl::StatusOr<RpcRequest> ParseRpcRequest(const Json& request);

// The URI form's query string ("a=1&b=%22x%22"): names to strings, "quoted" values unquoted,
// percent escapes decoded; at most kMaxUriParams.
Json UriParams(std::string_view query);

// `json` as text; invalid UTF-8 in strings (the client's bytes echoed back) is replaced, never
// thrown on.
std::string Dump(const Json& json);

// A parameter as text: a JSON string as it is, a number or a boolean written out, absent or null
// as "".
std::string Param(const Json& params, const char* name);
// INVALID_ARGUMENT naming the parameter for text that is not a base-10 int64.
absl::StatusOr<int64_t> IntParam(const Json& params, const char* name, int64_t absent);
// INVALID_ARGUMENT naming the parameter for text that is not base64.
absl::StatusOr<std::string> Base64Param(const Json& params, const char* name);

struct Page {
  int64_t page = 1;
  int64_t per_page = kDefaultPerPage;
  bool descending = false;
};
// page (>= 1), per_page (clamped to 1..kMaxPerPage), order_by ("asc" or "desc").
absl::StatusOr<Page> PageParams(const Json& params);

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_RPC_REQUEST_H_
