#include "sidecar/host/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include <toml++/toml.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "chain-bridge/client/gonka_v0_client.h"
#include "common/absl_view.h"
#include "common/amount.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/regular_file.h"
#include "common/status.h"
#include "worker/device.h"

namespace ts::sidecar {
namespace {

std::string Describe(const toml::node& node) {
  std::ostringstream out;
  if (const auto* s = node.as_string()) {
    out << '"' << s->get().substr(0, 128) << '"';
  } else {
    node.visit([&out](auto&& value) { out << value; });
  }
  std::string text = out.str();
  if (text.size() > 160) text = text.substr(0, 160) + "...";
  return text;
}

const char* TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::array:
      return "array";
    case toml::node_type::table:
      return "table";
    default:
      return "date/time";
  }
}

absl::Status WrongType(std::string_view key, const toml::node& node, std::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(key), ": expected ",
                                                 common::AsAbsl(want), ", got ", TypeName(node),
                                                 " ", Describe(node)));
}

absl::StatusOr<std::string> GetString(std::string_view key, const toml::node& node) {
  const auto* s = node.as_string();
  if (s == nullptr) return WrongType(key, node, "a string");
  return s->get();
}

absl::StatusOr<int64_t> GetInteger(std::string_view key, const toml::node& node, int64_t min,
                                   int64_t max) {
  const auto* i = node.as_integer();
  if (i == nullptr) return WrongType(key, node, "an integer");
  int64_t v = i->get();
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(key), ": ", v, " is out of range [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<bool> GetBool(std::string_view key, const toml::node& node) {
  const auto* b = node.as_boolean();
  if (b == nullptr) return WrongType(key, node, "a boolean (true or false)");
  return b->get();
}

bool IsProfileChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

absl::Status CheckProfile(std::string_view key, std::string_view profile) {
  bool ok = !profile.empty() && profile.size() <= 64;
  for (char c : profile) ok = ok && IsProfileChar(c);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(key), ": \"", common::AsAbsl(profile.substr(0, 80)),
                     "\" is not a hardware profile id ", "([a-z0-9-]{1,64})"));
  }
  return absl::OkStatus();
}

