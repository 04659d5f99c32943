// Round certificates from the members' votes (docs/training.md "Certificates"): after the outer
// step every member of a round's plan sends one vote — its signed RoundResult (the round, the
// base root, the new root, the members, the run spec's hash), its train loss and, in an
// evaluation round, its signed evaluation of the new checkpoint — as a fixed-size block of an
// all-gather. CountVotes keeps the votes whose result is byte-for-byte this host's and whose
// signature recovers to the member that sent it, and sums their weight; the caller certifies
// only with more than 2/3 of the shard's weight (HasQuorum). Evaluations count only when signed
// by their member for the new root; the certificate's eval loss is their median.
//
// No I/O, no clock, no state: what a simulation and the tests drive directly.
//
// Thread-safety: pure functions.
#ifndef TS_SIDECAR_SHARD_ROUND_CERTIFICATE_H_
#define TS_SIDECAR_SHARD_ROUND_CERTIFICATE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "google/protobuf/message_lite.h"
#include "sidecar/peer/shard_directory.h"

namespace ts::sidecar {

// Fixed block sizes of the round's all-gathers (every member sends the same size).
inline constexpr size_t kVoteBlockBytes = 2048;
inline constexpr size_t kSettlementBlockBytes = 512;

// A block of an all-gather: u32 length (big-endian) then the message's deterministic bytes,
// zero-padded to `size`. INTERNAL when the message does not fit.
absl::StatusOr<std::string> PackBlock(const google::protobuf::MessageLite& m, size_t size);
// False when the block is short, its length runs past it, or the message does not parse.
bool UnpackBlock(std::string_view block, google::protobuf::MessageLite* m);

struct CountedVotes {
  // The certificate of `result` at `attempt`: the counted signatures and evaluations, signed
  // and total weight, the median eval loss, the mean train loss of the counted votes.
  ::gonka::trainshard::v1::RoundCertificate certificate;
  size_t evaluations = 0;
  std::vector<std::string> refused;  // a line per vote not counted, naming its member
};

// `gathered` holds one kVoteBlockBytes block per entry of `members` (the plan's, in order):
// each a member's vote, whose result holds only the round and new root; its signature counts
// when it verifies over `result`.
CountedVotes CountVotes(std::string_view chain_id, const ShardView& view,
                        const ::gonka::trainshard::v1::RoundResult& result, uint32_t attempt,
                        const std::vector<std::string>& members, std::string_view gathered,
                        bool evaluate);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_ROUND_CERTIFICATE_H_
