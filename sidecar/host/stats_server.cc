#include "sidecar/host/stats_server.h"

#include <civetweb.h>

#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "sidecar/host/config.h"
#include "sidecar/host/stats_page.h"

namespace ts::sidecar {
namespace {

constexpr std::string_view kComponent = "stats";

// The page's code and styles come from this server alone; it fetches only its own JSON.
constexpr std::string_view kSecurityHeaders =
    "Cache-Control: no-store\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'\r\n";

std::string_view ContentType(std::string_view path) {
  if (path.ends_with(".html")) return "text/html; charset=utf-8";
  if (path.ends_with(".css")) return "text/css; charset=utf-8";
  if (path.ends_with(".js")) return "text/javascript; charset=utf-8";
  return "application/octet-stream";
}

void Respond(mg_connection* connection, int code, std::string_view reason,
             std::string_view content_type, std::string_view body, bool head,
             std::string_view extra_headers = "") {
  std::string header = absl::StrCat("HTTP/1.1 ", code, " ");
  header.append(reason).append("\r\nContent-Type: ").append(content_type);
  absl::StrAppend(&header, "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n");
  header.append(kSecurityHeaders).append(extra_headers).append("\r\n");
  mg_write(connection, header.data(), header.size());
  if (!head && !body.empty()) mg_write(connection, body.data(), body.size());
}

// civetweb logs through this instead of stderr.
int LogMessage(const mg_connection*, const char* message) {
  common::Log(common::LogLevel::kDebug, kComponent, "http server", {{"message", message}});
  return 1;
}

// civetweb is initialised once per process.
void InitLibrary() {
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

}  // namespace

struct StatsServer::Context {
  StatsSources sources;
  mg_context* server = nullptr;

  static int Handle(mg_connection* connection, void* data) {
    return static_cast<Context*>(data)->Serve(connection);
  }

  int Serve(mg_connection* connection) {
    const mg_request_info* request = mg_get_request_info(connection);
    const std::string_view method = request->request_method ? request->request_method : "";
    const std::string_view path = request->local_uri ? request->local_uri : "";
    const bool head = method == "HEAD";
    if (method != "GET" && !head) {
      Count("other");
      Respond(connection, 405, "Method Not Allowed", "text/plain; charset=utf-8",
              "only GET and HEAD\n", false, "Allow: GET, HEAD\r\n");
      return 405;
    }
    if (path == "/metrics") {
      Count("metrics");
      Respond(connection, 200, "OK", "text/plain; version=0.0.4; charset=utf-8",
              sources.metrics->Render(), head);
      return 200;
    }
    if (path == "/api/v1/overview") {
      Count("api");
      Respond(connection, 200, "OK", "application/json", sources.overview_json(), head);
      return 200;
    }
    const std::string_view file = path == "/" ? "/index.html" : path;
    for (const EmbeddedFile& f : StatsPageFiles()) {
      if (f.path == file) {
        Count("page");
        Respond(connection, 200, "OK", ContentType(f.path), f.body, head);
        return 200;
      }
    }
    Count("other");
    Respond(connection, 404, "Not Found", "text/plain; charset=utf-8", "not found\n", head);
    return 404;
  }

  void Count(std::string_view path_class) {
    if (sources.metrics != nullptr) sources.metrics->CountRequest(path_class);
  }
};

absl::StatusOr<std::unique_ptr<StatsServer>> StatsServer::Start(const std::string& listen,
                                                                StatsSources sources) {
  if (absl::Status valid = CheckHostPort("stats_listen", listen, 0); !valid.ok()) return valid;
  if (!sources.overview_json || sources.metrics == nullptr) {
    return absl::InvalidArgumentError("stats server: no overview or metrics to serve");
  }
  InitLibrary();
  std::unique_ptr<StatsServer> out(new StatsServer());
  out->context_ = std::make_unique<Context>();
  out->context_->sources = std::move(sources);

  const std::string threads = absl::StrCat(kStatsThreads);
  const std::string request_bytes = absl::StrCat(kMaxStatsRequestBytes);
  const std::string timeout_ms = absl::StrCat(kStatsRequestTimeoutMs);
  const char* options[] = {"listening_ports",
                           listen.c_str(),
                           "num_threads",
                           threads.c_str(),
                           "max_request_size",
                           request_bytes.c_str(),
                           "request_timeout_ms",
                           timeout_ms.c_str(),
                           "enable_keep_alive",
                           "no",
                           "enable_directory_listing",
                           "no",
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = LogMessage;
  mg_init_data init{&callbacks, nullptr, options};
  char error_text[256] = {0};
  unsigned error_code = 0;
  mg_error_data error{&error_code, error_text, sizeof(error_text)};
  out->context_->server = mg_start2(&init, &error);
  if (out->context_->server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("stats_listen ", listen, ": cannot serve: ", error_text));
  }
  mg_set_request_handler(out->context_->server, "/", &Context::Handle, out->context_.get());
  mg_server_port port{};
  if (mg_get_server_ports(out->context_->server, 1, &port) < 1) {
    return absl::UnavailableError(absl::StrCat("stats_listen ", listen, ": no port bound"));
  }
  out->address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port.port);
  return out;
}

StatsServer::~StatsServer() {
  if (context_ != nullptr && context_->server != nullptr) mg_stop(context_->server);
}

}  // namespace ts::sidecar
