// Fuzz target: artifact manifests and artifact file names, both of which arrive from peers. The
// input is decoded as a serialized Manifest and verified (for the chain and shard its own body
// names, so a signed seed reaches the signature check, and for fixed ones), and is also checked
// as a file name. Whatever is accepted must satisfy what the rest of the store relies on:
// canonical bytes, the id, the caps, valid names; whatever is refused must be refused with one
// of the documented codes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/status.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/artifacts/manifest.h"
#include "sidecar/artifacts/safe_fs.h"

namespace {

namespace pb = ::gonka::trainshard::v1;
using ts::sidecar::ValidateArtifactName;

void CheckName(std::string_view name) {
  const absl::Status status = ValidateArtifactName("name", name);
  if (!status.ok()) {
    TS_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  TS_CHECK(!name.empty() && name.size() <= ts::sidecar::kMaxArtifactNameBytes);
  TS_CHECK(name.front() != '/' && name.back() != '/');
  TS_CHECK(name.find("//") == std::string_view::npos);
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    TS_CHECK(u > 0x20 && u < 0x7f && c != '\\' && c != '%');
  }
  // No "." or ".." component anywhere.
  const std::string padded = "/" + std::string(name) + "/";
  TS_CHECK(padded.find("/../") == std::string::npos);
  TS_CHECK(padded.find("/./") == std::string::npos);
}

bool DocumentedRefusal(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnauthenticated:
      return true;
    default:
      return false;
  }
}

void CheckManifest(std::string_view bytes, const std::string& chain_id, uint64_t shard_id) {
  auto verified = ts::sidecar::VerifyManifestBytes(bytes, chain_id, shard_id, "");
  if (!verified.ok()) {
    TS_CHECK(DocumentedRefusal(verified.status()));
    return;
  }
  TS_CHECK(bytes.size() <= ts::sidecar::kMaxManifestBytes);
  const pb::Manifest& manifest = verified->manifest;
  TS_CHECK(verified->id == ts::sidecar::ArtifactId(manifest.body()));
  TS_CHECK(ts::sidecar::EncodeManifestBody(verified->body) == manifest.body());
  TS_CHECK(ts::sidecar::CheckManifestBody(verified->body).ok());
  TS_CHECK(verified->body.chain_id() == chain_id && verified->body.shard_id() == shard_id);
  TS_CHECK(static_cast<size_t>(verified->body.files_size()) <= ts::sidecar::kMaxManifestFiles);
  TS_CHECK(verified->total_chunks <= ts::sidecar::kMaxManifestChunks);
  uint64_t total_bytes = 0;
  for (const pb::ManifestFile& file : verified->body.files()) {
    TS_CHECK(ValidateArtifactName("file", file.name()).ok());
    total_bytes += file.size();
  }
  TS_CHECK(total_bytes == verified->total_bytes);

  // The same manifest asked for by its own id passes; by another id, or for another shard, not.
  TS_CHECK(ts::sidecar::VerifyManifest(manifest, chain_id, shard_id, verified->id).ok());
  std::string other_id = verified->id;
  other_id[0] = static_cast<char>(other_id[0] ^ 1);
  TS_CHECK(ts::sidecar::VerifyManifest(manifest, chain_id, shard_id, other_id).status().code() ==
           absl::StatusCode::kDataLoss);
  TS_CHECK(ts::sidecar::VerifyManifest(manifest, chain_id, shard_id + 1, "").status().code() ==
           absl::StatusCode::kPermissionDenied);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  CheckName(input);

  // The chain and shard the body claims, so the deeper checks are reached.
  std::string chain_id = "gonka-devnet";
  uint64_t shard_id = 1;
  pb::Manifest manifest;
  pb::ManifestBody body;
  if (size <= ts::sidecar::kMaxManifestBytes &&
      manifest.ParseFromArray(data, static_cast<int>(size)) &&
      body.ParseFromString(manifest.body())) {
    chain_id = body.chain_id();
    shard_id = body.shard_id();
  }
  CheckManifest(input, chain_id, shard_id);
  CheckManifest(input, "gonka-devnet", 1);
  return 0;
}
