// Fuzz target: what the gonka-v0 client reads from a Gonka chain that other hosts wrote there
// (chain-bridge/client/gonka_v0_client.h): a Trainshard record, the endpoint URL a host published
// with its opt-in refresh, a proposal's base image. The first byte picks the parser; the rest is
// its input. Checks the translation's invariants: members' weights add up to the total, every
// pin is 32 bytes, and what parses prints back to what parses the same.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "chain-bridge/client/gonka_v0_client.h"
#include "common/status.h"
#include "inference/inference/trainshard.pb.h"

namespace {

namespace gv0 = ::inference::inference;
using ts::bridge::GonkaV0EndpointUrl;
using ts::bridge::ParseGonkaV0EndpointUrl;

void CheckShard(std::string_view bytes) {
  gv0::Trainshard shard;
  if (!shard.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  auto out = ts::bridge::ShardFromGonkaV0(shard);
  if (!out.ok()) {
    TS_CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
    TS_CHECK(shard.trainshard_id() == 0);
    return;
  }
  uint64_t total = 0;
  for (const auto& r : out->reservations()) {
    TS_CHECK(r.tls_cert_sha256().empty() || r.tls_cert_sha256().size() == 32);
    total += r.frozen_weight();
  }
  TS_CHECK(total == out->total_weight());
  TS_CHECK(out->spec().run_spec_hash().empty() || out->spec().run_spec_hash().size() == 32);
  TS_CHECK(static_cast<int>(out->spec().max_nodes()) <= shard.nodes_size());
}

void CheckUrl(std::string_view url) {
  auto parsed = ParseGonkaV0EndpointUrl(url);
  if (!parsed.ok()) {
    TS_CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  TS_CHECK(!parsed->endpoint.empty());
  TS_CHECK(parsed->tls_cert_sha256.empty() || parsed->tls_cert_sha256.size() == 32);
  for (bool tls : {false, true}) {
    auto again =
        ParseGonkaV0EndpointUrl(GonkaV0EndpointUrl(parsed->endpoint, parsed->tls_cert_sha256, tls));
    TS_CHECK(again.ok());
    TS_CHECK(again->endpoint == parsed->endpoint);
    TS_CHECK(again->tls_cert_sha256 == parsed->tls_cert_sha256);
  }
}

void CheckBaseImage(std::string_view image) {
  auto hash = ts::bridge::RunSpecHashFromBaseImage(image);
  if (!hash.ok()) {
    TS_CHECK(hash.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  TS_CHECK(hash->size() == 32);
  TS_CHECK(ts::bridge::RunSpecHashFromBaseImage(ts::bridge::RunSpecBaseImage(*hash)).value() ==
           *hash);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      CheckShard(input);
      break;
    case 1:
      CheckUrl(input);
      break;
    default:
      CheckBaseImage(input);
      break;
  }
  return 0;
}
