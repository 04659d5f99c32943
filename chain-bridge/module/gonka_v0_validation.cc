// Gonka trainshards v0: its training params, the env the devnet gives it and the stage-2
// endpoint grammar (contract in gonka_v0.h).
#include <string>
#include <string_view>

#include "chain-bridge/module/gonka_v0.h"
#include "chain-bridge/module/keeper_util.h"
#include "chain-bridge/module/str_cat.h"
#include "common/crypto/bech32.h"
#include "common/status.h"

namespace ts::bridge {

using keeper_util::Invalid;

namespace {

absl::Status EndpointError(std::string_view endpoint, std::string_view why) {
  return GonkaV0Error(GonkaV0Code::kOptInRequest, Cat("endpoint \"", endpoint, "\": ", why));
}

bool IsHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_' || c == '~' || c == '%';
}

// The port after a host ("" allowed): decimal 1..65535.
bool ValidPort(std::string_view port) {
  if (port.empty()) return true;
  if (port.size() > 5) return false;
  int value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  return value >= 1 && value <= 65535;
}

}  // namespace

gv0::TrainingParams DefaultTrainingParams() {
  gv0::TrainingParams p;
  p.set_training_enabled(false);
  p.set_max_nodes_per_shard(64);
  p.set_max_active_shards(16);
  p.set_min_duration_blocks(40);
  p.set_max_duration_blocks(100000);
  p.set_max_active_shards_per_creator(4);
  p.set_creator_cooldown_blocks(0);
  p.set_max_total_reserved_nodes(256);
  p.set_max_reserved_share_per_model_bps(5000);
  p.set_max_reserved_share_per_profile_bps(5000);
  p.set_max_expirations_per_block(32);
  p.set_settled_shard_retention_blocks(100);
  p.set_opt_in_ttl_blocks(200);
  p.set_release_buffer_blocks(20);
  return p;
}

absl::Status ValidateTrainingEndpoint(std::string_view endpoint) {
  if (endpoint.size() > kGonkaMaxEndpointBytes) {
    return EndpointError(endpoint, Cat("longer than ", kGonkaMaxEndpointBytes, " bytes"));
  }
  for (char c : endpoint) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return EndpointError(endpoint, "control character");
    }
  }
  size_t sep = endpoint.find("://");
  std::string scheme(endpoint.substr(0, sep == std::string_view::npos ? 0 : sep));
  // Go's url.Parse lower-cases the scheme before Gonka compares it.
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; });
  if (sep == std::string_view::npos || (scheme != "http" && scheme != "https")) {
    return EndpointError(endpoint, "scheme must be http or https");
  }
  if (endpoint.find_first_of("?#") != std::string_view::npos) {
    return EndpointError(endpoint, "only scheme, host, port and path are allowed");
  }
  std::string_view rest = endpoint.substr(sep + 3);
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (authority.find('@') != std::string_view::npos) {
    return EndpointError(endpoint, "only scheme, host, port and path are allowed");
  }
  std::string_view host = authority;
  std::string_view port;
  bool has_port_colon = false;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return EndpointError(endpoint, "unclosed [ in host");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') return EndpointError(endpoint, "bad host");
    has_port_colon = !after.empty();
    if (has_port_colon) port = after.substr(1);
    for (char c : host) {
      if (!IsHostChar(c) && c != ':') return EndpointError(endpoint, "bad host character");
    }
  } else {
    size_t colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      host = authority.substr(0, colon);
      port = authority.substr(colon + 1);
      has_port_colon = true;
    }
    for (char c : host) {
      if (!IsHostChar(c)) return EndpointError(endpoint, "bad host character");
    }
  }
  if (host.empty()) return EndpointError(endpoint, "host is empty");
  if ((has_port_colon && port.empty()) || !ValidPort(port)) {
    return EndpointError(endpoint, "port must be in 1..65535");
  }
  if (!path.empty() && path.back() == '/') return EndpointError(endpoint, "no trailing slash");
  return absl::OkStatus();
}

// --- params and env

