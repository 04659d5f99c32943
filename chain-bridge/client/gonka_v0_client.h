// The gonka-v0 chain profile on the client side (docs/gonka-v0.md): a ChainClient for a host
// sidecar pointed at a chain that runs Gonka's trainshards v0 instead of this project's module.
//
// It reads what any Cosmos node serves: the chain id and height from the tendermint Service, the
// minimum gas price from the node Service's Config, accounts, balances, txs, simulation and
// events (through block_results, so ChainClientOptions::rpc_target must be set) as
// GrpcChainClient does; it answers the shard queries from Gonka's
// `inference.inference.Query`, translated into the module's vocabulary the sidecar works in:
// a v0 trainshard is a RUNNING shard from its assembly on (v0 has no open or proposed phase),
// its members are the hosts of its ACTIVE reserved nodes with their frozen PoC weight summed
// per host, each member's endpoint and certificate pin come from the URL its host published
// with its opt-in refresh (GonkaV0EndpointUrl), and the run spec is pinned by the proposal's
// `base_image` digest (RunSpecBaseImage). What v0 does not have is answered as such: no
// escrow (zero), no settlement record, no module proposals. The PoC weights are still read
// through the module's query (a host's own weight, for its status only).
//
// Thread-safety: the client is thread-safe; the functions are pure.
#ifndef TS_CHAIN_BRIDGE_CLIENT_GONKA_V0_CLIENT_H_
#define TS_CHAIN_BRIDGE_CLIENT_GONKA_V0_CLIENT_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "chain-bridge/client/chain_client.h"
#include "inference/inference/trainshard.pb.h"

namespace ts::bridge {

// Which chain a client talks to: this project's module, or Gonka's trainshards v0.
enum class ChainProfile { kTrainshard, kGonkaV0 };

inline constexpr std::string_view kProfileTrainshard = "trainshard";
inline constexpr std::string_view kProfileGonkaV0 = "gonka-v0";

// "trainshard" or "gonka-v0"; INVALID_ARGUMENT naming `field` and the value otherwise.
absl::StatusOr<ChainProfile> ParseChainProfile(std::string_view field, std::string_view text);
std::string_view ChainProfileName(ChainProfile profile);

// The client for `profile`: NewGrpcChainClient, or the gonka-v0 client described above.
std::unique_ptr<ChainClient> NewChainClient(ChainProfile profile, const std::string& target,
                                            ChainClientOptions options = {});

// What a v0 shard has in place of the module's spec fields it lacks: an artifact quota per
// member store, and pay shared equally (of an escrow of zero: v0 pays through epoch rewards).
inline constexpr uint64_t kGonkaV0QuotaBytes = uint64_t{256} << 30;
inline constexpr uint64_t kGonkaV0QuotaFiles = 1'000'000;

// The module's view of a v0 trainshard (see the header comment). Nodes kicked or released are
// not members; a host's nodes count once each however many models they serve. A member's
// endpoint that does not parse leaves it with an empty endpoint (unreachable, still a member).
// INVALID_ARGUMENT for a shard id of 0.
absl::StatusOr<pb::Shard> ShardFromGonkaV0(const ::inference::inference::Trainshard& shard);

// The URL a host publishes with its opt-in refresh: "<scheme>://<endpoint>/tls-sha256/<hex>",
// https when its peer channels are TLS; the path pins its certificate (32 bytes) in a tx its
// own key signs. Gonka's endpoint rules accept it (no query, no fragment, no trailing slash).
std::string GonkaV0EndpointUrl(std::string_view endpoint, std::string_view tls_cert_sha256,
                               bool tls);

struct GonkaV0Endpoint {
  std::string endpoint;         // host:port
  std::string tls_cert_sha256;  // 32 bytes, or empty when the URL pins none
};
// Reads a URL GonkaV0EndpointUrl wrote (or any http(s)://host:port[/path] without a pin).
// INVALID_ARGUMENT naming the URL for another scheme, a missing port or a bad pin.
absl::StatusOr<GonkaV0Endpoint> ParseGonkaV0EndpointUrl(std::string_view url);

// The ngonka price in a node's Config minimum_gas_price ("0.002000000000000000ngonka", DecCoins
// joined by commas): "0.002000000000000000"; "" when it names none. INVALID_ARGUMENT naming the
// field for an amount ParseGasPrice refuses.
absl::StatusOr<std::string> GasPriceFromNodeConfig(std::string_view minimum_gas_price);

// A run spec pinned by a v0 proposal's base_image: "trainshard-run@sha256:<64 lowercase hex>".
inline constexpr std::string_view kRunSpecImageRepository = "trainshard-run";
std::string RunSpecBaseImage(std::string_view run_spec_hash);
// The 32-byte digest of "<repository>@sha256:<64 hex>", any repository; INVALID_ARGUMENT
// naming the value otherwise.
absl::StatusOr<std::string> RunSpecHashFromBaseImage(std::string_view base_image);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_CLIENT_GONKA_V0_CLIENT_H_
