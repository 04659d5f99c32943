#include "chain-bridge/devnet/rpc_server.h"

#include <civetweb.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/client_unary_call.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/devnet/event_query.h"
#include "chain-bridge/devnet/rpc_json.h"
#include "chain-bridge/devnet/rpc_request.h"
#include "chain-bridge/devnet/store.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/status.h"
#include "cosmos/tx/v1beta1/service.pb.h"
#include "proto/cosmos_tx_service.h"

namespace ts::bridge::devnet {
namespace {

using TxResponse = cosmos::base::abci::v1beta1::TxResponse;

constexpr std::string_view kComponent = "rpc";
// A tx_search or block_search without an indexed equality looks at this many txs or blocks.
constexpr size_t kMaxScan = 100000;
constexpr size_t kMaxAbciPathBytes = 256;

absl::string_view Absl(std::string_view s) { return {s.data(), s.size()}; }

// JSON-RPC errors (codes of the JSON-RPC 2.0 spec, as CometBFT answers them).
struct RpcError {
  int code;
  std::string message;
  std::string data;
};
RpcError InvalidParams(std::string data) { return {-32602, "Invalid params", std::move(data)}; }
RpcError Internal(std::string data) { return {-32603, "Internal error", std::move(data)}; }
RpcError FromStatus(const absl::Status& status) {
  if (absl::IsInvalidArgument(status)) return InvalidParams(status.ToString());
  return Internal(status.ToString());
}

using Result = std::variant<Json, RpcError>;

Json Reply(const Json& id, const Result& result) {
  Json out = {{"jsonrpc", "2.0"}, {"id", id}};
  if (const Json* ok = std::get_if<Json>(&result)) {
    out["result"] = *ok;
  } else {
    const RpcError& e = std::get<RpcError>(result);
    out["error"] = {{"code", e.code}, {"message", e.message}, {"data", e.data}};
  }
  return out;
}

// The status an abci_query reports for a gRPC error, as the SDK converts one.
Json QueryError(const grpc::Status& status, int64_t height) {
  static const char* kNames[] = {
      "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
      "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
      "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
      "DataLoss", "Unauthenticated"};
  int code = static_cast<int>(status.error_code());
  std::string log;
  TxCode tx_code;
  if (!ParseRefusalMessage(status.error_message(), &log, &tx_code)) {
    const char* name = code >= 0 && code <= 16 ? kNames[code] : "Unknown";
    log = absl::StrCat("rpc error: code = ", name, " desc = ", status.error_message());
    switch (status.error_code()) {
      case grpc::StatusCode::NOT_FOUND:
        tx_code = {"sdk", 22};  // ErrKeyNotFound
        break;
      case grpc::StatusCode::UNAUTHENTICATED:
        tx_code = {"sdk", 4};
        break;
      case grpc::StatusCode::UNIMPLEMENTED:
        tx_code = {"sdk", 6};  // ErrUnknownRequest
        break;
      default:
        tx_code = {"sdk", 18};  // ErrInvalidRequest
    }
  }
  return Json{{"response",
               {{"code", tx_code.code},
                {"log", log},
                {"info", ""},
                {"index", "0"},
                {"key", nullptr},
                {"value", nullptr},
                {"proofOps", nullptr},
                {"height", absl::StrCat(height)},
                {"codespace", tx_code.codespace}}}};
}

// One WebSocket client and its subscriptions.
struct WsClient {
  struct Subscription {
    Json id;
    std::string text;
    EventQuery query;
  };
  mg_connection* connection = nullptr;
  std::vector<Subscription> subscriptions;
};

}  // namespace

struct RpcServer::Impl {
  Backend* backend = nullptr;
  RpcServerOptions options;
  mg_context* server = nullptr;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  rpc_json::Validator validator;
  std::string chain_id;

  // --- the event index: "type.key=value" -> the txs (or blocks) whose events carry it.
  struct TxRef {
    int64_t height;
    int index;
    bool operator==(const TxRef&) const = default;
  };
  absl::Mutex index_mu;
  absl::flat_hash_map<std::string, std::vector<TxRef>> tx_index ABSL_GUARDED_BY(index_mu);
  absl::flat_hash_map<std::string, std::vector<int64_t>> block_index ABSL_GUARDED_BY(index_mu);
  std::vector<TxRef> all_txs ABSL_GUARDED_BY(index_mu);
  int64_t indexed_height ABSL_GUARDED_BY(index_mu) = 0;

  // --- WebSocket clients and the blocks waiting to be sent to them.
  absl::Mutex ws_mu;
  std::map<const mg_connection*, WsClient> clients ABSL_GUARDED_BY(ws_mu);
  absl::Mutex queue_mu;
  std::deque<std::shared_ptr<const pb::StoredBlock>> queue ABSL_GUARDED_BY(queue_mu);
  bool stopping ABSL_GUARDED_BY(queue_mu) = false;
  std::thread publisher;

