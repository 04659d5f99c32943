#include "sidecar/shard/round_certificate.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crypto/signing.h"
#include "common/protocol.h"
#include "proto/deterministic.h"
#include "sidecar/shard/ledger.h"
#include "sidecar/shard/run_context.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

absl::StatusOr<std::string> PackBlock(const google::protobuf::MessageLite& m, size_t size) {
  std::string body = DeterministicBytes(m);
  if (body.size() + 4 > size) {
    return absl::InternalError(absl::StrCat("block of ", body.size(), " bytes exceeds ", size));
  }
  std::string out(size, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((body.size() >> (8 * (3 - i))) & 0xff);
  std::memcpy(out.data() + 4, body.data(), body.size());
  return out;
}

bool UnpackBlock(std::string_view block, google::protobuf::MessageLite* m) {
  if (block.size() < 4) return false;
  size_t n = 0;
  for (int i = 0; i < 4; ++i) n = (n << 8) | static_cast<unsigned char>(block[i]);
  if (n > block.size() - 4) return false;
  return m->ParseFromArray(block.data() + 4, static_cast<int>(n));
}

namespace {

// Whether `vote`'s evaluation (if any) is `who`'s own, signed, of the round's new root.
bool EvaluationCounts(std::string_view chain_id, uint64_t shard_id, const pb::RoundResult& result,
                      const std::string& who, const pb::SignedEvaluation& e) {
  auto signer = common::RecoverStatementSigner(kEvaluationSignKind, chain_id, shard_id,
                                               DeterministicBytes(e.result()), e.signature());
  return signer.ok() && *signer == who && e.result().host() == who &&
         e.result().checkpoint_root() == result.new_root() && e.result().round() == result.round();
}

}  // namespace

CountedVotes CountVotes(std::string_view chain_id, const ShardView& view,
                        const pb::RoundResult& result, uint32_t attempt,
                        const std::vector<std::string>& members, std::string_view gathered,
                        bool evaluate) {
  CountedVotes out;
  pb::RoundCertificate& cert = out.certificate;
  *cert.mutable_result() = result;
  cert.set_attempt(attempt);
  const uint64_t shard_id = result.shard_id();
  const uint64_t round = result.round();
  const std::string result_bytes = DeterministicBytes(result);
  std::vector<int64_t> losses;
  double train_loss = 0;
  int train_n = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    pb::RoundCertificate theirs;
    const std::string& who = members[i];
    const ShardMember* member = view.Find(who);
    if (member == nullptr || (i + 1) * kVoteBlockBytes > gathered.size() ||
        !UnpackBlock(gathered.substr(i * kVoteBlockBytes, kVoteBlockBytes), &theirs) ||
        theirs.signatures_size() != 1 || theirs.signatures(0).host() != who) {
      out.refused.push_back(
          absl::StrCat("round ", round, ": ", Short(who), " sent a malformed vote"));
      continue;
    }
    if (theirs.result().new_root() != result.new_root()) {
      out.refused.push_back(absl::StrCat("round ", round, ": ", Short(who), " reports root ",
                                         Hex8(theirs.result().new_root()), ", this host ",
                                         Hex8(result.new_root())));
      continue;
    }
    auto signer = common::RecoverStatementSigner(kRoundSignKind, chain_id, shard_id, result_bytes,
                                                 theirs.signatures(0).signature());
    if (!signer.ok() || *signer != who) {
      out.refused.push_back(absl::StrCat("round ", round, ": ", Short(who),
                                         "'s signature does not verify over this host's result"));
      continue;
    }
    *cert.add_signatures() = theirs.signatures(0);
    cert.set_signed_weight(cert.signed_weight() + member->weight);
    train_loss += theirs.train_loss();
    ++train_n;
    if (evaluate && theirs.evaluations_size() == 1 &&
        EvaluationCounts(chain_id, shard_id, result, who, theirs.evaluations(0))) {
      *cert.add_evaluations() = theirs.evaluations(0);
      losses.push_back(theirs.evaluations(0).result().loss_micro());
    }
  }
  cert.set_total_weight(TotalWeight(view));
  cert.set_eval_loss_micro(MedianOf(losses));
  cert.set_train_loss(train_n > 0 ? static_cast<float>(train_loss / train_n) : 0);
  out.evaluations = losses.size();
  return out;
}

}  // namespace ts::sidecar
