// Artifact manifests: building, canonical encoding, Merkle roots, the artifact id, signing and
// the checks a receiver runs on a manifest it did not write. Layout and rationale:
// docs/artifacts.md.
//
//   chunk hash   = SHA-256(chunk bytes)
//   file root    = MerkleRoot(chunk hashes)      (empty file: MerkleRoot({}))
//   files_root   = MerkleRoot(file roots, in file order)
//   artifact id  = SHA-256("gonka-trainshard/v1/artifact-manifest" || 0x00 || body bytes)
//   signature    = SignStatement(key, "artifact", chain_id, shard_id, artifact id)
//
// MerkleRoot (RFC 6962 shape, domain-separated): leaf = SHA-256(0x00 || h), node =
// SHA-256(0x01 || left || right), split at the largest power of two below n; the root of zero
// hashes is SHA-256("") .
//
// Thread-safety: pure functions; thread-safe.
#ifndef TS_SIDECAR_ARTIFACTS_MANIFEST_H_
#define TS_SIDECAR_ARTIFACTS_MANIFEST_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "common/protocol.h"
#include "gonka/trainshard/v1/shard.pb.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

inline constexpr uint32_t kManifestVersion = 1;
inline constexpr uint32_t kDefaultChunkSize = 1u << 20;  // 1 MiB
inline constexpr uint32_t kMinChunkSize = 4u << 10;      // 4 KiB
inline constexpr uint32_t kMaxChunkSize = 4u << 20;      // 4 MiB
// Caps on what a manifest may describe; a manifest over them is refused before it is parsed
// further (the encoded size is checked first).
inline constexpr size_t kMaxManifestBytes = 16u << 20;
inline constexpr size_t kMaxManifestFiles = 100000;
inline constexpr size_t kMaxManifestChunks = 400000;
inline constexpr std::string_view kArtifactIdDomain = "gonka-trainshard/v1/artifact-manifest";
inline constexpr std::string_view kArtifactSignKind = protocol::kSignArtifact;

std::string MerkleRoot(const std::vector<std::string>& hashes);

// Canonical body bytes (deterministic serialization). The caller has sorted files by name.
std::string EncodeManifestBody(const pb::ManifestBody& body);
std::string ArtifactId(std::string_view body_bytes);

// Fills files_root and version, checks the body (as CheckManifestBody), encodes and signs it.
// INVALID_ARGUMENT as CheckManifestBody; the signing errors of SignStatement.
absl::StatusOr<pb::Manifest> SignManifest(const common::PrivateKey& key, pb::ManifestBody body);

// A manifest after every check a receiver needs.
struct VerifiedManifest {
  std::string id;  // 32 bytes
  pb::ManifestBody body;
  pb::Manifest manifest;
  uint64_t total_bytes = 0;
  uint32_t total_chunks = 0;
};

// Structural checks on a decoded body: version; chain_id non-empty; kind [a-z0-9-]{1,32};
// parent empty or 32 bytes; publisher non-empty; chunk_size in [kMinChunkSize, kMaxChunkSize];
// files ≤ kMaxManifestFiles, strictly sorted by name, unique, each name valid
// (ValidateArtifactName), no name that is also a directory prefix of another ("a" and "a/b");
// chunk count = ceil(size / chunk_size) and every hash 32 bytes; total chunks ≤
// kMaxManifestChunks; each file root and files_root equal to the recomputed Merkle roots.
// INVALID_ARGUMENT naming the field (e.g. `files[3].chunks[7]`) and value.
absl::Status CheckManifestBody(const pb::ManifestBody& body);

// Decodes and checks a manifest from a peer or from disk:
// - encoded size of manifest ≤ kMaxManifestBytes (RESOURCE_EXHAUSTED otherwise, before parsing);
// - body parses and re-encodes to the same bytes (INVALID_ARGUMENT "not canonical");
// - CheckManifestBody;
// - body.chain_id == chain_id and body.shard_id == shard_id (PERMISSION_DENIED);
// - if expected_id is non-empty, ArtifactId(body) == expected_id (DATA_LOSS: the peer sent
//   another manifest than the one asked for);
// - the signature recovers to body.publisher (UNAUTHENTICATED).
// Membership of the publisher is the caller's check (it needs the shard's members).
absl::StatusOr<VerifiedManifest> VerifyManifest(const pb::Manifest& manifest,
                                                std::string_view chain_id, uint64_t shard_id,
                                                std::string_view expected_id);
// Same, from serialized pb::Manifest bytes (size checked before parsing).
absl::StatusOr<VerifiedManifest> VerifyManifestBytes(std::string_view bytes,
                                                     std::string_view chain_id, uint64_t shard_id,
                                                     std::string_view expected_id);

// Parses a 64-character hex artifact id (either case). INVALID_ARGUMENT naming `field`.
absl::StatusOr<std::string> ParseArtifactId(std::string_view field, std::string_view hex);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_MANIFEST_H_
