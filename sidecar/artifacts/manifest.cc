#include "sidecar/artifacts/manifest.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/status.h"
#include "proto/deterministic.h"
#include "sidecar/artifacts/safe_fs.h"

namespace ts::sidecar {
namespace {

constexpr size_t kMaxChainIdBytes = 64;  // as SignBytes
constexpr size_t kMaxKindBytes = 32;
constexpr size_t kMaxPublisherBytes = 128;
// How much of an untrusted string an error message quotes.
constexpr size_t kQuotedBytesMax = 96;

std::string Quote(std::string_view s) {
  if (s.size() <= kQuotedBytesMax)
    return absl::StrCat("\"", absl::CHexEscape(common::AsAbsl(s)), "\"");
  return absl::StrCat("\"", absl::CHexEscape(common::AsAbsl(s.substr(0, kQuotedBytesMax))),
                      "\"... (", s.size(), " bytes)");
}

std::string Hex(std::string_view bytes) { return common::HexEncode(bytes); }

// Root of hashes[begin, end), end - begin >= 1. One hasher serves the whole tree (it resets on
// Finish, and both children are finished before their parent is fed), so a root over 400,000
// chunks costs no allocation per node.
template <typename Hashes>
std::string MerkleRange(const Hashes& hashes, size_t begin, size_t end,
                        common::Sha256Hasher* hasher) {
  const size_t n = end - begin;
  if (n == 1) {
    hasher->Update(std::string_view("\x00", 1));
    hasher->Update(hashes[static_cast<int>(begin)]);
    return hasher->Finish();
  }
  size_t split = 1;
  while (split * 2 < n) split *= 2;  // the largest power of two strictly below n
  const std::string left = MerkleRange(hashes, begin, begin + split, hasher);
  const std::string right = MerkleRange(hashes, begin + split, end, hasher);
  hasher->Update(std::string_view("\x01", 1));
  hasher->Update(left);
  hasher->Update(right);
  return hasher->Finish();
}

const std::string& EmptyRoot() {
  static const std::string* const root = new std::string(common::Sha256(""));
  return *root;
}

template <typename Hashes>
std::string MerkleOf(const Hashes& hashes, size_t n) {
  if (n == 0) return EmptyRoot();
  common::Sha256Hasher hasher;
  return MerkleRange(hashes, 0, n, &hasher);
}

bool ValidKind(std::string_view kind) {
  if (kind.empty() || kind.size() > kMaxKindBytes) return false;
  for (char c : kind) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(field), ": ", common::AsAbsl(why)));
}

}  // namespace

std::string MerkleRoot(const std::vector<std::string>& hashes) {
  return MerkleOf(hashes, hashes.size());
}

std::string EncodeManifestBody(const pb::ManifestBody& body) { return DeterministicBytes(body); }

std::string ArtifactId(std::string_view body_bytes) {
  common::Sha256Hasher hasher;
  hasher.Update(kArtifactIdDomain);
  hasher.Update(std::string_view("\x00", 1));
  hasher.Update(body_bytes);
  return hasher.Finish();
}

