#include "chain-bridge/devnet/rpc_request.h"

#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "chain-bridge/devnet/rpc_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::bridge::devnet {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<RpcRequest> Body(std::string_view body, bool* batch) {
  auto requests = ParseRpcBody(body, batch);
  EXPECT_TRUE(requests.ok()) << body << ": " << requests.status();
  return requests.ok() ? *std::move(requests) : std::vector<RpcRequest>{};
}

// The refusal's message, or "" (a test failure) when the body parses.
std::string Refusal(std::string_view body) {
  bool batch = false;
  auto requests = ParseRpcBody(body, &batch);
  if (requests.ok()) {
    ADD_FAILURE() << "parsed: " << body;
    return "";
  }
  EXPECT_EQ(requests.status().code(), absl::StatusCode::kInvalidArgument) << body;
  return std::string(requests.status().message());
}

// A batch of `count` status requests with ids 0, 1, ...
std::string Batch(int count) {
  std::string body = "[";
  for (int i = 0; i < count; ++i) {
    if (i > 0) body += ",";
    absl::StrAppend(&body, R"({"jsonrpc":"2.0","id":)", i, R"(,"method":"status"})");
  }
  return body + "]";
}

// ---------------------------------------------------------------------------------------------
// ParseRpcBody

TEST(ParseRpcBodyTest, SingleRequest) {
  bool batch = true;
  std::vector<RpcRequest> requests =
      Body(R"({"jsonrpc":"2.0","id":1,"method":"abci_query","params":{"path":"/x","height":"5"}})",
           &batch);
  EXPECT_FALSE(batch);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].id, Json(1));
  EXPECT_EQ(requests[0].method, "abci_query");
  EXPECT_EQ(requests[0].params, Json({{"path", "/x"}, {"height", "5"}}));
}

TEST(ParseRpcBodyTest, MissingIdAndParamsTakeTheirDefaults) {
  bool batch = true;
  std::vector<RpcRequest> requests = Body(R"({"method":"health"})", &batch);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].id, Json(-1));
  EXPECT_EQ(requests[0].params, Json::object());
  requests = Body(R"({"method":"health","params":null})", &batch);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].params, Json::object());
}

TEST(ParseRpcBodyTest, BatchOfTwo) {
  bool batch = false;
  std::vector<RpcRequest> requests =
      Body(R"([{"id":"a","method":"status"},{"id":2,"method":"block","params":{"height":"3"}}])",
           &batch);
  EXPECT_TRUE(batch);
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].id, Json("a"));
  EXPECT_EQ(requests[0].method, "status");
  EXPECT_EQ(requests[1].id, Json(2));
  EXPECT_EQ(requests[1].method, "block");
  EXPECT_EQ(requests[1].params, Json({{"height", "3"}}));
}

TEST(ParseRpcBodyTest, BatchOfTheCap) {
  bool batch = false;
  std::vector<RpcRequest> requests = Body(Batch(kMaxBatch), &batch);
  EXPECT_TRUE(batch);
  ASSERT_EQ(requests.size(), kMaxBatch);
  EXPECT_EQ(requests.back().id, Json(kMaxBatch - 1));
}

TEST(ParseRpcBodyTest, RefusesABatchOverTheCap) {
  EXPECT_EQ(Refusal(Batch(kMaxBatch + 1)),
            "-32600 Invalid Request: a batch of 11 requests (1..10)");
}

TEST(ParseRpcBodyTest, RefusesAnEmptyBatch) {
  EXPECT_EQ(Refusal("[]"), "-32600 Invalid Request: a batch of 0 requests (1..10)");
}

TEST(ParseRpcBodyTest, RefusesABatchWithAnInvalidElement) {
  EXPECT_EQ(Refusal(R"([{"method":"status"},5])"), "-32600 Invalid Request: not a JSON object");
  EXPECT_EQ(Refusal(R"([{"method":"status"},{"id":1}])"), "-32600 Invalid Request: no method");
}

