// RoundExchange: one attempt of a round's exchange among the members of its plan
// (docs/training.md "Rounds"), in two halves. Reduce: the mesh of the plan's members over the
// collective transport, and the allreduce of their Δ files with the spec's codec: the ring
// mean, or, with commitments (docs/verification.md), commit before reveal with the spec's
// aggregator. Finish: the outer step with the aggregate, this member's vote
// (its signed result and, in an evaluation round, its signed evaluation), the votes gathered
// over the same mesh and counted into a certificate (round_certificate.h) that must hold more
// than 2/3 of the shard's weight, the certificate stored, the checkpoint published
// (checkpoint_publishing.h), and after the last round the settlement exchanged
// (settlement_exchange.h). Any failure fails the attempt; the run retries with the members that
// answer.
//
// With overlap, Reduce runs on a thread of its own while the worker computes the next round's
// steps: it touches nothing of the run thread's but the transport and the Δ file.
//
// Thread-safety: Reduce as above; Finish on the run thread.
#ifndef TS_SIDECAR_SHARD_ROUND_EXCHANGE_H_
#define TS_SIDECAR_SHARD_ROUND_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sidecar/collective/collective.h"
#include "sidecar/shard/run_context.h"
#include "sidecar/shard/scoring.h"
#include "sidecar/shard/settlement_exchange.h"

namespace ts::sidecar {

class RoundExchange {
 public:
  RoundExchange(RunContext* run, SettlementExchange* settlement)
      : run_(*run), settlement_(*settlement) {}

  // The first half's result, carried to Finish.
  struct Reduced {
    ::gonka::trainshard::v1::RoundPlan plan;
    ShardView view;
    GroupSpec group;
    size_t self = 0;
    int64_t started = 0;
    int64_t deadline = 0;
    std::unique_ptr<Mesh> mesh;
    std::unique_ptr<Collective> collective;
    std::vector<float> aggregate;
    // With commitments (run_spec.h): the members' Δ commitments, in plan order.
    std::vector<std::string> commitments;
    // Where the run scores (scoring.h): the members' claims, in plan order, and which of them
    // the spec's rule left out of the aggregate (empty: none).
    std::vector<StepScore> scores;
    std::vector<bool> left_out;
    uint64_t bytes = 0;
    int64_t reduced = 0;  // when the aggregate was complete
  };

  // The mesh of the plan's members (Reduced without the aggregate).
  absl::StatusOr<Reduced> Connect(const ::gonka::trainshard::v1::RoundPlan& plan);
  // Connect, then the allreduce of this host's Δ; where the run scores, the members' score
  // claims (`own_score` this host's) are gathered first, before any Δ is revealed.
  absl::StatusOr<Reduced> Reduce(const ::gonka::trainshard::v1::RoundPlan& plan,
                                 const StepScore& own_score = {});
  // `own_train_loss` and `inner_seconds` are this host's of the round's inner steps.
  absl::Status Finish(Reduced& r, float own_train_loss, double inner_seconds);

 private:
  // The members' score claims into r.scores (kScoreOpId's gather).
  absl::Status GatherScores(Reduced& r, const StepScore& own_score);
  // With commitments: each member's commitment, assignment, tokens and score into `result`.
  absl::Status AddContributions(const Reduced& r,
                                ::gonka::trainshard::v1::RoundResult* result) const;
  // The outer step with the aggregate; the new root.
  absl::StatusOr<std::string> OuterStep(Reduced& r);
  // This member's vote on `result`, with its evaluation when `evaluate`.
  absl::StatusOr<::gonka::trainshard::v1::RoundCertificate> Vote(
      const ::gonka::trainshard::v1::RoundResult& result, float own_train_loss, bool evaluate);
  // The votes gathered and counted; the certificate once it holds a quorum and verifies.
  absl::StatusOr<::gonka::trainshard::v1::RoundCertificate> Certify(
      Reduced& r, const ::gonka::trainshard::v1::RoundResult& result,
      const ::gonka::trainshard::v1::RoundCertificate& vote, int64_t deadline, bool evaluate,
      size_t* evaluations);

  RunContext& run_;
  SettlementExchange& settlement_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_ROUND_EXCHANGE_H_
