// RunContext: what the pieces of one host's run share (docs/training.md "The run's pieces").
// The run (shard_run.h) is split along the round protocol's seams — preparation
// (run_preparation.h), planning (round_planning.h), the exchange and its certificate
// (round_exchange.h, round_certificate.h), checkpoint publishing (checkpoint_publishing.h),
// catch-up (catch_up.h) and the settlement (settlement_exchange.h) — and each piece works on
// this one context: the host and the run's constants; what the run thread made and only it
// changes (the worker, the collective transport, the prepared data); and, under one lock, the
// state that gRPC threads read too (the certified round and root, the planner's rendezvous, the
// status `train-status` shows, the meshes Stop aborts).
//
// It also names the run's files in the work directory shared with the worker, the round's
// fixed all-gather blocks, and the small helpers of the run's status lines.
//
// Thread-safety: the fields above `mu` are the run thread's (read elsewhere only where a field
// says so); those below are guarded by `mu`. `stopping` and `worker_pid` are atomics read by
// Stop on another thread.
#ifndef TS_SIDECAR_SHARD_RUN_CONTEXT_H_
#define TS_SIDECAR_SHARD_RUN_CONTEXT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/shard/rendezvous.h"
#include "sidecar/shard/round_peers.h"
#include "sidecar/shard/run_worker.h"
#include "sidecar/shard/shard_run.h"
#include "sidecar/shard/verdicts.h"

namespace ts::sidecar {

inline constexpr char kCheckpointFile[] = "checkpoint.tsck";
inline constexpr char kTokenizerFile[] = "tokenizer.model";
inline constexpr int64_t kRpcTimeoutMs = 5000;

// A checkpoint's folder in the work directory, its file, and a round's Δ file (by parity, so
// the Δ of the round in flight and of the next one coexist).
std::string CheckpointDir(uint64_t round);
std::string CheckpointName(uint64_t round);
std::string DeltaName(uint64_t round);
// The first 8 bytes of a hash in hex, and an address cut short, for status lines.
std::string Hex8(std::string_view bytes);
std::string Short(const std::string& address);

// A mean loss in nats as evaluations carry it: micro-nats, rounded.
int64_t LossMicroOf(double mean_loss);

// Certificates of rounds from..from+max-1 kept in a shard process's records, in round order.
absl::StatusOr<std::vector<::gonka::trainshard::v1::RoundCertificate>> LoadStoredCertificates(
    const state::Db& db, uint64_t shard_id, uint64_t from, uint32_t max);

struct RunContext {
  RunContext(const ShardRunHost& h, const ShardRunOptions& o, uint64_t id, ParsedRunSpec s,
             std::unique_ptr<RoundPeers> p);

  const ShardRunHost host;
  const ShardRunOptions options;
  const uint64_t shard_id;
  const ParsedRunSpec spec;
  const std::unique_ptr<RoundPeers> peers;  // the other members' ShardRound
  std::string dir;                          // <work_root>/<shard_id>
  std::string work_dir;                     // dir/work: shared with the worker

  // Made by preparation, replaced when the worker is restarted; the worker is also shared with
  // eval_target below.
  std::shared_ptr<RunWorker> worker;
  std::unique_ptr<Transport> transport;
  std::string collective_endpoint;  // the transport's, announced to planners
  ::gonka::trainshard::v1::PrepareDataResponse data;
  uint64_t parameters = 0;
  bool loaded = false;             // the worker holds the certified checkpoint
  double round_inner_seconds = 0;  // the last inner steps' time (the planner's wait grows with it)
  double last_round_seconds = 0;   // the last round this host certified: inner steps to certificate
  // What WatchDeadline has seen of the chain: the shard's deadline height, and the first and
  // latest heights with the times they were read (the blocks' pace).
  struct ChainPace {
    int64_t deadline_height = 0;
    int64_t first_height = 0;
    int64_t first_ms = 0;
    int64_t height = 0;
    int64_t read_ms = -1;
    int64_t tried_ms = -1;        // the last attempt to read the chain, answered or not
    int64_t status_read_ms = -1;  // ShardClosed's last read, and what it found
    bool closed = false;
  } chain_pace;