TEST(ParseRpcBodyTest, RefusesWhatIsNotJson) {
  EXPECT_EQ(Refusal(""), "-32700 Parse error: not JSON");
  EXPECT_EQ(Refusal("{"), "-32700 Parse error: not JSON");
  EXPECT_EQ(Refusal("method=status"), "-32700 Parse error: not JSON");
  EXPECT_EQ(Refusal(R"({"method":"status"} x)"), "-32700 Parse error: not JSON");
}

TEST(ParseRpcBodyTest, RefusesInvalidUtf8) {
  EXPECT_EQ(Refusal("{\"method\":\"stat\xff\xfeus\"}"), "-32700 Parse error: not JSON");
  EXPECT_EQ(Refusal("{\"method\":\"status\",\"params\":{\"q\":\"\xc3\"}}"),
            "-32700 Parse error: not JSON");
  EXPECT_EQ(Refusal("\xef\xbb"), "-32700 Parse error: not JSON");
}

TEST(ParseRpcBodyTest, RefusesWhatIsNotARequest) {
  EXPECT_EQ(Refusal("5"), "-32600 Invalid Request: not a JSON object");
  EXPECT_EQ(Refusal(R"("status")"), "-32600 Invalid Request: not a JSON object");
  EXPECT_EQ(Refusal("null"), "-32600 Invalid Request: not a JSON object");
}

TEST(ParseRpcBodyTest, RefusesARequestWithoutMethod) {
  EXPECT_EQ(Refusal(R"({"jsonrpc":"2.0","id":1})"), "-32600 Invalid Request: no method");
  EXPECT_EQ(Refusal(R"({"id":1,"method":5})"), "-32600 Invalid Request: no method");
  EXPECT_EQ(Refusal(R"({"id":1,"method":null})"), "-32600 Invalid Request: no method");
}

TEST(ParseRpcBodyTest, RefusesParamsThatAreNotAnObject) {
  EXPECT_EQ(Refusal(R"({"method":"block","params":["5"]})"),
            "-32600 Invalid Request: params is not an object");
  EXPECT_EQ(Refusal(R"({"method":"block","params":"5"})"),
            "-32600 Invalid Request: params is not an object");
}

TEST(ParseRpcBodyTest, IdMayBeAStringANumberOrNull) {
  bool batch = false;
  std::vector<RpcRequest> requests =
      Body(R"([{"id":"x-1","method":"a"},{"id":-7,"method":"a"},{"id":2.5,"method":"a"},)"
           R"({"id":null,"method":"a"}])",
           &batch);
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(requests[0].id, Json("x-1"));
  EXPECT_EQ(requests[1].id, Json(-7));
  EXPECT_EQ(requests[2].id, Json(2.5));
  EXPECT_TRUE(requests[3].id.is_null());
}

TEST(ParseRpcBodyTest, RefusesAnIdOfAnotherType) {
  const std::string refused = "-32600 Invalid Request: id is not a string or a number";
  EXPECT_EQ(Refusal(R"({"id":{"a":1},"method":"status"})"), refused);
  EXPECT_EQ(Refusal(R"({"id":[1],"method":"status"})"), refused);
  EXPECT_EQ(Refusal(R"({"id":true,"method":"status"})"), refused);
}

TEST(ParseRpcRequestTest, TakesAParsedObject) {
  auto request = ParseRpcRequest(
      Json{{"id", 3}, {"method", "subscribe"}, {"params", {{"query", "tm.event='Tx'"}}}});
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->id, Json(3));
  EXPECT_EQ(request->method, "subscribe");
  EXPECT_EQ(Param(request->params, "query"), "tm.event='Tx'");
  EXPECT_EQ(ParseRpcRequest(Json::array()).status().code(), absl::StatusCode::kInvalidArgument);
}

