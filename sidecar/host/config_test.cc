#include "sidecar/host/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

constexpr char kMinimal[] = R"(
chain_endpoint = "127.0.0.1:9090"
key_file = "/tmp/k"
data_dir = "/tmp/d"
shard_endpoint = "10.0.0.1:7000"
)";

HostConfig MustParse(const std::string& text) {
  auto config = ParseHostConfig(text, "test.toml");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : HostConfig{};
}

// Parses `text` appended to a valid minimal config and expects INVALID_ARGUMENT whose message
// holds every fragment.
void ExpectBad(const std::string& extra, std::initializer_list<std::string> fragments) {
  auto config = ParseHostConfig(std::string(kMinimal) + extra, "test.toml");
  ASSERT_FALSE(config.ok()) << extra;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  for (const auto& f : fragments) {
    EXPECT_NE(config.status().message().find(f), absl::string_view::npos)
        << "message \"" << config.status().message() << "\" lacks \"" << f << "\"";
  }
}

TEST(ConfigTest, Defaults) {
  HostConfig c = MustParse(kMinimal);
  EXPECT_EQ(c.chain_endpoint, "127.0.0.1:9090");
  EXPECT_EQ(c.listen, "127.0.0.1:0");
  EXPECT_EQ(c.stats_listen, "127.0.0.1:0");
  EXPECT_EQ(c.poll_interval_ms, 200);
  EXPECT_EQ(c.shard_idle_stop_ms, 60'000);
  EXPECT_TRUE(c.shard_binary.empty());
  EXPECT_TRUE(c.tls_cert_sha256.empty());
  EXPECT_TRUE(c.policy.auto_reserve);
  EXPECT_TRUE(c.policy.hardware_profiles.empty());
  EXPECT_EQ(c.policy.max_shards, 4u);
  EXPECT_EQ(c.policy.min_escrow_per_node, 0u);
  EXPECT_TRUE(c.shard_listen.empty());
  EXPECT_TRUE(c.chunk_stream);
  EXPECT_TRUE(c.peer_tls);  // on unless switched off
  EXPECT_TRUE(c.artifacts_dir.empty());
  EXPECT_EQ(ShardListenAddress(c), "0.0.0.0:7000");
  EXPECT_EQ(ArtifactsDir(c), "/tmp/d/artifacts");
  EXPECT_TRUE(ValidateHostConfig(c).ok());
}

TEST(ConfigTest, EveryKey) {
  HostConfig c = MustParse(std::string(kMinimal) + R"(
listen = "0.0.0.0:9100"
stats_listen = "0.0.0.0:9464"
shard_listen = "10.0.0.1:7100"
chunk_stream = false
peer_tls = false
artifacts_dir = "/srv/artifacts"
tls_cert_sha256 = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF"
poll_interval_ms = 50
log_level = "debug"
shard_idle_stop_ms = 0
shard_binary = "/opt/trainshard/ts_shard"
worker_memory_bytes_max = 8589934592
worker_device = "auto"
[policy]
auto_reserve = false
hardware_profiles = ["cpu-small", "h100-80g"]
max_shards = 7
min_escrow_per_node = "123456789"
)");
  EXPECT_EQ(c.listen, "0.0.0.0:9100");
  EXPECT_EQ(c.stats_listen, "0.0.0.0:9464");
  EXPECT_EQ(c.shard_listen, "10.0.0.1:7100");
  EXPECT_FALSE(c.chunk_stream);
  EXPECT_FALSE(c.peer_tls);
  EXPECT_EQ(ShardListenAddress(c), "10.0.0.1:7100");
  EXPECT_EQ(c.artifacts_dir, "/srv/artifacts");
  EXPECT_EQ(ArtifactsDir(c), "/srv/artifacts");
  ASSERT_EQ(c.tls_cert_sha256.size(), 32u);
  EXPECT_EQ(static_cast<unsigned char>(c.tls_cert_sha256[31]), 0xffu);
  EXPECT_EQ(c.poll_interval_ms, 50);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.shard_idle_stop_ms, 0);
  EXPECT_EQ(c.shard_binary, "/opt/trainshard/ts_shard");
  EXPECT_EQ(c.worker_memory_bytes_max, 8589934592u);
  EXPECT_EQ(c.worker_device, "auto");
  EXPECT_FALSE(c.policy.auto_reserve);
  EXPECT_EQ(c.policy.hardware_profiles, (std::vector<std::string>{"cpu-small", "h100-80g"}));
  EXPECT_EQ(c.policy.max_shards, 7u);
  EXPECT_EQ(c.policy.min_escrow_per_node, 123456789u);
  EXPECT_TRUE(ValidateHostConfig(c).ok());
}