  std::atomic<int64_t> start_ms{0};
  std::atomic<bool> stopping{false};
  std::atomic<pid_t> worker_pid{0};

  mutable absl::Mutex mu;
  // The meshes in use by the exchange (at most the run thread's and the allreduce in flight):
  // Stop aborts them, so the operations end at once instead of at their deadlines.
  std::set<Mesh*> meshes ABSL_GUARDED_BY(mu);
  // transport.get() once made, for Stop to end the Connects in progress.
  Transport* stop_transport ABSL_GUARDED_BY(mu) = nullptr;
  // The certified state.
  uint64_t certified_round ABSL_GUARDED_BY(mu) = 0;
  std::string certified_root ABSL_GUARDED_BY(mu);
  std::string certified_base_root ABSL_GUARDED_BY(mu);  // the base of certified_round
  std::string checkpoint_artifact ABSL_GUARDED_BY(mu);  // holds certified_root, if published
  // The round this host plans or would plan: the announces it has heard and its plan.
  Rendezvous rendezvous ABSL_GUARDED_BY(mu);
  // A member announcing a round past ours: we are behind it.
  std::string ahead_peer ABSL_GUARDED_BY(mu);
  // Whether this host can plan a round now (its worker holds the certified checkpoint and it
  // is not waiting for the settlement); Announce answers cannot_plan when not.
  bool can_plan ABSL_GUARDED_BY(mu) = false;
  // The run's last round: the spec's, or the round certified when the shard's deadline came too
  // near for another one (WatchDeadline); the rounds past it are settled, not trained.
  uint64_t end_round ABSL_GUARDED_BY(mu) = 0;
  ::gonka::trainshard::v1::ShardRunStatus status ABSL_GUARDED_BY(mu);
  // What an evaluation on a gRPC thread needs of the run (ShardRun::EvaluateArtifact): set once
  // the worker and the data are prepared, cleared before the worker is stopped or replaced.
  struct EvalTarget {
    std::shared_ptr<RunWorker> worker;
    std::string eval_file;
    std::string work_dir;
    uint32_t eval_batch_size = 0;
  };
  std::optional<EvalTarget> eval_target ABSL_GUARDED_BY(mu);
  // The verdicts of the stored certificates (verdicts.h), read in round order; absent until
  // first needed and after records were replaced (then read again from the records).
  std::optional<VerdictTally> tally ABSL_GUARDED_BY(mu);
  // This host's signed verdicts that no stored certificate carries yet: its announces carry
  // them to planners (at most kVerdictsPerAnnounceMax), until a certificate does or they are
  // more than kVerdictRounds old.
  std::vector<::gonka::trainshard::v1::SignedVerdict> pending_verdicts ABSL_GUARDED_BY(mu);

  // Sets (ready) or clears the evaluation target from the run thread's worker and data.
  void ShareEvalTarget(bool ready);

