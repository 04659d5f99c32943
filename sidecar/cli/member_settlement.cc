#include "sidecar/cli/member_settlement.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/protocol.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "proto/deterministic.h"
#include "proto/grpc_status.h"
#include "sidecar/peer/peer_tls.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

namespace {

constexpr int kMaxAnswerBytes = 4 << 20;
// Members asked at once: a slow or silent one costs its timeout once, not once per member
// before it.
constexpr size_t kMaxAsking = 16;

// What `m` signed, checked: NOT a settlement it did not sign itself for this chain and shard.
absl::StatusOr<pb::Settlement> AskMember(const SettlementMember& m, const std::string& chain_id,
                                         uint64_t shard_id, int64_t timeout_ms) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxAnswerBytes);
  auto stub = pb::SettlementQuery::NewStub(
      grpc::CreateCustomChannel(m.endpoint, PeerChannelCredentials(m.tls_cert_sha256), args));
  pb::GetSettlementRequest request;
  request.set_shard_id(shard_id);
  pb::GetSettlementResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  absl::Status called = FromGrpcStatus(stub->GetSettlement(&context, request, &response));
  if (!called.ok()) return called;
  const pb::Settlement& s = response.settlement();
  if (s.chain_id() != chain_id || s.shard_id() != shard_id) {
    return absl::PermissionDeniedError(absl::StrCat("answered a settlement of chain \"",
                                                    s.chain_id().substr(0, 64), "\" shard ",
                                                    s.shard_id()));
  }
  auto signer =
      common::RecoverStatementSigner(protocol::kSignSettlement, chain_id, shard_id,
                                     DeterministicBytes(s), response.signature().signature());
  if (!signer.ok() || *signer != m.address || response.signature().host() != m.address) {
    return absl::PermissionDeniedError(
        absl::StrCat("answered a settlement it did not sign (signer ",
                     signer.ok() ? *signer : std::string(signer.status().message()), ")"));
  }
  return s;
}

}  // namespace

absl::StatusOr<pb::Settlement> SettlementFromMembers(const std::vector<SettlementMember>& members,
                                                     const std::string& chain_id, uint64_t shard_id,
                                                     int64_t timeout_ms) {
  unsigned __int128 total = 0;
  for (const auto& m : members) total += m.weight;
  if (members.empty() || total == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_id, " has no member weight to settle by"));
  }
  struct Tally {
    pb::Settlement settlement;
    unsigned __int128 weight = 0;
  };
  std::vector<absl::StatusOr<pb::Settlement>> asked(members.size(),
                                                    absl::UnknownError("not asked"));
  {
    std::atomic<size_t> next{0};
    std::vector<std::thread> askers;
    for (size_t a = 0; a < std::min(members.size(), kMaxAsking); ++a) {
      askers.emplace_back([&] {
        for (size_t i = next++; i < members.size(); i = next++) {
          asked[i] = AskMember(members[i], chain_id, shard_id, timeout_ms);
        }
      });
    }
    for (std::thread& t : askers) t.join();
  }
  std::map<std::string, Tally> by_bytes;  // canonical bytes -> who signed them
  std::vector<std::string> answers;
  for (size_t i = 0; i < members.size(); ++i) {
    const SettlementMember& m = members[i];
    const absl::StatusOr<pb::Settlement>& s = asked[i];
    if (!s.ok()) {
      answers.push_back(absl::StrCat(m.address, ": ", s.status().ToString()));
      continue;
    }
    Tally& t = by_bytes[DeterministicBytes(*s)];
    t.settlement = *s;
    t.weight += m.weight;
    answers.push_back(absl::StrCat(m.address, ": root ",
                                   common::HexEncode(s->final_checkpoint_root()).substr(0, 16)));
  }
  for (const auto& [bytes, t] : by_bytes) {
    if (protocol::IsQuorum(t.weight, total)) return t.settlement;
  }
  unsigned __int128 best = 0;
  for (const auto& [bytes, t] : by_bytes) best = std::max(best, t.weight);
  return absl::FailedPreconditionError(absl::StrCat(
      "shard ", shard_id, ": no settlement is signed by members holding more than 2/3 of the ",
      static_cast<uint64_t>(total), " weight (at most ", static_cast<uint64_t>(best),
      " agree): ", absl::StrJoin(answers, "; ")));
}

}  // namespace ts::sidecar
