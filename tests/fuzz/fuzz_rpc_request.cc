// Fuzz target: the devnet's JSON-RPC request parsing, the first code to touch a client's POST body
// or URI query string. Checks that refusals are INVALID_ARGUMENT carrying a JSON-RPC code, that
// an accepted body keeps the batch cap and yields well-formed requests, and that every typed
// parameter the methods read (height, tx, paging, query) only answers, and that writing params,
// ids and URI params back out never throws, whatever bytes they hold.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "chain-bridge/devnet/event_query.h"
#include "chain-bridge/devnet/rpc_request.h"
#include "common/status.h"

namespace {

namespace devnet = ts::bridge::devnet;

bool CodeIsInvalidArgument(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument;
}

void CheckParams(const devnet::Json& params) {
  const std::string height = devnet::Param(params, "height");
  auto height_value = devnet::IntParam(params, "height", /*absent=*/-1);
  if (height.empty()) {
    TS_CHECK(height_value.ok() && *height_value == -1);
  } else if (!height_value.ok()) {
    TS_CHECK(CodeIsInvalidArgument(height_value.status()));
    TS_CHECK(height_value.status().message().substr(0, 8) == "height: ");
  }

  auto tx = devnet::Base64Param(params, "tx");
  if (tx.ok()) {
    TS_CHECK(tx->size() <= devnet::Param(params, "tx").size());
  } else {
    TS_CHECK(CodeIsInvalidArgument(tx.status()));
    TS_CHECK(tx.status().message() == "tx: not base64");
  }

  auto page = devnet::PageParams(params);
  if (page.ok()) {
    TS_CHECK(page->page >= 1);
    TS_CHECK(page->per_page >= 1 && page->per_page <= devnet::kMaxPerPage);
    // The offset of the page's first item fits an int64.
    TS_CHECK(page->page - 1 <= INT64_MAX / page->per_page);
  } else {
    TS_CHECK(CodeIsInvalidArgument(page.status()));
  }

  auto query = devnet::ParseEventQuery(devnet::Param(params, "query"));
  if (query.ok()) {
    TS_CHECK(query->conditions.size() <= devnet::kMaxConditions);
  } else {
    TS_CHECK(CodeIsInvalidArgument(query.status()));
  }

  (void)devnet::Dump(params);
}

void CheckBody(std::string_view body) {
  bool batch = false;
  auto requests = devnet::ParseRpcBody(body, &batch);
  if (!requests.ok()) {
    TS_CHECK(CodeIsInvalidArgument(requests.status()));
    const std::string message(requests.status().message());
    TS_CHECK(message.substr(0, 7) == "-32700 " || message.substr(0, 7) == "-32600 ");
    return;
  }
  TS_CHECK(!requests->empty());
  TS_CHECK(requests->size() <= devnet::kMaxBatch);
  if (!batch) TS_CHECK(requests->size() == 1);
  for (const devnet::RpcRequest& request : *requests) {
    TS_CHECK(request.params.is_object());
    TS_CHECK(request.id.is_string() || request.id.is_number() || request.id.is_null());
    CheckParams(request.params);
    (void)devnet::Dump(request.id);
  }
}

void CheckQueryString(std::string_view query) {
  const devnet::Json params = devnet::UriParams(query);
  TS_CHECK(params.is_object());
  TS_CHECK(params.size() <= devnet::kMaxUriParams);
  for (const auto& [name, value] : params.items()) TS_CHECK(value.is_string());
  CheckParams(params);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  CheckBody(input);
  CheckQueryString(input);
  return 0;
}