absl::Status CheckManifestBody(const pb::ManifestBody& body) {
  if (body.version() != kManifestVersion) {
    return Invalid("version", absl::StrCat(body.version(), " is not ", kManifestVersion));
  }
  if (body.chain_id().empty()) return Invalid("chain_id", "is empty");
  if (body.chain_id().size() > kMaxChainIdBytes) {
    return Invalid("chain_id", absl::StrCat(Quote(body.chain_id()), " is longer than ",
                                            kMaxChainIdBytes, " bytes"));
  }
  if (!ValidKind(body.kind())) {
    return Invalid("kind", absl::StrCat(Quote(body.kind()), " is not [a-z0-9-]{1,32}"));
  }
  if (!body.parent().empty() && body.parent().size() != common::kSha256Size) {
    return Invalid("parent",
                   absl::StrCat(body.parent().size(), " bytes, want 0 or ", common::kSha256Size));
  }
  if (body.publisher().empty()) return Invalid("publisher", "is empty");
  if (body.publisher().size() > kMaxPublisherBytes) {
    return Invalid("publisher", absl::StrCat(Quote(body.publisher()), " is longer than ",
                                             kMaxPublisherBytes, " bytes"));
  }
  const uint32_t chunk_size = body.chunk_size();
  if (chunk_size < kMinChunkSize || chunk_size > kMaxChunkSize) {
    return Invalid("chunk_size", absl::StrCat(chunk_size, " is outside [", kMinChunkSize, ", ",
                                              kMaxChunkSize, "]"));
  }
  if (static_cast<size_t>(body.files_size()) > kMaxManifestFiles) {
    return Invalid("files",
                   absl::StrCat(body.files_size(), " files, more than ", kMaxManifestFiles));
  }

  // Structure and counts first, so the hashing below is bounded by the caps.
  absl::flat_hash_set<std::string_view> names;
  names.reserve(static_cast<size_t>(body.files_size()));
  uint64_t total_chunks = 0;
  for (int i = 0; i < body.files_size(); ++i) {
    const pb::ManifestFile& file = body.files(i);
    // The field name is only built for an error: a manifest may list 100,000 files.
    if (!ValidateArtifactName("name", file.name()).ok()) {
      return ValidateArtifactName(absl::StrCat("files[", i, "].name"), file.name());
    }
    auto field = [i] { return absl::StrCat("files[", i, "]"); };
    if (i > 0) {
      const std::string& prev = body.files(i - 1).name();
      if (file.name() == prev) {
        return Invalid(absl::StrCat(field(), ".name"),
                       absl::StrCat(Quote(file.name()), " appears twice (files[", i - 1, "])"));
      }
      if (file.name() < prev) {
        return Invalid(absl::StrCat(field(), ".name"),
                       absl::StrCat(Quote(file.name()), " sorts before files[", i - 1, "] ",
                                    Quote(prev), " (files must be sorted by name)"));
      }
    }
    // Sorted order puts "a" before "a/b", so every directory prefix of a name that is also a
    // file name has been seen already.
    for (size_t slash = file.name().find('/'); slash != std::string::npos;
         slash = file.name().find('/', slash + 1)) {
      const std::string_view dir = std::string_view(file.name()).substr(0, slash);
      if (names.contains(dir)) {
        return Invalid(absl::StrCat(field(), ".name"),
                       absl::StrCat(Quote(file.name()), " is inside ", Quote(dir),
                                    ", which is a file of this manifest"));
      }
    }
    names.insert(file.name());

    const uint64_t size = file.size();
    const uint64_t want_chunks = size / chunk_size + (size % chunk_size != 0 ? 1 : 0);
    if (static_cast<uint64_t>(file.chunks_size()) != want_chunks) {
      return Invalid(absl::StrCat(field(), ".chunks"),
                     absl::StrCat(file.chunks_size(), " chunks, but size ", size,
                                  " with chunk_size ", chunk_size, " needs ", want_chunks));
    }
    total_chunks += want_chunks;
    if (total_chunks > kMaxManifestChunks) {
      return Invalid("files", absl::StrCat("more than ", kMaxManifestChunks, " chunks in all (",
                                           total_chunks, " by files[", i, "])"));
    }
    for (int c = 0; c < file.chunks_size(); ++c) {
      if (file.chunks(c).size() != common::kSha256Size) {
        return Invalid(absl::StrCat(field(), ".chunks[", c, "]"),
                       absl::StrCat(file.chunks(c).size(), " bytes, want ", common::kSha256Size));
      }
    }
    if (file.root().size() != common::kSha256Size) {
      return Invalid(absl::StrCat(field(), ".root"),
                     absl::StrCat(file.root().size(), " bytes, want ", common::kSha256Size));
    }
  }

  std::vector<std::string> file_roots;
  file_roots.reserve(static_cast<size_t>(body.files_size()));
  for (int i = 0; i < body.files_size(); ++i) {
    const pb::ManifestFile& file = body.files(i);
    std::string root = MerkleOf(file.chunks(), static_cast<size_t>(file.chunks_size()));
    if (root != file.root()) {
      return Invalid(absl::StrCat("files[", i, "].root"),
                     absl::StrCat(Hex(file.root()), " is not the Merkle root of its chunks (",
                                  Hex(root), ")"));
    }
    file_roots.push_back(std::move(root));
  }
  const std::string files_root = MerkleRoot(file_roots);
  if (body.files_root() != files_root) {
    return Invalid("files_root", absl::StrCat(Hex(body.files_root()),
                                              " is not the Merkle root of the files' roots (",
                                              Hex(files_root), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pb::Manifest> SignManifest(const common::PrivateKey& key, pb::ManifestBody body) {
  body.set_version(kManifestVersion);
  const std::string signer = common::AddressFromPublicKey(key.public_key());
  if (body.publisher().empty()) body.set_publisher(signer);
  if (body.publisher() != signer) {
    return Invalid("publisher", absl::StrCat(Quote(body.publisher()),
                                             " is not the signing key's address ", signer));
  }
  std::vector<std::string> file_roots;
  file_roots.reserve(static_cast<size_t>(body.files_size()));
  for (pb::ManifestFile& file : *body.mutable_files()) {
    if (file.root().empty()) {
      file.set_root(MerkleOf(file.chunks(), static_cast<size_t>(file.chunks_size())));
    }
    file_roots.push_back(file.root());
  }
  body.set_files_root(MerkleRoot(file_roots));
  TS_RETURN_IF_ERROR(CheckManifestBody(body));
  const std::string body_bytes = EncodeManifestBody(body);
  if (body_bytes.size() > kMaxManifestBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("manifest body: ", body_bytes.size(),
                                                     " bytes, more than ", kMaxManifestBytes));
  }
  const std::string id = ArtifactId(body_bytes);
  TS_ASSIGN_OR_RETURN(
      std::string signature,
      common::SignStatement(key, kArtifactSignKind, body.chain_id(), body.shard_id(), id));
  pb::Manifest manifest;
  manifest.set_body(body_bytes);
  manifest.set_signature(std::move(signature));
  return manifest;
}

absl::StatusOr<VerifiedManifest> VerifyManifest(const pb::Manifest& manifest,
                                                std::string_view chain_id, uint64_t shard_id,
                                                std::string_view expected_id) {
  const size_t encoded_bytes = manifest.ByteSizeLong();
  if (encoded_bytes > kMaxManifestBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("manifest: ", encoded_bytes, " bytes, more than ", kMaxManifestBytes));
  }
  VerifiedManifest out;
  const std::string& body_bytes = manifest.body();
  if (!out.body.ParseFromString(body_bytes)) {
    return absl::InvalidArgumentError("manifest.body: does not parse as a ManifestBody");
  }
  // Deterministic serialization re-emits unknown fields, so they are dropped before the
  // comparison: a body carrying any is not canonical.
  out.body.DiscardUnknownFields();
  const std::string reencoded = EncodeManifestBody(out.body);
  if (reencoded != body_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest.body: not canonical (", body_bytes.size(), " bytes re-encode to ",
        reencoded.size(),
        " other bytes: fields out of order, unknown fields or default values written)"));
  }
  TS_RETURN_IF_ERROR(CheckManifestBody(out.body));
  if (out.body.chain_id() != chain_id) {
    return absl::PermissionDeniedError(absl::StrCat(
        "manifest chain_id: ", Quote(out.body.chain_id()), " is not ", Quote(chain_id)));
  }
  if (out.body.shard_id() != shard_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("manifest shard_id: ", out.body.shard_id(), " is not ", shard_id));
  }
  out.id = ArtifactId(body_bytes);
  if (!expected_id.empty() && out.id != expected_id) {
    return absl::DataLossError(absl::StrCat("manifest: artifact id ", Hex(out.id),
                                            " is not the one asked for (", Hex(expected_id), ")"));
  }
  auto signer = common::RecoverStatementSigner(kArtifactSignKind, out.body.chain_id(),
                                               out.body.shard_id(), out.id, manifest.signature());
  if (!signer.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat("manifest.signature: ", signer.status().message()));
  }
  if (*signer != out.body.publisher()) {
    return absl::UnauthenticatedError(absl::StrCat("manifest.signature: signed by ", *signer,
                                                   ", not by the publisher ",
                                                   Quote(out.body.publisher())));
  }
  for (const pb::ManifestFile& file : out.body.files()) {
    out.total_bytes += file.size();
    out.total_chunks += static_cast<uint32_t>(file.chunks_size());
  }
  out.manifest = manifest;
  return out;
}

absl::StatusOr<VerifiedManifest> VerifyManifestBytes(std::string_view bytes,
                                                     std::string_view chain_id, uint64_t shard_id,
                                                     std::string_view expected_id) {
  if (bytes.size() > kMaxManifestBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("manifest: ", bytes.size(), " bytes, more than ", kMaxManifestBytes));
  }
  pb::Manifest manifest;
  if (!manifest.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("manifest: does not parse as a Manifest");
  }
  return VerifyManifest(manifest, chain_id, shard_id, expected_id);
}

absl::StatusOr<std::string> ParseArtifactId(std::string_view field, std::string_view hex) {
  if (hex.size() != 2 * common::kSha256Size) {
    return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(field), ": ", Quote(hex),
                                                   " is not a 64-character hex artifact id"));
  }
  auto bytes = common::HexDecode(hex);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(common::AsAbsl(field), ": ", Quote(hex),
                                                   " is not a 64-character hex artifact id"));
  }
  return *std::move(bytes);
}

}  // namespace ts::sidecar
