#include "chain-bridge/devnet/rpc_request.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ts::bridge::devnet {
namespace {

absl::string_view Absl(std::string_view s) { return {s.data(), s.size()}; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string PercentDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out.push_back(' ');
    } else if (text[i] == '%' && i + 2 < text.size() && HexValue(text[i + 1]) >= 0 &&
               HexValue(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(text[i + 1]) * 16 + HexValue(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

// The deepest nesting of arrays and objects in `text`, brackets inside strings not counted;
// stops counting past `limit`.
int Depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

Json ParseBoundedJson(std::string_view text) {
  if (Depth(text, kMaxJsonDepth) > kMaxJsonDepth) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

absl::StatusOr<RpcRequest> ParseRpcRequest(const Json& request) {
  if (!request.is_object()) {
    return absl::InvalidArgumentError("-32600 Invalid Request: not a JSON object");
  }
  RpcRequest out;
  auto id = request.find("id");
  if (id != request.end()) {
    if (!id->is_string() && !id->is_number() && !id->is_null()) {
      return absl::InvalidArgumentError("-32600 Invalid Request: id is not a string or a number");
    }
    out.id = *id;
  }
  auto method = request.find("method");
  if (method == request.end() || !method->is_string()) {
    return absl::InvalidArgumentError("-32600 Invalid Request: no method");
  }
  out.method = method->get<std::string>();
  auto params = request.find("params");
  if (params != request.end() && !params->is_null()) {
    if (!params->is_object()) {
      return absl::InvalidArgumentError("-32600 Invalid Request: params is not an object");
    }
    out.params = *params;
  }
  return out;
}

absl::StatusOr<std::vector<RpcRequest>> ParseRpcBody(std::string_view body, bool* batch) {
  if (Depth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("-32700 Parse error: nested deeper than ", kMaxJsonDepth));
  }
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError("-32700 Parse error: not JSON");
  *batch = parsed.is_array();
  std::vector<RpcRequest> out;
  if (!*batch) {
    TS_ASSIGN_OR_RETURN(RpcRequest one, ParseRpcRequest(parsed));
    out.push_back(std::move(one));
    return out;
  }
  if (parsed.empty() || parsed.size() > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "-32600 Invalid Request: a batch of ", parsed.size(), " requests (1..", kMaxBatch, ")"));
  }
  for (const auto& one : parsed) {
    TS_ASSIGN_OR_RETURN(RpcRequest request, ParseRpcRequest(one));
    out.push_back(std::move(request));
  }
  return out;
}

Json UriParams(std::string_view query) {
  Json params = Json::object();
  std::string_view rest = query;
  while (!rest.empty() && params.size() < kMaxUriParams) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? "" : rest.substr(amp + 1);
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos) continue;
    std::string value = PercentDecode(pair.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    params[PercentDecode(pair.substr(0, eq))] = std::move(value);
  }
  return params;
}

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Param(const Json& params, const char* name) {
  if (!params.is_object()) return "";
  auto it = params.find(name);
  if (it == params.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  return Dump(*it);
}

absl::StatusOr<int64_t> IntParam(const Json& params, const char* name, int64_t absent) {
  std::string text = Param(params, name);
  if (text.empty()) return absent;
  int64_t value = 0;
  if (!absl::SimpleAtoi(Absl(text), &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": \"", absl::CHexEscape(Absl(text).substr(0, 40)), "\" is not an integer"));
  }
  return value;
}

absl::StatusOr<std::string> Base64Param(const Json& params, const char* name) {
  std::string text = Param(params, name);
  std::string bytes;
  if (!absl::Base64Unescape(Absl(text), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not base64"));
  }
  return bytes;
}

absl::StatusOr<Page> PageParams(const Json& params) {
  Page p;
  TS_ASSIGN_OR_RETURN(p.page, IntParam(params, "page", 1));
  TS_ASSIGN_OR_RETURN(p.per_page, IntParam(params, "per_page", kDefaultPerPage));
  if (p.page < 1) return absl::InvalidArgumentError(absl::StrCat("page: ", p.page, " < 1"));
  // A page past what int64 can skip to is as empty as any other page past the end.
  p.page = std::min<int64_t>(p.page, INT64_MAX / kMaxPerPage);
  p.per_page = std::clamp<int64_t>(p.per_page, 1, kMaxPerPage);
  std::string order = Param(params, "order_by");
  if (order == "desc") {
    p.descending = true;
  } else if (!order.empty() && order != "asc") {
    return absl::InvalidArgumentError(absl::StrCat(
        "order_by: \"", absl::CHexEscape(Absl(order).substr(0, 16)), "\" is not asc or desc"));
  }
  return p;
}

}  // namespace ts::bridge::devnet