  // ---- status
  void Transition(const std::string& what);
  void SetState(const std::string& state);
  void Fail(const absl::Status& error);
  // Sleeps on the host's clock in short steps; false once the run stops.
  bool Sleep(int64_t ms);
  uint64_t CertifiedRound() const;
  uint64_t EndRound() const {
    absl::MutexLock lock(&mu);
    return end_round;
  }
  // Whether `round` is past the run's last round: its plan is a settlement's
  // (RoundPlan.settlement), not a training round's.
  bool Settling(uint64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return round > end_round;
  }
  // Partial settlement (docs/training.md "Settlement"): ends the run at the certified round
  // when the shard's deadline, at the pace the chain's blocks have come, leaves too little time
  // for another round (the last one's duration) and the settlement after it. Reads the chain at
  // most once a second; does nothing before a round is certified, or without a chain height.
  void WatchDeadline();
  // Whether the chain no longer runs the shard (settled, expired), read at most once a second.
  bool ShardClosed();
  struct Certified {
    uint64_t round = 0;
    std::string root;
  };
  Certified CertifiedState() const;
  // The root the data seed of `round` is drawn from: the round's base (the root certified at
  // round - 1) or, with overlap, the root certified at round - 2 (round 0's for rounds 1 and 2),
  // since then a round's inner steps start before the round before it is certified.
  absl::StatusOr<std::string> DataRoot(uint64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // How long the members of a round take, at most, to announce to a planner that answers and
  // to learn its plan: the join window plus the planner timeout.
  int64_t PlanningBoundMs() const {
    return spec.spec.join_window_ms() + spec.spec.planner_timeout_ms();
  }
  // What a mesh is aborted with when the run stops: this host at fault, so the others retry
  // without it.
  absl::Status Stopping() const;

  // ---- peers
  template <typename Request>
  absl::Status Sign(Request* request, std::string_view method, const std::string& audience) const {
    request->clear_auth();
    TS_ASSIGN_OR_RETURN(
        ::gonka::trainshard::v1::PeerRequestAuth auth,
        SignPeerRequest(*host.key, host.chain_id, shard_id, method, audience, *request,
                        host.clock->NowUnixMs(), kDefaultPeerRequestLifetimeMs));
    *request->mutable_auth() = std::move(auth);
    return absl::OkStatus();
  }
  absl::StatusOr<ShardView> View() const { return host.directory->Get(shard_id); }
  // The worker request that evaluates the current checkpoint as every member does (the spec's
  // batch size and windows, the run's held-out set); the caller may name another checkpoint.
  ::gonka::trainshard::v1::EvaluateRequest EvaluateRequestOf() const;

  // ---- files in the work directory
  std::string Path(const std::string& name) const { return work_dir + "/" + name; }
  void RemoveTree(const std::string& name) const;
  absl::Status MakeDir(const std::string& name) const;

  // ---- certificates
  absl::StatusOr<std::vector<::gonka::trainshard::v1::RoundCertificate>> LoadCertificates(
      uint64_t from, uint32_t max) const {
    return LoadStoredCertificates(*host.db, shard_id, from, max);
  }
  // Adds a round to the status (the last kRoundsKept are kept).
  void RecordRound(const ::gonka::trainshard::v1::RoundCertificate& c, double round_seconds,
                   double inner_seconds, double exchange_seconds = 0, double certify_seconds = 0);
  // Stores certificates (already verified, consecutive from certified_round + 1) in one batch
  // and moves the certified state to the last.
  absl::Status StoreCertificates(
      const std::vector<::gonka::trainshard::v1::RoundCertificate>& certs);
  // Replaces the records from `c`'s round on with `c` alone (a later attempt's certificate of
  // a round this host certified in an abandoned attempt) and moves the certified state to it.
  absl::Status ReplaceCertificatesFrom(const ::gonka::trainshard::v1::RoundCertificate& c);
  // The certified state as the records have it after a start: the last certificate's.
  void AdoptCertified(const ::gonka::trainshard::v1::RoundCertificate& last);
  // The tally of the stored certificates' verdicts, read from the records when absent.
  absl::StatusOr<const VerdictTally*> Tally() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // FAILED_PRECONDITION naming the marks when the verdicts exclude this host from the run.
  absl::Status CheckNotExcluded();
};

// Registers a mesh for Stop to abort while in scope (the mesh outlives the guard).
class AbortOnStop {
 public:
  AbortOnStop(RunContext* run, Mesh* mesh);
  ~AbortOnStop();
  AbortOnStop(const AbortOnStop&) = delete;
  AbortOnStop& operator=(const AbortOnStop&) = delete;

 private:
  RunContext* run_;
  Mesh* mesh_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_RUN_CONTEXT_H_