// A POST body within the server's cap whose params nest arrays as deep as the cap allows. Parsing
// it (and writing the params back out, as a reply or a log line would) must answer, not run the
// thread out of stack; the child exits 0 only if it got through.
// Copying and writing JSON recurse per nesting level: a body of 2 MiB of brackets would exhaust
// the stack, so nesting beyond kMaxJsonDepth is refused before anything is built from it.
TEST(RpcRequestTest, NestingIsBoundedBeforeItCanExhaustTheStack) {
  const std::string head = R"({"method":"status","params":{"a":)";
  const std::string tail = "}}";
  const size_t depth = (kMaxRpcRequestBytes - head.size() - tail.size()) / 2;
  const std::string body = head + std::string(depth, '[') + std::string(depth, ']') + tail;
  ASSERT_LE(body.size(), kMaxRpcRequestBytes);
  bool batch = false;
  auto deep = ParseRpcBody(body, &batch);
  ASSERT_FALSE(deep.ok());
  EXPECT_TRUE(absl::StartsWith(deep.status().message(), "-32700")) << deep.status();
  // Brackets inside strings do not count; nesting up to the cap is served.
  const size_t inner = kMaxJsonDepth - 2;
  const std::string ok = head + std::string(inner, '[') + std::string(inner, ']') + tail;
  auto served = ParseRpcBody(ok, &batch);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_FALSE(Dump(served->front().params).empty());
  auto quoted = ParseRpcBody(
      R"({"method":"status","params":{"a":")" + std::string(1000, '[') + R"("}})", &batch);
  EXPECT_TRUE(quoted.ok()) << quoted.status();
}

// ---------------------------------------------------------------------------------------------
// UriParams

TEST(UriParamsTest, DecodesPercentEscapesAndUnquotes) {
  Json params = UriParams("height=5&query=%22tm.event%3D%27Tx%27%22");
  EXPECT_EQ(params, Json({{"height", "5"}, {"query", "tm.event='Tx'"}}));
}

TEST(UriParamsTest, UnquotesOnlyAWholeQuotedValue) {
  Json params = UriParams("a=%22x&b=%22&c=%22%22&d=%22%22x%22%22");
  EXPECT_EQ(params["a"], "\"x");
  EXPECT_EQ(params["b"], "\"");
  EXPECT_EQ(params["c"], "");
  EXPECT_EQ(params["d"], "\"x\"");
}

TEST(UriParamsTest, KeepsAnIncompletePercentEscapeLiterally) {
  EXPECT_EQ(UriParams("a=%4")["a"], "%4");
  EXPECT_EQ(UriParams("a=%")["a"], "%");
  EXPECT_EQ(UriParams("a=%zz&b=%4g")["a"], "%zz");
  EXPECT_EQ(UriParams("a=%zz&b=%4g")["b"], "%4g");
  EXPECT_EQ(UriParams("a=%41%4")["a"], "A%4");
  EXPECT_EQ(UriParams("a=x%41")["a"], "xA");
}

TEST(UriParamsTest, PlusIsASpace) {
  Json params = UriParams("query=tm.event+%3D+%27Tx%27&a+b=c");
  EXPECT_EQ(params["query"], "tm.event = 'Tx'");
  EXPECT_EQ(params["a b"], "c");
  // An escaped plus stays a plus.
  EXPECT_EQ(UriParams("a=1%2B1")["a"], "1+1");
}

TEST(UriParamsTest, KeepsTheFirstParamsUpToTheCap) {
  std::string query;
  for (int i = 0; i < 20; ++i) absl::StrAppend(&query, i > 0 ? "&" : "", "p", i, "=", i);
  Json params = UriParams(query);
  ASSERT_EQ(params.size(), kMaxUriParams);
  for (size_t i = 0; i < kMaxUriParams; ++i) {
    EXPECT_EQ(params[absl::StrCat("p", i)], absl::StrCat(i)) << i;
  }
  EXPECT_FALSE(params.contains("p16"));
}

TEST(UriParamsTest, SkipsPairsWithoutEquals) {
  EXPECT_EQ(UriParams("prove&height=5&&"), Json({{"height", "5"}}));
  EXPECT_EQ(UriParams(""), Json::object());
  EXPECT_EQ(UriParams("=x"), Json({{"", "x"}}));
  EXPECT_EQ(UriParams("a="), Json({{"a", ""}}));
}