TEST(ConfigTest, BadValuesNameTheKeyAndValue) {
  ExpectBad("poll_interval_ms = 5\n", {"poll_interval_ms", "5", "out of range"});
  ExpectBad("shard_idle_stop_ms = -1\n", {"shard_idle_stop_ms", "-1", "out of range"});
  ExpectBad("worker_memory_bytes_max = 4096\n", {"worker_memory_bytes_max", "4096", "below"});
  ExpectBad("worker_memory_bytes_max = -1\n", {"worker_memory_bytes_max", "-1"});
  ExpectBad("worker_device = \"gpu\"\n", {"worker_device", "gpu", "cpu, cuda or auto"});
  ExpectBad("poll_interval_ms = \"fast\"\n", {"poll_interval_ms", "integer", "fast"});
  ExpectBad("listen = 9000\n", {"listen", "string", "9000"});
  ExpectBad("tls_cert_sha256 = \"abcd\"\n", {"tls_cert_sha256", "abcd"});
  ExpectBad("tls_cert_sha256 = \"" + std::string(64, 'z') + "\"\n", {"tls_cert_sha256", "zzz"});
  ExpectBad("colour = \"blue\"\n", {"colour", "unknown key", "blue"});
  ExpectBad("[policy]\nmax_shards = -1\n", {"policy.max_shards", "-1"});
  ExpectBad("[policy]\nmax_shards = 5000\n", {"policy.max_shards", "5000"});
  ExpectBad("[policy]\nauto_reserve = \"yes\"\n", {"policy.auto_reserve", "boolean", "yes"});
  ExpectBad("[policy]\nhardware_profiles = \"cpu-small\"\n", {"policy.hardware_profiles", "array"});
  ExpectBad("[policy]\nhardware_profiles = [\"CPU Small\"]\n",
            {"policy.hardware_profiles[0]", "CPU Small"});
  ExpectBad("[policy]\nhardware_profiles = [\"ok\", 3]\n", {"policy.hardware_profiles[1]", "3"});
  ExpectBad("[policy]\nmin_escrow_per_node = \"-5\"\n", {"policy.min_escrow_per_node", "-5"});
  ExpectBad("[policy]\nmin_escrow_per_node = \"1.5\"\n", {"policy.min_escrow_per_node", "1.5"});
  ExpectBad("[policy]\nmin_escrow_per_node = 100\n",
            {"policy.min_escrow_per_node", "string", "100"});
  ExpectBad("[policy]\nspeed = 1\n", {"policy.speed", "unknown key"});
  ExpectBad("policy = 3\n", {"policy", "table"});
  ExpectBad("shard_listen = 7000\n", {"shard_listen", "string", "7000"});
  ExpectBad("stats_listen = 9464\n", {"stats_listen", "string", "9464"});
  ExpectBad("chunk_stream = \"yes\"\n", {"chunk_stream", "boolean"});
  ExpectBad("peer_tls = 1\n", {"peer_tls", "boolean"});
  ExpectBad("artifacts_dir = [\"/a\"]\n", {"artifacts_dir", "string"});
}

TEST(ConfigTest, SyntaxErrorNamesFileAndLine) {
  auto c = ParseHostConfig("chain_endpoint = \"a:1\"\nlisten = \n", "host.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("host.toml:2"), absl::string_view::npos)
      << c.status().message();
}

TEST(ConfigTest, ValidateRequiredAndAddresses) {
  HostConfig c = MustParse(kMinimal);
  {
    HostConfig bad = c;
    bad.chain_endpoint.clear();
    auto s = ValidateHostConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("chain_endpoint: required"), absl::string_view::npos);
  }
  for (auto* key : {"key_file", "data_dir", "shard_endpoint"}) {
    HostConfig bad = c;
    if (std::string(key) == "key_file") bad.key_file.clear();
    if (std::string(key) == "data_dir") bad.data_dir.clear();
    if (std::string(key) == "shard_endpoint") bad.shard_endpoint.clear();
    auto s = ValidateHostConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_NE(s.message().find(key), absl::string_view::npos) << s.message();
  }
  {
    HostConfig bad = c;
    bad.shard_endpoint = "10.0.0.1:0";
    auto s = ValidateHostConfig(bad);
    EXPECT_NE(s.message().find("shard_endpoint: \"10.0.0.1:0\""), absl::string_view::npos)
        << s.message();
  }
  {
    HostConfig bad = c;
    bad.shard_listen = "0.0.0.0";
    auto s = ValidateHostConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("shard_listen: \"0.0.0.0\""), absl::string_view::npos)
        << s.message();
    bad.shard_listen = "127.0.0.1:0";  // any free port: allowed, the bound one is in shard.addr
    EXPECT_TRUE(ValidateHostConfig(bad).ok());
  }
  {
    HostConfig bad = c;
    bad.stats_listen = "localhost";
    auto s = ValidateHostConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("stats_listen: \"localhost\""), absl::string_view::npos)
        << s.message();
    bad.stats_listen = "";  // not served
    EXPECT_TRUE(ValidateHostConfig(bad).ok());
  }
  {
    HostConfig bad = c;
    bad.artifacts_dir = "rel/artifacts";
    auto s = ValidateHostConfig(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("artifacts_dir: \"rel/artifacts\" is not absolute"),
              absl::string_view::npos)
        << s.message();
  }
  {
    HostConfig v6 = c;
    v6.shard_endpoint = "[2001:db8::1]:7443";
    EXPECT_EQ(ShardListenAddress(v6), "0.0.0.0:7443");
  }
  {
    HostConfig bad = c;
    bad.log_level = "loud";
    auto s = ValidateHostConfig(bad);
    EXPECT_NE(s.message().find("log_level: \"loud\""), absl::string_view::npos) << s.message();
  }
}