absl::Status ParsePolicy(const toml::table& table, ReservationPolicy* policy) {
  for (auto&& [k, node] : table) {
    std::string key = absl::StrCat("policy.", common::AsAbsl(k.str()));
    if (k.str() == "auto_reserve") {
      TS_ASSIGN_OR_RETURN(policy->auto_reserve, GetBool(key, node));
    } else if (k.str() == "hardware_profiles") {
      const auto* array = node.as_array();
      if (array == nullptr) return WrongType(key, node, "an array of strings");
      if (array->size() > kMaxHardwareProfiles) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, ": ", array->size(), " entries, at most ", kMaxHardwareProfiles));
      }
      policy->hardware_profiles.clear();
      for (size_t i = 0; i < array->size(); ++i) {
        std::string item_key = absl::StrCat(key, "[", i, "]");
        TS_ASSIGN_OR_RETURN(std::string profile, GetString(item_key, *array->get(i)));
        TS_RETURN_IF_ERROR(CheckProfile(item_key, profile));
        policy->hardware_profiles.push_back(std::move(profile));
      }
    } else if (k.str() == "max_shards") {
      TS_ASSIGN_OR_RETURN(int64_t v, GetInteger(key, node, 0, kMaxShardsLimit));
      policy->max_shards = static_cast<uint32_t>(v);
    } else if (k.str() == "min_escrow_per_node") {
      if (node.is_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, ": expected an ngonka amount as a base-10 string, e.g. \"",
                         Describe(node), "\", got integer ", Describe(node)));
      }
      TS_ASSIGN_OR_RETURN(std::string text, GetString(key, node));
      TS_ASSIGN_OR_RETURN(policy->min_escrow_per_node, common::ParseAmount(key, text));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": unknown key (value ", Describe(node), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseGonkaV0(const toml::table& table, GonkaV0HostConfig* gonka) {
  for (auto&& [k, node] : table) {
    std::string key = absl::StrCat("gonka_v0.", common::AsAbsl(k.str()));
    if (k.str() == "node_ids") {
      const auto* array = node.as_array();
      if (array == nullptr) return WrongType(key, node, "an array of strings");
      if (array->size() > kMaxGonkaNodeIds) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, ": ", array->size(), " entries, at most ", kMaxGonkaNodeIds));
      }
      gonka->node_ids.clear();
      for (size_t i = 0; i < array->size(); ++i) {
        std::string item_key = absl::StrCat(key, "[", i, "]");
        TS_ASSIGN_OR_RETURN(std::string id, GetString(item_key, *array->get(i)));
        if (id.empty() || id.size() > kMaxGonkaNodeIdBytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              item_key, ": \"", id.substr(0, 80), "\" is not 1..", kMaxGonkaNodeIdBytes, " bytes"));
        }
        if (std::find(gonka->node_ids.begin(), gonka->node_ids.end(), id) !=
            gonka->node_ids.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(item_key, ": \"", id, "\" is listed twice"));
        }
        gonka->node_ids.push_back(std::move(id));
      }
    } else if (k.str() == "refresh_every_blocks") {
      TS_ASSIGN_OR_RETURN(gonka->refresh_every_blocks, GetInteger(key, node, 1, 1'000'000));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": unknown key (value ", Describe(node), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckHostPort(std::string_view key, std::string_view value, int min_port) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(key), ": \"", common::AsAbsl(value.substr(0, 200)),
                     "\" is not host:port (", common::AsAbsl(why), ")"));
  };
  size_t colon = value.rfind(':');
  if (colon == std::string_view::npos) return bad("no ':port'");
  std::string_view host = value.substr(0, colon);
  std::string_view port_text = value.substr(colon + 1);
  if (host.empty()) return bad("empty host");
  if (host.front() == '[' && host.back() != ']') return bad("unclosed '['");
  if (host.front() != '[' && host.find(':') != std::string_view::npos) {
    return bad("IPv6 hosts need brackets, e.g. [::1]:9000");
  }
  for (char c : host) {
    if (c <= ' ' || c == '/' || c == '"') return bad("bad character in host");
  }
  int port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      !absl::SimpleAtoi(common::AsAbsl(port_text), &port)) {
    return bad("port is not a number");
  }
  for (char c : port_text) {
    if (c < '0' || c > '9') return bad("port is not a number");
  }
  if (port < min_port || port > 65535) {
    return bad(absl::StrCat("port must be in [", min_port, ", 65535]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostConfig> ParseHostConfig(std::string_view toml_text, std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    // toml++ reports syntax errors by exception; this is the one place they are caught.
    const auto& begin = e.source().begin;
    return absl::InvalidArgumentError(
        absl::StrCat(common::AsAbsl(source), ":", begin.line, ":", begin.column,
                     ": TOML syntax error: ", common::AsAbsl(e.description())));
  }
  HostConfig config;
  for (auto&& [k, node] : root) {
    std::string_view key = k.str();
    if (key == "chain_endpoint") {
      TS_ASSIGN_OR_RETURN(config.chain_endpoint, GetString(key, node));
    } else if (key == "chain_profile") {
      TS_ASSIGN_OR_RETURN(config.chain_profile, GetString(key, node));
      TS_RETURN_IF_ERROR(bridge::ParseChainProfile(key, config.chain_profile).status());
    } else if (key == "gonka_v0") {
      const auto* table = node.as_table();
      if (table == nullptr) return WrongType(key, node, "a table ([gonka_v0])");
      TS_RETURN_IF_ERROR(ParseGonkaV0(*table, &config.gonka_v0));
    } else if (key == "chain_rpc_endpoint") {
      TS_ASSIGN_OR_RETURN(config.chain_rpc_endpoint, GetString(key, node));
    } else if (key == "listen") {
      TS_ASSIGN_OR_RETURN(config.listen, GetString(key, node));
    } else if (key == "key_file") {
      TS_ASSIGN_OR_RETURN(config.key_file, GetString(key, node));
    } else if (key == "data_dir") {
      TS_ASSIGN_OR_RETURN(config.data_dir, GetString(key, node));
    } else if (key == "shard_endpoint") {
      TS_ASSIGN_OR_RETURN(config.shard_endpoint, GetString(key, node));
    } else if (key == "stats_listen") {
      TS_ASSIGN_OR_RETURN(config.stats_listen, GetString(key, node));
    } else if (key == "shard_listen") {
      TS_ASSIGN_OR_RETURN(config.shard_listen, GetString(key, node));
    } else if (key == "peer_tls") {
      TS_ASSIGN_OR_RETURN(config.peer_tls, GetBool(key, node));
    } else if (key == "chunk_stream") {
      TS_ASSIGN_OR_RETURN(config.chunk_stream, GetBool(key, node));
    } else if (key == "artifacts_dir") {
      TS_ASSIGN_OR_RETURN(config.artifacts_dir, GetString(key, node));
    } else if (key == "files_root") {
      TS_ASSIGN_OR_RETURN(config.files_root, GetString(key, node));
    } else if (key == "tls_cert_sha256") {
      TS_ASSIGN_OR_RETURN(std::string hex, GetString(key, node));
      auto bytes = common::HexDecode(hex);
      if (!bytes.ok() || bytes->size() != 32) {
        return absl::InvalidArgumentError(absl::StrCat("tls_cert_sha256: \"", hex.substr(0, 80),
                                                       "\" is not 64 hex digits (a SHA-256)"));
      }
      config.tls_cert_sha256 = *std::move(bytes);
    } else if (key == "poll_interval_ms") {
      TS_ASSIGN_OR_RETURN(config.poll_interval_ms,
                          GetInteger(key, node, kMinPollIntervalMs, kMaxPollIntervalMs));
    } else if (key == "worker_binary") {
      TS_ASSIGN_OR_RETURN(config.worker_binary, GetString(key, node));
    } else if (key == "shard_idle_stop_ms") {
      TS_ASSIGN_OR_RETURN(config.shard_idle_stop_ms,
                          GetInteger(key, node, 0, int64_t{7} * 24 * 3600 * 1000));
    } else if (key == "shard_binary") {
      TS_ASSIGN_OR_RETURN(config.shard_binary, GetString(key, node));
    } else if (key == "worker_device") {
      TS_ASSIGN_OR_RETURN(config.worker_device, GetString(key, node));
      TS_RETURN_IF_ERROR(worker::ParseDevice(key, config.worker_device).status());
    } else if (key == "worker_threads") {
      TS_ASSIGN_OR_RETURN(config.worker_threads, GetInteger(key, node, 1, 256));
    } else if (key == "worker_memory_bytes_max") {
      TS_ASSIGN_OR_RETURN(int64_t v, GetInteger(key, node, 0, int64_t{1} << 50));
      if (v != 0 && v < (int64_t{1} << 20)) {
        return absl::InvalidArgumentError(absl::StrCat(
            common::AsAbsl(key), ": ", v, " is below 1048576 (0 means the machine's memory)"));
      }
      config.worker_memory_bytes_max = static_cast<uint64_t>(v);
    } else if (key == "log_level") {
      TS_ASSIGN_OR_RETURN(config.log_level, GetString(key, node));
    } else if (key == "policy") {
      const auto* table = node.as_table();
      if (table == nullptr) return WrongType(key, node, "a table ([policy])");
      TS_RETURN_IF_ERROR(ParsePolicy(*table, &config.policy));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(common::AsAbsl(key), ": unknown key (value ", Describe(node), ")"));
    }
  }
  return config;
}