absl::Status GonkaV0Keeper::ValidateParams(const gv0::TrainingParams& p) {
  auto positive = [](std::string_view field, int64_t value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return Invalid(Cat("training_params.", field), "must be > 0, got ", value);
  };
  TS_RETURN_IF_ERROR(positive("max_nodes_per_shard", p.max_nodes_per_shard()));
  TS_RETURN_IF_ERROR(positive("max_active_shards", p.max_active_shards()));
  TS_RETURN_IF_ERROR(positive("max_active_shards_per_creator", p.max_active_shards_per_creator()));
  TS_RETURN_IF_ERROR(positive("max_total_reserved_nodes", p.max_total_reserved_nodes()));
  TS_RETURN_IF_ERROR(positive("max_expirations_per_block", p.max_expirations_per_block()));
  TS_RETURN_IF_ERROR(positive("min_duration_blocks", p.min_duration_blocks()));
  TS_RETURN_IF_ERROR(positive("opt_in_ttl_blocks", p.opt_in_ttl_blocks()));
  const std::pair<std::string_view, uint32_t> shares[] = {
      {"max_reserved_share_per_model_bps", p.max_reserved_share_per_model_bps()},
      {"max_reserved_share_per_profile_bps", p.max_reserved_share_per_profile_bps()}};
  for (const auto& [field, bps] : shares) {
    TS_RETURN_IF_ERROR(positive(field, bps));
    if (bps > kGonkaBpsMax) {
      return Invalid(Cat("training_params.", field), "must be <= 10000, got ", bps);
    }
  }
  const std::pair<std::string_view, int64_t> heights[] = {
      {"min_duration_blocks", p.min_duration_blocks()},
      {"max_duration_blocks", p.max_duration_blocks()},
      {"creator_cooldown_blocks", p.creator_cooldown_blocks()},
      {"settled_shard_retention_blocks", p.settled_shard_retention_blocks()},
      {"opt_in_ttl_blocks", p.opt_in_ttl_blocks()},
      {"release_buffer_blocks", p.release_buffer_blocks()}};
  for (const auto& [field, blocks] : heights) {
    if (blocks < 0 || blocks > kGonkaBlocksMax) {
      return Invalid(Cat("training_params.", field), "must be in [0, 1e15], got ", blocks);
    }
  }
  if (p.max_duration_blocks() < p.min_duration_blocks()) {
    return Invalid("training_params.max_duration_blocks", "must be >= min_duration_blocks ",
                   p.min_duration_blocks(), ", got ", p.max_duration_blocks());
  }
  for (int i = 0; i < p.allowed_gpu_profile_ids_size(); ++i) {
    if (p.allowed_gpu_profile_ids(i).empty()) {
      return Invalid(Cat("training_params.allowed_gpu_profile_ids[", i, "]"), "is empty");
    }
  }
  return absl::OkStatus();
}

absl::Status GonkaV0Keeper::ValidateParams(const gv0::TrainingParams& p,
                                           int64_t epoch_length_blocks) {
  TS_RETURN_IF_ERROR(ValidateParams(p));
  if (!p.training_enabled() || epoch_length_blocks <= 0) return absl::OkStatus();
  const int64_t min_retention = 2 * epoch_length_blocks + p.release_buffer_blocks();
  if (p.settled_shard_retention_blocks() < min_retention) {
    return Invalid("training_params.settled_shard_retention_blocks",
                   "must be >= 2 * epoch_length + release_buffer_blocks = ", min_retention,
                   " when training is enabled, got ", p.settled_shard_retention_blocks());
  }
  if (p.opt_in_ttl_blocks() < epoch_length_blocks) {
    return Invalid("training_params.opt_in_ttl_blocks", "must be >= epoch length ",
                   epoch_length_blocks, " when training is enabled, got ", p.opt_in_ttl_blocks());
  }
  return absl::OkStatus();
}

absl::Status GonkaV0Keeper::ValidateEnv(const GonkaV0Env& env) {
  TS_RETURN_IF_ERROR(ValidateParams(env.params));
  TS_RETURN_IF_ERROR(common::ParseAddress("authority", env.authority).status());
  std::map<std::string, std::string> profile_of;  // node key -> profile
  std::set<std::string> pairs;                    // node key + model
  for (size_t i = 0; i < env.ml_nodes.size(); ++i) {
    const GonkaMlNode& n = env.ml_nodes[i];
    std::string field = Cat("ml_nodes[", i, "]");
    TS_RETURN_IF_ERROR(common::ParseAddress(Cat(field, ".participant"), n.participant).status());
    if (n.node_id.empty()) return Invalid(Cat(field, ".node_id"), "is empty");
    if (n.model_id.empty()) return Invalid(Cat(field, ".model_id"), "is empty");
    if (n.poc_weight < 0) return Invalid(Cat(field, ".poc_weight"), "negative: ", n.poc_weight);
    std::string key = gv0_keys::Node(n.participant, n.node_id);
    auto [it, inserted] = profile_of.emplace(key, n.gpu_profile_id);
    if (!inserted && it->second != n.gpu_profile_id) {
      return Invalid(Cat(field, ".gpu_profile_id"), "\"", n.gpu_profile_id, "\" but node ",
                     n.node_id, " of ", n.participant, " was listed with \"", it->second, "\"");
    }
    if (!pairs.insert(Cat(key, std::string_view("\0", 1), n.model_id)).second) {
      return Invalid(field, "node ", n.node_id, " of ", n.participant, " listed twice for model ",
                     n.model_id);
    }
  }
  return absl::OkStatus();
}

}  // namespace ts::bridge