TEST(ConfigTest, HostPort) {
  EXPECT_TRUE(CheckHostPort("k", "127.0.0.1:1", 1).ok());
  EXPECT_TRUE(CheckHostPort("k", "localhost:65535", 1).ok());
  EXPECT_TRUE(CheckHostPort("k", "[::1]:9000", 1).ok());
  EXPECT_TRUE(CheckHostPort("k", "127.0.0.1:0", 0).ok());
  EXPECT_FALSE(CheckHostPort("k", "127.0.0.1:0", 1).ok());
  EXPECT_FALSE(CheckHostPort("k", "127.0.0.1", 1).ok());
  EXPECT_FALSE(CheckHostPort("k", ":9000", 1).ok());
  EXPECT_FALSE(CheckHostPort("k", "host:65536", 1).ok());
  EXPECT_FALSE(CheckHostPort("k", "host:+80", 1).ok());
  EXPECT_FALSE(CheckHostPort("k", "host:8x", 1).ok());
  EXPECT_FALSE(CheckHostPort("k", "::1:9000", 1).ok());
  EXPECT_FALSE(CheckHostPort("k", "a b:9000", 1).ok());
}

TEST(ConfigTest, OverridesReplaceFileValues) {
  HostConfig c = MustParse(kMinimal);
  HostConfigOverrides o;
  o.data_dir = "/other";
  o.listen = "127.0.0.1:7777";
  o.log_level = "warn";
  ApplyOverrides(o, &c);
  EXPECT_EQ(c.data_dir, "/other");
  EXPECT_EQ(c.listen, "127.0.0.1:7777");
  EXPECT_EQ(c.log_level, "warn");
  EXPECT_EQ(c.key_file, "/tmp/k");  // not overridden
  EXPECT_EQ(c.chain_endpoint, "127.0.0.1:9090");
}

TEST(ConfigTest, LoadFile) {
  EXPECT_EQ(LoadHostConfigFile("/nonexistent/trainshardd.toml").status().code(),
            absl::StatusCode::kNotFound);
  char dir_template[] = "/tmp/ts-config-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string path = std::string(dir_template) + "/c.toml";
  {
    std::ofstream out(path);
    out << kMinimal;
  }
  auto c = LoadHostConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard_endpoint, "10.0.0.1:7000");
  EXPECT_EQ(LoadHostConfigFile(dir_template).status().code(), absl::StatusCode::kInvalidArgument);
  unlink(path.c_str());
  rmdir(dir_template);
}

TEST(ConfigTest, ExampleConfigParsesAndValidates) {
  auto c = LoadHostConfigFile(std::string(TS_SOURCE_DIR) + "/deploy/trainshardd.example.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ValidateHostConfig(*c).ok());
  EXPECT_EQ(c->policy.hardware_profiles, std::vector<std::string>{"cpu-small"});
}

TEST(ConfigTest, GonkaV0Profile) {
  HostConfig c = MustParse(std::string(kMinimal) + R"(
chain_profile = "gonka-v0"
chain_rpc_endpoint = "127.0.0.1:26657"
[gonka_v0]
node_ids = ["node-1", "node-2"]
refresh_every_blocks = 50
)");
  EXPECT_EQ(c.chain_profile, "gonka-v0");
  EXPECT_EQ(c.gonka_v0.node_ids, (std::vector<std::string>{"node-1", "node-2"}));
  EXPECT_EQ(c.gonka_v0.refresh_every_blocks, 50);
  EXPECT_TRUE(ValidateHostConfig(c).ok());
  EXPECT_EQ(MustParse(kMinimal).chain_profile, "trainshard");

  ExpectBad("chain_profile = \"cosmos\"\n", {"chain_profile", "\"cosmos\"", "gonka-v0"});
  ExpectBad("[gonka_v0]\nnode_ids = [\"a\", \"a\"]\n", {"gonka_v0.node_ids[1]", "twice"});
  ExpectBad("[gonka_v0]\nnode_ids = [\"\"]\n", {"gonka_v0.node_ids[0]"});
  ExpectBad("[gonka_v0]\nrefresh_every_blocks = 0\n", {"gonka_v0.refresh_every_blocks", "0"});
  ExpectBad("[gonka_v0]\nttl = 3\n", {"gonka_v0.ttl", "unknown key"});
  // The profile needs the nodes it offers.
  HostConfig none = MustParse(std::string(kMinimal) + "chain_profile = \"gonka-v0\"\n");
  absl::Status valid = ValidateHostConfig(none);
  EXPECT_EQ(valid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(valid.message().find("gonka_v0.node_ids"), absl::string_view::npos) << valid;
  // And the node's JSON-RPC for the events.
  c.chain_rpc_endpoint.clear();
  valid = ValidateHostConfig(c);
  EXPECT_EQ(valid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(valid.message().find("chain_rpc_endpoint"), absl::string_view::npos) << valid;
}

}  // namespace
}  // namespace ts::sidecar