absl::StatusOr<HostConfig> LoadHostConfigFile(const std::string& path) {
  // A FIFO or device under the name is refused at once (common/regular_file.h).
  absl::StatusOr<std::string> text =
      common::ReadRegularFile("config file", path, kMaxConfigFileBytes);
  if (absl::IsFailedPrecondition(text.status())) {
    return absl::InvalidArgumentError(text.status().message());
  }
  if (!text.ok()) return text.status();
  return ParseHostConfig(*text, path);
}

void ApplyOverrides(const HostConfigOverrides& overrides, HostConfig* config) {
  if (overrides.data_dir) config->data_dir = *overrides.data_dir;
  if (overrides.key_file) config->key_file = *overrides.key_file;
  if (overrides.chain_endpoint) config->chain_endpoint = *overrides.chain_endpoint;
  if (overrides.listen) config->listen = *overrides.listen;
  if (overrides.log_level) config->log_level = *overrides.log_level;
}

absl::Status ValidateHostConfig(const HostConfig& config) {
  auto required = [](std::string_view key, const std::string& value) -> absl::Status {
    if (value.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(key), ": required, not set"));
    }
    return absl::OkStatus();
  };
  TS_RETURN_IF_ERROR(required("chain_endpoint", config.chain_endpoint));
  TS_RETURN_IF_ERROR(CheckHostPort("chain_endpoint", config.chain_endpoint, 1));
  if (!config.chain_rpc_endpoint.empty()) {
    TS_RETURN_IF_ERROR(CheckHostPort("chain_rpc_endpoint", config.chain_rpc_endpoint, 1));
  }
  if (!config.listen.empty()) TS_RETURN_IF_ERROR(CheckHostPort("listen", config.listen, 0));
  if (!config.stats_listen.empty()) {
    TS_RETURN_IF_ERROR(CheckHostPort("stats_listen", config.stats_listen, 0));
  }
  TS_ASSIGN_OR_RETURN(bridge::ChainProfile profile,
                      bridge::ParseChainProfile("chain_profile", config.chain_profile));
  if (profile == bridge::ChainProfile::kGonkaV0 && config.gonka_v0.node_ids.empty()) {
    return absl::InvalidArgumentError(
        "gonka_v0.node_ids: required under chain_profile \"gonka-v0\" (the ML node ids this "
        "host offers for training), not set");
  }
  if (profile == bridge::ChainProfile::kGonkaV0 && config.chain_rpc_endpoint.empty()) {
    // A Gonka node has no query of the module's for a height's events.
    return absl::InvalidArgumentError(
        "chain_rpc_endpoint: required under chain_profile \"gonka-v0\" (the node's CometBFT "
        "JSON-RPC, for each height's events), not set");
  }
  TS_RETURN_IF_ERROR(required("key_file", config.key_file));
  TS_RETURN_IF_ERROR(required("data_dir", config.data_dir));
  TS_RETURN_IF_ERROR(required("shard_endpoint", config.shard_endpoint));
  TS_RETURN_IF_ERROR(CheckHostPort("shard_endpoint", config.shard_endpoint, 1));
  if (!config.shard_listen.empty()) {
    TS_RETURN_IF_ERROR(CheckHostPort("shard_listen", config.shard_listen, 0));
  }
  for (const auto& [key, dir] :
       {std::pair<std::string_view, const std::string&>{"artifacts_dir", config.artifacts_dir},
        {"files_root", config.files_root}}) {
    if (dir.empty()) continue;
    if (dir.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(common::AsAbsl(key), ": \"", dir.substr(0, 200), "\" is not absolute"));
    }
    if (dir.size() > 4000 || dir.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          common::AsAbsl(key), ": \"", dir.substr(0, 200), "...\" is not a usable path"));
    }
  }
  common::LogLevel level;
  if (!common::ParseLogLevel(config.log_level, &level)) {
    return absl::InvalidArgumentError(absl::StrCat("log_level: \"", config.log_level.substr(0, 40),
                                                   "\" is not one of debug, info, warn, error"));
  }
  return absl::OkStatus();
}

std::string ShardListenAddress(const HostConfig& config) {
  if (!config.shard_listen.empty()) return config.shard_listen;
  const std::string& endpoint = config.shard_endpoint;
  return "0.0.0.0" + endpoint.substr(std::min(endpoint.rfind(':'), endpoint.size()));
}

std::string ArtifactsDir(const HostConfig& config) {
  if (!config.artifacts_dir.empty()) return config.artifacts_dir;
  return config.data_dir + "/artifacts";
}

}  // namespace ts::sidecar
