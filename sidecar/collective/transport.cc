#include "sidecar/collective/transport.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"

namespace ts::sidecar {
namespace {

constexpr char kFailedPeerTypeUrl[] = "type.googleapis.com/ts.collective.FailedPeer";
constexpr std::string_view kMeshIdDomain = "gonka-trainshard/v1/collective_mesh";

void AppendBe32(std::string* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void AppendBe64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

absl::Status ValidateGroup(const GroupSpec& group) {
  const size_t n = group.members.size();
  if (n < 2 || n > kMaxGroupMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.members: ", n, " members, want 2..", kMaxGroupMembers));
  }
  absl::flat_hash_set<std::string_view> seen;
  for (size_t i = 0; i < n; ++i) {
    const GroupMember& m = group.members[i];
    if (m.address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("group.members[", i, "].address: empty"));
    }
    if (m.endpoint.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("group.members[", i, "].endpoint: empty (member ", m.address, ")"));
    }
    if (!m.tls_cert_sha256.empty() && m.tls_cert_sha256.size() != common::kSha256Size) {
      return absl::InvalidArgumentError(
          absl::StrCat("group.members[", i, "].tls_cert_sha256: ", m.tls_cert_sha256.size(),
                       " bytes, want 0 or ", common::kSha256Size));
    }
    if (!seen.insert(m.address).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("group.members[", i, "].address: ", m.address, " appears twice"));
    }
  }
  return absl::OkStatus();
}

std::string MeshIdOf(const GroupSpec& group) {
  std::string bytes(kMeshIdDomain);
  AppendBe64(&bytes, group.shard_id);
  AppendBe64(&bytes, group.session);
  AppendBe32(&bytes, static_cast<uint32_t>(group.members.size()));
  for (const GroupMember& m : group.members) {
    AppendBe32(&bytes, static_cast<uint32_t>(m.address.size()));
    bytes.append(m.address);
    AppendBe32(&bytes, static_cast<uint32_t>(m.endpoint.size()));
    bytes.append(m.endpoint);
  }
  return common::Sha256(bytes);
}

absl::Status PeerFailure(absl::StatusCode code, std::string_view address,
                         std::string_view message) {
  absl::Status status(
      code, absl::StrCat("peer ", common::AsAbsl(address), ": ", common::AsAbsl(message)));
  status.SetPayload(kFailedPeerTypeUrl, absl::Cord(common::AsAbsl(address)));
  return status;
}

std::string FailedPeerOf(const absl::Status& status) {
  auto payload = status.GetPayload(kFailedPeerTypeUrl);
  if (!payload.has_value()) return "";
  return std::string(*payload);
}

}  // namespace ts::sidecar
