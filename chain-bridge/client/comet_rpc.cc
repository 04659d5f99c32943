#include "chain-bridge/client/comet_rpc.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace ts::bridge {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX));
}

// Waits for `events` on `fd` until the deadline.
absl::Status Wait(int fd, short events, Clock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int timeout = RemainingMs(deadline);
    if (timeout == 0) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    int n = poll(&p, 1, timeout);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(what, ": poll: ", std::strerror(errno)));
    }
  }
}

absl::StatusOr<int> Connect(const std::string& target, Clock::time_point deadline) {
  size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc endpoint \"", target, "\": want host:port"));
  }
  std::string host = target.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), target.substr(colon + 1).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("rpc endpoint ", target, ": cannot resolve: ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("rpc endpoint ", target, ": no address"));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
      absl::Status ready = Wait(fd, POLLOUT, deadline, absl::StrCat("connect to ", target));
      int error = 0;
      socklen_t size = sizeof(error);
      if (ready.ok() && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0) {
        freeaddrinfo(found);
        return fd;
      }
      last = ready.ok() ? absl::UnavailableError(
                              absl::StrCat("connect to ", target, ": ", std::strerror(error)))
                        : ready;
    } else {
      last =
          absl::UnavailableError(absl::StrCat("connect to ", target, ": ", std::strerror(errno)));
    }
    close(fd);
  }
  freeaddrinfo(found);
  return last;
}

}  // namespace

absl::StatusOr<std::string> CometRpcCall(const std::string& target, std::string_view method,
                                         std::string_view params_json, int64_t timeout_ms) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  TS_ASSIGN_OR_RETURN(int raw_fd, Connect(target, deadline));
  Fd fd(raw_fd);
  std::string body = absl::StrCat(R"({"jsonrpc":"2.0","id":1,"method":")",
                                  absl::string_view(method.data(), method.size()), R"(","params":)",
                                  absl::string_view(params_json.data(), params_json.size()), "}");
  std::string request =
      absl::StrCat("POST / HTTP/1.1\r\nHost: ", target,
                   "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n\r\n", body);
  size_t sent = 0;
  while (sent < request.size()) {
    TS_RETURN_IF_ERROR(Wait(fd.get(), POLLOUT, deadline, absl::StrCat("send to ", target)));
    ssize_t n = send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("send to ", target, ": ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  // The answer is read to the end (Connection: close), within the cap.
  std::string response;
  char buffer[64 << 10];
  for (;;) {
    TS_RETURN_IF_ERROR(Wait(fd.get(), POLLIN, deadline, absl::StrCat("answer of ", target)));
    ssize_t n = recv(fd.get(), buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat("recv from ", target, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    if (response.size() + static_cast<size_t>(n) > kMaxCometRpcResponseBytes + 4096) {
      return absl::DataLossError(
          absl::StrCat("answer of ", target, " exceeds ", kMaxCometRpcResponseBytes, " bytes"));
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  size_t head_end = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || head_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("answer of ", target, " is not HTTP"));
  }
  Json answer = Json::parse(std::string_view(response).substr(head_end + 4), nullptr, false);
  if (answer.is_discarded() || !answer.is_object()) {
    return absl::DataLossError(absl::StrCat("answer of ", target, " to ",
                                            absl::string_view(method.data(), method.size()),
                                            " is not JSON-RPC"));
  }
  if (auto error = answer.find("error"); error != answer.end() && error->is_object()) {
    std::string data = error->value("data", "");
    std::string message = absl::StrCat(absl::string_view(method.data(), method.size()), ": ",
                                       error->value("message", ""), ": ", data);
    if (absl::StrContains(data, "must be less than or equal to the current blockchain height")) {
      return absl::NotFoundError(message);
    }
    return absl::InvalidArgumentError(message);
  }
  auto result = answer.find("result");
  if (result == answer.end()) {
    return absl::DataLossError(absl::StrCat("answer of ", target, " has no result"));
  }
  return result->dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<std::vector<tendermint::abci::Event>> CometBlockEvents(const std::string& target,
                                                                      int64_t height,
                                                                      int64_t timeout_ms) {
  if (height < 1) {
    return absl::InvalidArgumentError(absl::StrCat("height: ", height, " must be positive"));
  }
  TS_ASSIGN_OR_RETURN(std::string text,
                      CometRpcCall(target, "block_results",
                                   absl::StrCat(R"({"height":")", height, R"("})"), timeout_ms));
  Json result = Json::parse(text, nullptr, false);
  std::vector<tendermint::abci::Event> out;
  auto append = [&](const Json& events) -> absl::Status {
    if (events.is_null()) return absl::OkStatus();
    if (!events.is_array()) return absl::DataLossError("block_results: events are not a list");
    for (const Json& e : events) {
      if (!e.is_object() || !e.contains("type") || !e["type"].is_string()) {
        return absl::DataLossError("block_results: an event without a type");
      }
      tendermint::abci::Event& event = out.emplace_back();
      event.set_type(e["type"].get<std::string>());
      if (!e.contains("attributes") || e["attributes"].is_null()) continue;
      for (const Json& a : e["attributes"]) {
        if (!a.is_object()) return absl::DataLossError("block_results: a bad attribute");
        auto* attribute = event.add_attributes();
        if (a.contains("key") && a["key"].is_string())
          attribute->set_key(a["key"].get<std::string>());
        if (a.contains("value") && a["value"].is_string()) {
          attribute->set_value(a["value"].get<std::string>());
        }
        attribute->set_index(a.value("index", false));
      }
    }
    return absl::OkStatus();
  };
  if (!result.is_object()) return absl::DataLossError("block_results: not an object");
  if (result.contains("txs_results") && result["txs_results"].is_array()) {
    for (const Json& tx : result["txs_results"]) {
      if (tx.is_object() && tx.contains("events")) TS_RETURN_IF_ERROR(append(tx["events"]));
    }
  }
  if (result.contains("finalize_block_events")) {
    TS_RETURN_IF_ERROR(append(result["finalize_block_events"]));
  }
  return out;
}

}  // namespace ts::bridge