  void Index(const pb::StoredBlock& block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(index_mu);
  void PublishLoop();
  void SendEvents(const pb::StoredBlock& block);

  Json Dispatch(const RpcRequest& request);
  Result Call(const std::string& method, const Json& params);
  Result Status();
  Result AbciInfo();
  Result AbciQuery(const Json& params);
  Result BroadcastTx(const Json& params, cosmos::tx::v1beta1::BroadcastMode mode);
  Result Tx(const Json& params);
  Result TxSearch(const Json& params);
  Result BlockSearch(const Json& params);
  Result BlockAt(const Json& params, bool results);
  Result Blockchain(const Json& params);
  Result Validators(const Json& params);

  absl::StatusOr<int64_t> LatestHeight();
  absl::StatusOr<int64_t> HeightParam(const Json& params);

  static int HandleHttp(mg_connection* connection, void* data);
  static int WsConnect(const mg_connection* connection, void* data);
  static void WsReady(mg_connection* connection, void* data);
  static int WsData(mg_connection* connection, int bits, char* payload, size_t size, void* data);
  static void WsClose(const mg_connection* connection, void* data);
  void WsWrite(mg_connection* connection, const Json& message);
};

// ---------------------------------------------------------------------------------------------
// Index

void RpcServer::Impl::Index(const pb::StoredBlock& block) {
  const int64_t height = block.block().header().height();
  if (height <= indexed_height) return;
  for (int i = 0; i < block.results().tx_results_size(); ++i) {
    TxRef ref{height, i};
    all_txs.push_back(ref);
    for (const auto& event : block.results().tx_results(i).events()) {
      for (const auto& a : event.attributes()) {
        std::vector<TxRef>& refs =
            tx_index[absl::StrCat(event.type(), ".", a.key(), "=", a.value())];
        if (refs.empty() || !(refs.back() == ref)) refs.push_back(ref);
      }
    }
  }
  for (const auto& event : block.results().end_block_events()) {
    for (const auto& a : event.attributes()) {
      std::vector<int64_t>& heights =
          block_index[absl::StrCat(event.type(), ".", a.key(), "=", a.value())];
      if (heights.empty() || heights.back() != height) heights.push_back(height);
    }
  }
  indexed_height = height;
}

// ---------------------------------------------------------------------------------------------
// Methods

absl::StatusOr<int64_t> RpcServer::Impl::LatestHeight() {
  int64_t height = 0;
  TS_RETURN_IF_ERROR(backend->WithApp([&](const App& app) { height = app.height(); }));
  return height;
}

absl::StatusOr<int64_t> RpcServer::Impl::HeightParam(const Json& params) {
  TS_ASSIGN_OR_RETURN(int64_t latest, LatestHeight());
  TS_ASSIGN_OR_RETURN(int64_t height, IntParam(params, "height", 0));
  if (height == 0) height = latest;
  if (height < 1 || height > latest) {
    return absl::InvalidArgumentError(
        absl::StrCat("height ", height,
                     " must be less than or equal to the current blockchain height ", latest));
  }
  return height;
}

Result RpcServer::Impl::Status() {
  auto latest = LatestHeight();
  if (!latest.ok()) return FromStatus(latest.status());
  // Before block 1 there is no block hash (as CometBFT); the app hash is the genesis's zeros.
  Json sync = {{"latest_block_hash", ""},
               {"latest_app_hash", rpc_json::Hex(std::string(common::kSha256Size, '\0'))},
               {"latest_block_height", absl::StrCat(*latest)},
               {"latest_block_time", "1970-01-01T00:00:00.000000000Z"},
               {"earliest_block_hash", ""},
               {"earliest_app_hash", ""},
               {"earliest_block_height", *latest > 0 ? "1" : "0"},
               {"earliest_block_time", "1970-01-01T00:00:00.000000000Z"},
               {"catching_up", false}};
  if (*latest > 0) {
    auto last = backend->Block(*latest);
    auto first = backend->Block(1);
    if (!last.ok()) return FromStatus(last.status());
    if (!first.ok()) return FromStatus(first.status());
    sync["latest_block_hash"] = rpc_json::Hex(HeaderHash((*last)->block().header()));
    sync["latest_app_hash"] = rpc_json::Hex((*last)->results().app_hash());
    sync["latest_block_time"] = rpc_json::Rfc3339Nano((*last)->block().header().time());
    sync["earliest_block_hash"] = rpc_json::Hex(HeaderHash((*first)->block().header()));
    sync["earliest_app_hash"] = rpc_json::Hex((*first)->block().header().app_hash());
    sync["earliest_block_time"] = rpc_json::Rfc3339Nano((*first)->block().header().time());
  }
  Json node_info = {
      {"protocol_version",
       {{"p2p", absl::StrCat(rpc_json::kCometP2pVersion)},
        {"block", absl::StrCat(rpc_json::kCometBlockVersion)},
        {"app", "0"}}},
      {"id", rpc_json::NodeId(chain_id)},
      {"listen_addr", absl::StrCat("tcp://", address)},
      {"network", chain_id},
      {"version", rpc_json::kCometVersion},
      {"channels", "40202122233038606100"},
      {"moniker", rpc_json::kMoniker},
      {"other", {{"tx_index", "on"}, {"rpc_address", absl::StrCat("tcp://", address)}}}};
  Json validator_info = {
      {"address", rpc_json::Hex(validator.address)},
      {"pub_key",
       {{"type", "tendermint/PubKeyEd25519"}, {"value", rpc_json::Base64(validator.public_key)}}},
      {"voting_power", "1"}};
  return Json{{"node_info", node_info}, {"sync_info", sync}, {"validator_info", validator_info}};
}

Result RpcServer::Impl::AbciInfo() {
  int64_t height = 0;
  std::string app_hash;
  absl::Status status = backend->WithApp([&](const App& app) {
    height = app.height();
    app_hash = app.app_hash();
  });
  if (!status.ok()) return FromStatus(status);
  return Json{{"response",
               {{"data", "trainshard"},
                {"version", rpc_json::kAppVersion},
                {"app_version", "1"},
                {"last_block_height", absl::StrCat(height)},
                {"last_block_app_hash", rpc_json::Base64(app_hash)}}}};
}

Result RpcServer::Impl::AbciQuery(const Json& params) {
  std::string path = Param(params, "path");
  if (path.empty() || path[0] != '/' || path.size() > kMaxAbciPathBytes) {
    return InvalidParams(absl::StrCat("path: \"", Absl(path).substr(0, 64),
                                      "\" is not a gRPC method path such as "
                                      "/cosmos.bank.v1beta1.Query/Balance"));
  }
  // Only queries (and Simulate): a tx enters through broadcast_tx_*.
  if (path == cosmos::tx::v1beta1::kBroadcastTxPath) {
    return InvalidParams("path: broadcast through broadcast_tx_sync, not abci_query");
  }
  std::string hex = Param(params, "data");
  if (hex.starts_with("0x")) hex.erase(0, 2);
  auto data = common::HexDecode(hex);
  if (!data.ok()) return InvalidParams("data: not hex");
  auto latest = LatestHeight();
  if (!latest.ok()) return FromStatus(latest.status());
  auto height = IntParam(params, "height", 0);
  if (!height.ok()) return FromStatus(height.status());
  if (*height != 0 && *height != *latest) {
    return InvalidParams(absl::StrCat("height: ", *height, ": only the latest height (", *latest,
                                      ") is served; the devnet keeps no historical state"));
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(kRpcRequestTimeoutMs));
  grpc::internal::RpcMethod method(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, channel);
  grpc::Slice slice(*data);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel.get(), method, &context, request, &response);
  if (!status.ok()) return QueryError(status, *latest);
  std::vector<grpc::Slice> slices;
  std::string value;
  if (response.Dump(&slices).ok()) {
    for (const auto& s : slices) value.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return Json{{"response",
               {{"code", 0},
                {"log", ""},
                {"info", ""},
                {"index", "0"},
                {"key", nullptr},
                {"value", rpc_json::Base64(value)},
                {"proofOps", nullptr},
                {"height", absl::StrCat(*latest)},
                {"codespace", ""}}}};
}

Result RpcServer::Impl::BroadcastTx(const Json& params, cosmos::tx::v1beta1::BroadcastMode mode) {
  auto tx = Base64Param(params, "tx");
  if (!tx.ok()) return FromStatus(tx.status());
  if (tx->empty()) return InvalidParams("tx: empty");
  const bool commit = mode == cosmos::tx::v1beta1::BROADCAST_MODE_BLOCK;
  const std::string hash = rpc_json::Hex(common::Sha256(*tx));
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::milliseconds(commit ? options.commit_timeout_ms : 10000);
  auto response = backend->Broadcast(*tx, mode, deadline);
  if (!response.ok()) return FromStatus(response.status());
  if (!commit) {
    return Json{{"code", response->code()},
                {"data", ""},
                {"log", response->raw_log()},
                {"codespace", response->codespace()},
                {"hash", hash}};
  }
  // BLOCK mode answers the delivered result, or the CheckTx refusal (height 0).
  const bool delivered = response->height() > 0;
  TxResponse accepted;
  Json check = rpc_json::TxResult(delivered ? accepted : *response);
  check.erase("events");
  check["events"] = Json::array();
  return Json{{"check_tx", check},
              {"tx_result", rpc_json::TxResult(delivered ? *response : accepted)},
              {"hash", hash},
              {"height", absl::StrCat(response->height())}};
}

Result RpcServer::Impl::Tx(const Json& params) {
  auto hash = Base64Param(params, "hash");
  if (!hash.ok()) return FromStatus(hash.status());
  if (hash->size() != common::kSha256Size) {
    return InvalidParams(absl::StrCat("hash: ", hash->size(), " bytes, want 32"));
  }
  auto found = backend->FindTx(*hash);
  if (!found.ok()) {
    if (absl::IsNotFound(found.status())) {
      return Internal(absl::StrCat("tx (", rpc_json::Hex(*hash), ") not found"));
    }
    return FromStatus(found.status());
  }
  return rpc_json::TxRecord(*found->first, static_cast<int>(found->second));
}

Result RpcServer::Impl::TxSearch(const Json& params) {
  auto query = ParseEventQuery(Param(params, "query"));
  if (!query.ok()) return FromStatus(query.status());
  auto page = PageParams(params);
  if (!page.ok()) return FromStatus(page.status());
  // Candidates: the txs an indexed condition names, else the one tx.hash names, else all.
  std::vector<TxRef> candidates;
  const QueryCondition* indexed = IndexableCondition(*query);
  std::optional<std::string> hash_condition;
  for (const auto& c : query->conditions) {
    if (c.key == "tx.hash" && c.op == QueryCondition::Op::kEq) hash_condition = c.text;
  }
  if (hash_condition.has_value()) {
    auto hash = common::HexDecode(*hash_condition);
    if (hash.ok() && hash->size() == common::kSha256Size) {
      auto found = backend->FindTx(*hash);
      if (found.ok()) {
        candidates.push_back(
            {found->first->block().header().height(), static_cast<int>(found->second)});
      }
    }
  } else {
    absl::MutexLock lock(&index_mu);
    if (indexed != nullptr) {
      auto it = tx_index.find(absl::StrCat(indexed->key, "=", indexed->text));
      if (it != tx_index.end()) candidates = it->second;
    } else {
      if (all_txs.size() > kMaxScan) {
        return InvalidParams(absl::StrCat("query: matches more than ", kMaxScan,
                                          " txs to scan; name an attribute with '='"));
      }
      candidates = all_txs;
    }
  }
  if (page->descending) std::reverse(candidates.begin(), candidates.end());
  Json txs = Json::array();
  int64_t total = 0;
  const int64_t skip = (page->page - 1) * page->per_page;
  std::shared_ptr<const pb::StoredBlock> block;
  for (const TxRef& ref : candidates) {
    if (block == nullptr || block->block().header().height() != ref.height) {
      auto loaded = backend->Block(ref.height);
      if (!loaded.ok()) return FromStatus(loaded.status());
      block = *loaded;
    }
    if (ref.index >= block->results().tx_results_size()) continue;
    std::string tx_hash = rpc_json::Hex(common::Sha256(block->block().data().txs(ref.index)));
    EventSubject subject{"Tx", ref.height, tx_hash,
                         &block->results().tx_results(ref.index).events(), nullptr};
    if (!Matches(*query, subject)) continue;
    if (total >= skip && total < skip + page->per_page) {
      txs.push_back(rpc_json::TxRecord(*block, ref.index));
    }
    ++total;
  }
  return Json{{"txs", txs}, {"total_count", absl::StrCat(total)}};
}

Result RpcServer::Impl::BlockSearch(const Json& params) {
  auto query = ParseEventQuery(Param(params, "query"));
  if (!query.ok()) return FromStatus(query.status());
  auto page = PageParams(params);
  if (!page.ok()) return FromStatus(page.status());
  auto latest = LatestHeight();
  if (!latest.ok()) return FromStatus(latest.status());
  std::vector<int64_t> candidates;
  const QueryCondition* indexed = IndexableCondition(*query);
  {
    absl::MutexLock lock(&index_mu);
    if (indexed != nullptr) {
      auto it = block_index.find(absl::StrCat(indexed->key, "=", indexed->text));
      if (it != block_index.end()) candidates = it->second;
    } else {
      int64_t first = std::max<int64_t>(1, *latest - static_cast<int64_t>(kMaxScan) + 1);
      for (int64_t h = first; h <= *latest; ++h) candidates.push_back(h);
    }
  }
  if (page->descending) std::reverse(candidates.begin(), candidates.end());
  Json blocks = Json::array();
  int64_t total = 0;
  const int64_t skip = (page->page - 1) * page->per_page;
  for (int64_t height : candidates) {
    // Reserved-key-only queries need no block: test them on an empty event list first.
    auto loaded = backend->Block(height);
    if (!loaded.ok()) return FromStatus(loaded.status());
    EventSubject subject{"NewBlock", height, "", &(*loaded)->results().end_block_events(), nullptr};
    if (!Matches(*query, subject)) continue;
    if (total >= skip && total < skip + page->per_page) {
      blocks.push_back(rpc_json::Block(**loaded, validator.address));
    }
    ++total;
  }
  return Json{{"blocks", blocks}, {"total_count", absl::StrCat(total)}};
}

Result RpcServer::Impl::BlockAt(const Json& params, bool results) {
  auto height = HeightParam(params);
  if (!height.ok()) return FromStatus(height.status());
  auto block = backend->Block(*height);
  if (!block.ok()) return FromStatus(block.status());
  if (results) return rpc_json::BlockResults(**block);
  return rpc_json::Block(**block, validator.address);
}

Result RpcServer::Impl::Blockchain(const Json& params) {
  auto latest = LatestHeight();
  if (!latest.ok()) return FromStatus(latest.status());
  auto max = IntParam(params, "maxHeight", *latest);
  auto min = IntParam(params, "minHeight", 1);
  if (!max.ok()) return FromStatus(max.status());
  if (!min.ok()) return FromStatus(min.status());
  int64_t high = std::min(*max == 0 ? *latest : *max, *latest);
  int64_t low = std::max<int64_t>({*min, 1, high - kMaxBlockchainRange + 1});
  if (low > high && *latest > 0) {
    return InvalidParams(
        absl::StrCat("min height ", *min, " can't be greater than max height ", high));
  }
  Json metas = Json::array();
  for (int64_t h = high; h >= low; --h) {
    auto block = backend->Block(h);
    if (!block.ok()) return FromStatus(block.status());
    const auto& header = (*block)->block().header();
    metas.push_back({{"block_id", rpc_json::BlockId(header)},
                     {"block_size", absl::StrCat((*block)->block().ByteSizeLong())},
                     {"header", rpc_json::Header(header, validator.address)},
                     {"num_txs", absl::StrCat((*block)->block().data().txs_size())}});
  }
  return Json{{"last_height", absl::StrCat(*latest)}, {"block_metas", metas}};
}

Result RpcServer::Impl::Validators(const Json& params) {
  auto height = HeightParam(params);
  if (!height.ok()) return FromStatus(height.status());
  Json one = {
      {"address", rpc_json::Hex(validator.address)},
      {"pub_key",
       {{"type", "tendermint/PubKeyEd25519"}, {"value", rpc_json::Base64(validator.public_key)}}},
      {"voting_power", "1"},
      {"proposer_priority", "0"}};
  return Json{{"block_height", absl::StrCat(*height)},
              {"validators", Json::array({one})},
              {"count", "1"},
              {"total", "1"}};
}

Result RpcServer::Impl::Call(const std::string& method, const Json& params) {
  if (method == "health") return Json::object();
  if (method == "status") return Status();
  if (method == "abci_info") return AbciInfo();
  if (method == "abci_query") return AbciQuery(params);
  if (method == "broadcast_tx_sync") {
    return BroadcastTx(params, cosmos::tx::v1beta1::BROADCAST_MODE_SYNC);
  }
  if (method == "broadcast_tx_async") {
    return BroadcastTx(params, cosmos::tx::v1beta1::BROADCAST_MODE_ASYNC);
  }
  if (method == "broadcast_tx_commit") {
    return BroadcastTx(params, cosmos::tx::v1beta1::BROADCAST_MODE_BLOCK);
  }
  if (method == "tx") return Tx(params);
  if (method == "tx_search") return TxSearch(params);
  if (method == "block_search") return BlockSearch(params);
  if (method == "block") return BlockAt(params, /*results=*/false);
  if (method == "block_results") return BlockAt(params, /*results=*/true);
  if (method == "blockchain") return Blockchain(params);
  if (method == "validators") return Validators(params);
  return RpcError{-32601, "Method not found", absl::StrCat(Absl(method).substr(0, 64))};
}

Json RpcServer::Impl::Dispatch(const RpcRequest& request) {
  try {
    return Reply(request.id, Call(request.method, request.params));
  } catch (const std::exception& e) {
    return Reply(request.id, Internal(e.what()));
  }
}

namespace {

// A parse error from rpc_request.h: its JSON-RPC code is the message's first word.
RpcError RequestError(const absl::Status& status) {
  std::string message(status.message());
  int code = -32600;
  size_t space = message.find(' ');
  if (space != std::string::npos && absl::SimpleAtoi(message.substr(0, space), &code)) {
    message.erase(0, space + 1);
  }
  return RpcError{code, code == -32700 ? "Parse error" : "Invalid Request", message};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// HTTP

namespace {

void RespondJson(mg_connection* connection, int code, const std::string& body) {
  std::string header =
      absl::StrCat("HTTP/1.1 ", code, code == 200 ? " OK" : " Error",
                   "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n\r\n");
  mg_write(connection, header.data(), header.size());
  mg_write(connection, body.data(), body.size());
}

}  // namespace

int RpcServer::Impl::HandleHttp(mg_connection* connection, void* data) {
  auto* impl = static_cast<Impl*>(data);
  const mg_request_info* info = mg_get_request_info(connection);
  std::string_view method = info->request_method;
  std::string_view uri = info->local_uri != nullptr ? info->local_uri : "/";
  if (method == "GET") {
    if (uri == "/") {
      RespondJson(connection, 200,
                  Dump(Json{{"methods",
                             {"health", "status", "abci_info", "abci_query", "broadcast_tx_sync",
                              "broadcast_tx_async", "broadcast_tx_commit", "tx", "tx_search",
                              "block", "block_search", "block_results", "blockchain", "validators",
                              "subscribe", "unsubscribe", "unsubscribe_all"}}}));
      return 200;
    }
    RpcRequest request;
    request.method = std::string(uri.substr(1));
    request.params = UriParams(info->query_string != nullptr ? info->query_string : "");
    RespondJson(connection, 200, Dump(impl->Dispatch(request)));
    return 200;
  }
  if (method != "POST") {
    RespondJson(connection, 405,
                Dump(Reply(-1, RpcError{-32600, "Invalid Request", "GET or POST only"})));
    return 405;
  }
  if (info->content_length < 0 ||
      info->content_length > static_cast<long long>(kMaxRpcRequestBytes)) {
    RespondJson(connection, 413,
                Dump(Reply(-1, RpcError{-32600, "Invalid Request",
                                        absl::StrCat("body: need a Content-Length of at most ",
                                                     kMaxRpcRequestBytes, " bytes")})));
    return 413;
  }
  std::string body(static_cast<size_t>(info->content_length), '\0');
  size_t got = 0;
  while (got < body.size()) {
    int n = mg_read(connection, body.data() + got, body.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  body.resize(got);
  bool batch = false;
  auto requests = ParseRpcBody(body, &batch);
  if (!requests.ok()) {
    RespondJson(connection, 200, Dump(Reply(-1, RequestError(requests.status()))));
    return 200;
  }
  if (!batch) {
    RespondJson(connection, 200, Dump(impl->Dispatch(requests->front())));
    return 200;
  }
  Json replies = Json::array();
  for (const auto& one : *requests) replies.push_back(impl->Dispatch(one));
  RespondJson(connection, 200, Dump(replies));
  return 200;
}

// ---------------------------------------------------------------------------------------------
// WebSocket

int RpcServer::Impl::WsConnect(const mg_connection* connection, void* data) {
  auto* impl = static_cast<Impl*>(data);
  absl::MutexLock lock(&impl->ws_mu);
  if (impl->clients.size() >= static_cast<size_t>(kMaxWebsocketClients)) return 1;  // refused
  impl->clients[connection].connection = nullptr;
  return 0;
}

void RpcServer::Impl::WsReady(mg_connection* connection, void* data) {
  auto* impl = static_cast<Impl*>(data);
  absl::MutexLock lock(&impl->ws_mu);
  impl->clients[connection].connection = connection;
}

void RpcServer::Impl::WsClose(const mg_connection* connection, void* data) {
  auto* impl = static_cast<Impl*>(data);
  absl::MutexLock lock(&impl->ws_mu);
  impl->clients.erase(connection);
}

void RpcServer::Impl::WsWrite(mg_connection* connection, const Json& message) {
  std::string text = Dump(message);
  mg_websocket_write(connection, MG_WEBSOCKET_OPCODE_TEXT, text.data(), text.size());
}

int RpcServer::Impl::WsData(mg_connection* connection, int bits, char* payload, size_t size,
                            void* data) {
  auto* impl = static_cast<Impl*>(data);
  const int opcode = bits & 0x0f;
  if (opcode == MG_WEBSOCKET_OPCODE_CONNECTION_CLOSE) return 0;
  if (opcode != MG_WEBSOCKET_OPCODE_TEXT) return 1;  // pings are answered by civetweb
  if (size > kMaxRpcRequestBytes) return 0;          // closes the connection
  Json parsed = ParseBoundedJson(std::string_view(payload, size));
  auto request =
      parsed.is_discarded()
          ? absl::StatusOr<RpcRequest>(absl::InvalidArgumentError("-32700 Parse error: not JSON"))
          : ParseRpcRequest(parsed);
  if (!request.ok()) {
    absl::MutexLock lock(&impl->ws_mu);
    impl->WsWrite(connection, Reply(-1, RequestError(request.status())));
    return 1;
  }
  const Json& id = request->id;
  const std::string& method = request->method;
  const Json& params = request->params;
  if (method == "subscribe" || method == "unsubscribe" || method == "unsubscribe_all") {
    Result result = Json::object();
    {
      absl::MutexLock lock(&impl->ws_mu);
      WsClient& client = impl->clients[connection];
      std::string text = Param(params, "query");
      if (method == "unsubscribe_all") {
        client.subscriptions.clear();
      } else if (method == "unsubscribe") {
        auto before = client.subscriptions.size();
        std::erase_if(client.subscriptions, [&](const auto& s) { return s.text == text; });
        if (client.subscriptions.size() == before) result = Internal("subscription not found");
      } else if (client.subscriptions.size() >= static_cast<size_t>(kMaxSubscriptionsPerClient)) {
        result = Internal(
            absl::StrCat("max_subscriptions_per_client ", kMaxSubscriptionsPerClient, " reached"));
      } else if (std::any_of(client.subscriptions.begin(), client.subscriptions.end(),
                             [&](const auto& s) { return s.text == text; })) {
        result = Internal("already subscribed");
      } else {
        auto query = ParseEventQuery(text);
        if (query.ok()) {
          client.subscriptions.push_back({id, text, *std::move(query)});
        } else {
          result = FromStatus(query.status());
        }
      }
      impl->WsWrite(connection, Reply(id, result));
    }
    return 1;
  }
  Json reply = impl->Dispatch(*request);
  absl::MutexLock lock(&impl->ws_mu);
  impl->WsWrite(connection, reply);
  return 1;
}

void RpcServer::Impl::SendEvents(const pb::StoredBlock& block) {
  const auto& header = block.block().header();
  const int64_t height = header.height();
  const int tx_count = block.results().tx_results_size();
  // What every subscriber of this block is sent, built once, at the first subscription that
  // matches: the NewBlock value, and each tx's hash, events and value.
  std::optional<Json> new_block;
  std::vector<std::string> tx_hashes(static_cast<size_t>(tx_count));
  for (int i = 0; i < tx_count; ++i) {
    tx_hashes[static_cast<size_t>(i)] = rpc_json::Hex(common::Sha256(block.block().data().txs(i)));
  }
  std::vector<std::optional<std::pair<Json, Json>>> tx_payloads(static_cast<size_t>(tx_count));
  auto new_block_value = [&]() -> const Json& {
    if (!new_block.has_value()) {
      Json value = rpc_json::Block(block, validator.address);
      value["result_finalize_block"] = {
          {"events", rpc_json::Events(block.results().end_block_events())},
          {"tx_results", rpc_json::BlockResults(block)["txs_results"]},
          {"validator_updates", Json::array()},
          {"app_hash", rpc_json::Base64(block.results().app_hash())}};
      new_block = std::move(value);
    }
    return *new_block;
  };
  auto tx_payload = [&](int i) -> const std::pair<Json, Json>& {
    auto& payload = tx_payloads[static_cast<size_t>(i)];
    if (!payload.has_value()) {
      const auto& result = block.results().tx_results(i);
      const std::string& hash = tx_hashes[static_cast<size_t>(i)];
      Json events = {
          {"tm.event", {"Tx"}}, {"tx.hash", {hash}}, {"tx.height", {absl::StrCat(height)}}};
      for (const auto& event : result.events()) {
        for (const auto& a : event.attributes()) {
          events[absl::StrCat(event.type(), ".", a.key())].push_back(a.value());
        }
      }
      Json value = {{"TxResult",
                     {{"height", absl::StrCat(height)},
                      {"index", i},
                      {"tx", rpc_json::Base64(block.block().data().txs(i))},
                      {"result", rpc_json::TxResult(result)}}}};
      payload.emplace(std::move(events), std::move(value));
    }
    return *payload;
  };
  const Json new_block_events = {{"tm.event", {"NewBlock"}},
                                 {"block.height", {absl::StrCat(height)}}};
  absl::MutexLock lock(&ws_mu);
  for (auto& [key, client] : clients) {
    if (client.connection == nullptr) continue;
    for (const auto& sub : client.subscriptions) {
      EventSubject block_subject{"NewBlock", height, "", &block.results().end_block_events(),
                                 nullptr};
      if (Matches(sub.query, block_subject)) {
        WsWrite(client.connection,
                Reply(sub.id,
                      Json{{"query", sub.text},
                           {"data",
                            {{"type", "tendermint/event/NewBlock"}, {"value", new_block_value()}}},
                           {"events", new_block_events}}));
      }
      for (int i = 0; i < tx_count; ++i) {
        EventSubject tx_subject{"Tx", height, tx_hashes[static_cast<size_t>(i)],
                                &block.results().tx_results(i).events(), nullptr};
        if (!Matches(sub.query, tx_subject)) continue;
        const auto& [events, value] = tx_payload(i);
        WsWrite(client.connection,
                Reply(sub.id, Json{{"query", sub.text},
                                   {"data", {{"type", "tendermint/event/Tx"}, {"value", value}}},
                                   {"events", events}}));
      }
    }
  }
}

void RpcServer::Impl::PublishLoop() {
  for (;;) {
    std::shared_ptr<const pb::StoredBlock> block;
    {
      absl::MutexLock lock(&queue_mu);
      queue_mu.Await(absl::Condition(
          +[](Impl* impl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->queue_mu) {
            return impl->stopping || !impl->queue.empty();
          },
          this));
      if (stopping) return;
      block = std::move(queue.front());
      queue.pop_front();
    }
    SendEvents(*block);
  }
}

// ---------------------------------------------------------------------------------------------

RpcServer::RpcServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RpcServer::~RpcServer() {
  {
    absl::MutexLock lock(&impl_->queue_mu);
    impl_->stopping = true;
  }
  if (impl_->publisher.joinable()) impl_->publisher.join();
  if (impl_->server != nullptr) mg_stop(impl_->server);
}

std::string RpcServer::listen_address() const { return impl_->address; }

void RpcServer::Publish(std::shared_ptr<const pb::StoredBlock> block) {
  {
    absl::MutexLock lock(&impl_->index_mu);
    impl_->Index(*block);
  }
  absl::MutexLock lock(&impl_->queue_mu);
  // A publisher far behind drops the oldest blocks' events: the node never waits for it.
  if (impl_->queue.size() >= kMaxPendingEvents) impl_->queue.pop_front();
  impl_->queue.push_back(std::move(block));
}

absl::StatusOr<std::unique_ptr<RpcServer>> RpcServer::Start(Backend* backend,
                                                            RpcServerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->backend = backend;
  impl->options = options;
  impl->channel = grpc::CreateChannel(options.grpc_target, grpc::InsecureChannelCredentials());
  TS_RETURN_IF_ERROR(backend->WithApp([&](const App& app) { impl->chain_id = app.chain_id(); }));
  impl->validator = rpc_json::DevnetValidator(impl->chain_id);
  TS_ASSIGN_OR_RETURN(int64_t latest, impl->LatestHeight());
  {
    absl::MutexLock lock(&impl->index_mu);
    for (int64_t h = 1; h <= latest; ++h) {
      TS_ASSIGN_OR_RETURN(auto block, backend->Block(h));
      impl->Index(*block);
    }
  }

  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(MG_FEATURES_WEBSOCKET); });
  const std::string& listen = options.listen_address;
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc listen address \"", listen, "\": want host:port"));
  }
  const std::string threads = absl::StrCat(kRpcThreads);
  const std::string request_bytes = absl::StrCat(kMaxRpcRequestBytes);
  const std::string timeout_ms = absl::StrCat(kRpcRequestTimeoutMs);
  const char* mg_options[] = {"listening_ports",
                              listen.c_str(),
                              "num_threads",
                              threads.c_str(),
                              "max_request_size",
                              request_bytes.c_str(),
                              "request_timeout_ms",
                              timeout_ms.c_str(),
                              "websocket_timeout_ms",
                              "3600000",
                              "enable_keep_alive",
                              "yes",
                              "enable_directory_listing",
                              "no",
                              nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = [](const mg_connection*, const char* message) {
    common::Log(common::LogLevel::kDebug, kComponent, "http server", {{"message", message}});
    return 1;
  };
  mg_init_data init{&callbacks, nullptr, mg_options};
  char error_text[256] = {0};
  unsigned error_code = 0;
  mg_error_data error{&error_code, error_text, sizeof(error_text)};
  impl->server = mg_start2(&init, &error);
  if (impl->server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("rpc listen address ", listen, ": cannot serve: ", error_text));
  }
  mg_set_request_handler(impl->server, "/", &Impl::HandleHttp, impl.get());
  mg_set_websocket_handler(impl->server, "/websocket", &Impl::WsConnect, &Impl::WsReady,
                           &Impl::WsData, &Impl::WsClose, impl.get());
  mg_server_port port{};
  if (mg_get_server_ports(impl->server, 1, &port) < 1) {
    mg_stop(impl->server);
    return absl::UnavailableError(absl::StrCat("rpc listen address ", listen, ": no port bound"));
  }
  impl->address = absl::StrCat(listen.substr(0, colon), ":", port.port);
  impl->publisher = std::thread([raw = impl.get()] { raw->PublishLoop(); });
  return std::unique_ptr<RpcServer>(new RpcServer(std::move(impl)));
}

}  // namespace ts::bridge::devnet