TEST(UriParamsTest, ALaterValueReplacesAnEarlierOne) {
  EXPECT_EQ(UriParams("a=1&a=2"), Json({{"a", "2"}}));
}

TEST(UriParamsTest, InvalidUtf8IsKeptAndDumpsWithoutThrowing) {
  Json params = UriParams("a=%ff%fe&%c3=1");
  EXPECT_EQ(params["a"], "\xff\xfe");
  std::string text;
  EXPECT_NO_THROW(text = Dump(params));
  EXPECT_THAT(text, HasSubstr("\"a\":\"\xef\xbf\xbd\xef\xbf\xbd\""));
}

// ---------------------------------------------------------------------------------------------
// Typed parameters

TEST(ParamTest, WritesOutWhatIsNotAString) {
  Json params = {{"s", "x"},   {"n", 5},       {"neg", -12},      {"f", 1.5},   {"t", true},
                 {"b", false}, {"z", nullptr}, {"o", {{"k", 1}}}, {"a", {1, 2}}};
  EXPECT_EQ(Param(params, "s"), "x");
  EXPECT_EQ(Param(params, "n"), "5");
  EXPECT_EQ(Param(params, "neg"), "-12");
  EXPECT_EQ(Param(params, "f"), "1.5");
  EXPECT_EQ(Param(params, "t"), "true");
  EXPECT_EQ(Param(params, "b"), "false");
  EXPECT_EQ(Param(params, "z"), "");
  EXPECT_EQ(Param(params, "absent"), "");
  EXPECT_EQ(Param(params, "o"), R"({"k":1})");
  EXPECT_EQ(Param(params, "a"), "[1,2]");
}

TEST(ParamTest, ParamsThatAreNotAnObjectHaveNoParam) {
  EXPECT_EQ(Param(Json::array({"x"}), "height"), "");
  EXPECT_EQ(Param(Json("height"), "height"), "");
  EXPECT_EQ(Param(Json(), "height"), "");
}

TEST(IntParamTest, TakesANumberOrDecimalText) {
  Json params = {{"n", 5}, {"s", "12"}, {"neg", "-3"}, {"z", nullptr}, {"e", ""}};
  EXPECT_EQ(IntParam(params, "n", 0).value(), 5);
  EXPECT_EQ(IntParam(params, "s", 0).value(), 12);
  EXPECT_EQ(IntParam(params, "neg", 0).value(), -3);
  EXPECT_EQ(IntParam(params, "z", 7).value(), 7);
  EXPECT_EQ(IntParam(params, "e", 7).value(), 7);
  EXPECT_EQ(IntParam(params, "absent", 7).value(), 7);
  EXPECT_EQ(IntParam({{"max", "9223372036854775807"}}, "max", 0).value(), INT64_MAX);
}

TEST(IntParamTest, ErrorsNameTheParameter) {
  Json params = {{"height", "abc"}, {"flag", true}, {"f", 1.5}, {"big", "9223372036854775808"}};
  auto height = IntParam(params, "height", 0);
  EXPECT_EQ(height.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(height.status().message(), "height: \"abc\" is not an integer");
  auto flag = IntParam(params, "flag", 0);
  EXPECT_EQ(flag.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(flag.status().message()), StartsWith("flag: "));
  EXPECT_THAT(std::string(IntParam(params, "f", 0).status().message()), StartsWith("f: "));
  EXPECT_THAT(std::string(IntParam(params, "big", 0).status().message()), StartsWith("big: "));
}

TEST(IntParamTest, ErrorsEscapeAndShortenTheText) {
  auto value = IntParam({{"height", std::string(100, 'x') + "\n"}}, "height", 0);
  EXPECT_EQ(value.status().message(),
            absl::StrCat("height: \"", std::string(40, 'x'), "\" is not an integer"));
  value = IntParam({{"height", "1\nx"}}, "height", 0);
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().message(), "height: \"1\\nx\" is not an integer");
}

TEST(IntParamTest, SpaceAroundTheDigitsIsIgnored) {
  EXPECT_EQ(IntParam({{"height", " 5\n"}}, "height", 0).value(), 5);
}

