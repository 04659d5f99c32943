// Verdicts on replayed work and what follows from them (docs/verification.md "Verdicts"), as
// pure functions and plain state. A validator signs the outcome of each replay it ran
// (SignVerdict); its announces carry the verdict to a later round's planner, the plan carries it
// into that round's result, and the round's certificate fixes it. A verdict that a member failed
// calls on every other member to replay the same round and sign its own verdict. VerdictTally
// reads the certificates in round order and judges each accused contribution by the weight
// behind its verdicts: confirmed when validators holding more than 2/3 of the other members'
// weight (and more than 1/3 of the shard's) found that it does not reproduce, rejected when
// more than 2/3 of the weight of the members other than it and its accuser (and more than 1/3
// of the shard's) found that it does. A confirmed
// failure marks its member; a rejected verdict marks its validator, and so does a passing
// verdict on a confirmed failure. Marks raise the member's replay rate and, past the spec's
// limit, leave the host out of later plans. Every host reads the same certificates and reaches
// the same judgements, so no one has to be trusted to judge.
//
// Thread-safety: pure functions; a VerdictTally is its owner's (the run thread's, under the
// run's lock where the gRPC handlers read it).
#ifndef TS_SIDECAR_SHARD_VERDICTS_H_
#define TS_SIDECAR_SHARD_VERDICTS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/peer/shard_directory.h"

namespace ts::sidecar {

// A verdict about round r rides in a plan of round r + 1 .. r + kVerdictRounds; later it is
// dropped (the members may no longer hold the round's base to replay it).
inline constexpr uint64_t kVerdictRounds = 4;
inline constexpr int kVerdictsPerAnnounceMax = 16;
inline constexpr int kVerdictsPerPlanMax = 64;

// The rounds of a run of `rounds` whose failures its certificates can still confirm, and so the
// rounds a settlement pays tokens for (docs/verification.md "Pay"): a round's drawn verdict
// rides in the next round's certificate and the others' replays of a failure it found in the
// one after, so with replays the last two rounds' checks never land — they pay nobody, and what
// the escrow holds is shared by the rounds before. All rounds without replays, or of a run of
// at most two rounds (too short to check anything: pay for it trusts the members).
constexpr uint64_t PaidRounds(uint32_t replay_rate_bps, uint64_t rounds) {
  constexpr uint64_t kUnconfirmableTail = 2;
  return replay_rate_bps > 0 && rounds > kUnconfirmableTail ? rounds - kUnconfirmableTail : rounds;
}
static_assert(PaidRounds(800, 10) == 8 && PaidRounds(0, 10) == 10 && PaidRounds(800, 2) == 2);

// Signs `verdict` (statement kind "verdict") as `key`, which must be its validator's.
absl::StatusOr<::gonka::trainshard::v1::SignedVerdict> SignVerdict(
    const common::PrivateKey& key, std::string_view chain_id,
    ::gonka::trainshard::v1::Verdict verdict);

// Checks verdicts carried at `round` (by its plan or result) or announced for it: at most `max`;
// each of this shard, about an earlier round no more than kVerdictRounds back, its member and
// validator distinct members of `shard`, 32-byte commitments and assignment, `reproduced` true
// exactly when the replayed commitment is the committed one, and signed by its validator; no
// validator twice about one member's round. Errors name `field` and the verdict.
absl::Status CheckVerdicts(
    std::string_view chain_id,
    const google::protobuf::RepeatedPtrField<::gonka::trainshard::v1::SignedVerdict>& verdicts,
    uint64_t round, const ShardView& shard, absl::string_view field, int max);

class VerdictTally {
 public:
  enum class Judgement { kNone, kOpen, kConfirmed, kRejected };

  // `shard`: members and frozen weights; `spec`: the rates and the limit on marks.
  VerdictTally(const ShardView& shard, const ::gonka::trainshard::v1::VerificationSpec& spec);

  // Reads the certified result of the next round (rounds in order; a round already read is
  // ignored): its verdicts, then the replays it draws. A verdict counts only when it was asked
  // for: by the validator the draw named, or, once such a verdict found a failure, by any other
  // member; the rest are ignored, so no member can make the others replay at will.
  void Add(const ::gonka::trainshard::v1::RoundResult& result);

  // The replays the result of `round` drew (ledger.h DrawReplays, a marked member at the
  // spec's higher rate), while the round is within kVerdictRounds of the last read.
  struct Draw {
    size_t index = 0;  // the member's index in the result's contributions
    std::string member;
    std::string validator;
  };
  std::vector<Draw> Draws(uint64_t round) const;

  // kNone: no verdict about the member's round; kOpen: some, no quorum either way yet.
  Judgement JudgementOf(uint64_t round, const std::string& member) const;
  // Whether `validator`'s verdict about the member's round is in a certificate.
  bool Has(uint64_t round, const std::string& member, const std::string& validator) const;
  // The failing verdicts read so far that this host has not answered and may: (round, member)
  // with a failing verdict, no verdict of `host`, `host` not the member, still open.
  std::vector<std::pair<uint64_t, std::string>> Unanswered(const std::string& host) const;

  uint32_t Marks(const std::string& host) const;
  bool Excluded(const std::string& host) const { return Marks(host) >= exclude_after_marks_; }
  // Whether the member's round had a passing verdict and no confirmed failure.
  bool Verified(uint64_t round, const std::string& member) const;
  uint64_t last_round() const { return last_round_; }

 private:
  struct Accused {
    std::map<std::string, bool> verdicts;  // validator → reproduced
    std::string accuser;                   // the drawn validator that found the failure
  };
  Judgement Judge(const std::string& member, const Accused& a) const;

  std::map<std::string, uint64_t> weights_;
  uint64_t total_weight_ = 0;
  uint32_t rate_bps_ = 0;
  uint32_t marked_rate_bps_ = 0;
  uint32_t exclude_after_marks_ = 0;
  std::map<uint64_t, std::vector<Draw>> draws_;  // by round, the last kVerdictRounds + 1
  uint64_t last_round_ = 0;
  std::map<std::pair<uint64_t, std::string>, Accused> accused_;  // (round, member)
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_VERDICTS_H_