TEST(Base64ParamTest, DecodesBase64) {
  Json params = {{"tx", "aGVsbG8="}, {"empty", ""}};
  EXPECT_EQ(Base64Param(params, "tx").value(), "hello");
  EXPECT_EQ(Base64Param(params, "empty").value(), "");
  EXPECT_EQ(Base64Param(params, "absent").value(), "");
}

TEST(Base64ParamTest, RefusesWhatIsNotBase64) {
  for (const char* text : {"!!!!", "aGVsbG8=x", "a", "aGVs\x01-bG8=", "aGVs-bG8="}) {
    auto bytes = Base64Param({{"tx", text}}, "tx");
    ASSERT_FALSE(bytes.ok()) << text;
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(bytes.status().message(), "tx: not base64");
  }
}

TEST(PageParamsTest, Defaults) {
  auto page = PageParams(Json::object());
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->page, 1);
  EXPECT_EQ(page->per_page, kDefaultPerPage);
  EXPECT_FALSE(page->descending);
}

TEST(PageParamsTest, PerPageIsClamped) {
  EXPECT_EQ(PageParams({{"per_page", "0"}}).value().per_page, 1);
  EXPECT_EQ(PageParams({{"per_page", "-5"}}).value().per_page, 1);
  EXPECT_EQ(PageParams({{"per_page", "1"}}).value().per_page, 1);
  EXPECT_EQ(PageParams({{"per_page", 100}}).value().per_page, 100);
  EXPECT_EQ(PageParams({{"per_page", "101"}}).value().per_page, kMaxPerPage);
  EXPECT_EQ(PageParams({{"per_page", "9223372036854775807"}}).value().per_page, kMaxPerPage);
}

TEST(PageParamsTest, PageFromOne) {
  EXPECT_EQ(PageParams({{"page", "3"}}).value().page, 3);
  auto zero = PageParams({{"page", "0"}});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(zero.status().message(), "page: 0 < 1");
  EXPECT_EQ(PageParams({{"page", -1}}).status().message(), "page: -1 < 1");
  EXPECT_THAT(std::string(PageParams({{"page", "x"}}).status().message()), StartsWith("page: "));
  EXPECT_THAT(std::string(PageParams({{"per_page", "x"}}).status().message()),
              StartsWith("per_page: "));
}

TEST(PageParamsTest, AHugePageStaysSkippable) {
  auto page = PageParams({{"page", "9223372036854775807"}, {"per_page", "100"}});
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->page, INT64_MAX / kMaxPerPage);
  // (page - 1) * per_page does not overflow.
  EXPECT_LE(page->page - 1, INT64_MAX / page->per_page);
}

TEST(PageParamsTest, OrderBy) {
  EXPECT_TRUE(PageParams({{"order_by", "desc"}}).value().descending);
  EXPECT_FALSE(PageParams({{"order_by", "asc"}}).value().descending);
  EXPECT_FALSE(PageParams({{"order_by", ""}}).value().descending);
  auto other = PageParams({{"order_by", "DESC"}});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other.status().message(), "order_by: \"DESC\" is not asc or desc");
}

// ---------------------------------------------------------------------------------------------
// Dump

TEST(DumpTest, CompactJson) {
  EXPECT_EQ(Dump(Json{{"b", 1}, {"a", {true, nullptr, "x"}}}), R"({"a":[true,null,"x"],"b":1})");
}

TEST(DumpTest, ReplacesInvalidUtf8InsteadOfThrowing) {
  std::string text;
  EXPECT_NO_THROW(text = Dump(Json("ok\xff.")));
  EXPECT_EQ(text, "\"ok\xef\xbf\xbd.\"");
  EXPECT_NO_THROW(text = Dump(Json{{"k\xc3", "\xe2\x82"}}));
  EXPECT_NO_THROW(text = Dump(Json::array({"\x80", 1})));
  // Valid multibyte text is written as it is.
  EXPECT_EQ(Dump(Json("\xc3\xa9")), "\"\xc3\xa9\"");
}

}  // namespace
}  // namespace ts::bridge::devnet
