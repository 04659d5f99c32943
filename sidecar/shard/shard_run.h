// ShardRun: one host's part in training a shard (docs/training.md). A thread of its own drives
// the rounds: it starts the host's worker process (ts_worker, crash-isolated), prepares the
// run's data through it and publishes it as an artifact, makes (or restores) the round-0
// checkpoint, and then, round after round: H inner steps on the host's assignment, a plan agreed
// with the round's planner (ShardRound.Announce), the pseudo-gradients reduced through the
// shard's collective, the outer step, evaluation every eval_every rounds, the members' signed
// results gathered into a round certificate (> 2/3 of the shard's frozen weight) kept in the
// shard process's RocksDB, and the new checkpoint published as an artifact (through the host
// sidecar, which keeps the shard's artifact store: host_link.h). After the last round it drafts
// the settlement from its certificates, the members exchange signatures over it, and it is
// submitted to the chain. A member that falls behind (restarted, excluded from a plan) catches
// up: it fetches and checks the certificates it lacks and the latest checkpoint (from every
// member that holds it), then joins the next round.
// The runs of a shard process are kept by ShardRunManager (shard_run_manager.h).
//
// Thread-safety: ShardRun is thread-safe.
#ifndef TS_SIDECAR_SHARD_SHARD_RUN_H_
#define TS_SIDECAR_SHARD_SHARD_RUN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/tls_session.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gonka/trainshard/v1/training.grpc.pb.h"
#include "sidecar/collective/transport.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/peer/shard_directory.h"
#include "sidecar/shard/host_link.h"
#include "sidecar/shard/round_peers.h"
#include "sidecar/shard/run_spec.h"
#include "sidecar/shard/run_worker.h"
#include "sidecar/shard/shard_db.h"
#include "state/db.h"

namespace ts::sidecar {

inline constexpr std::string_view kAnnounceMethod = "/gonka.trainshard.v1.ShardRound/Announce";
inline constexpr std::string_view kGetCertificatesMethod =
    "/gonka.trainshard.v1.ShardRound/GetCertificates";
inline constexpr uint32_t kCertificatesPerCallMax = 64;
inline constexpr size_t kTransitionsKept = 256;

// A collective transport and the endpoint its members dial (announced to planners).
struct StartedTransport {
  std::unique_ptr<Transport> transport;
  std::string endpoint;
};

// What a run needs from the host it runs in. Pointers are not owned and outlive the run.
struct ShardRunHost {
  const common::PrivateKey* key = nullptr;
  std::string address;
  std::string chain_id;
  ShardDirectory* directory = nullptr;
  ShardArtifacts* artifacts = nullptr;  // the shard's artifact store, in the host sidecar
  state::Db* db = nullptr;              // opened with kTableRounds and kTableRunSpecs
  common::Clock* clock = nullptr;
  // The shard as the chain has it now (spec: escrow, reward policy, run spec hash; status).
  std::function<absl::StatusOr<::gonka::trainshard::v1::Shard>(uint64_t)> chain_shard;
  // The chain's latest height, for the shard's deadline; empty: the run does not watch it.
  std::function<absl::StatusOr<int64_t>()> chain_height;
  // Signs a settlement draft after checking it against the host's records.
  std::function<absl::StatusOr<::gonka::trainshard::v1::SettlementSignature>(
      const ::gonka::trainshard::v1::Settlement&)>
      sign_settlement;
  // Submits a signed settlement; returns the txhash (empty when the chain records none).
  std::function<absl::StatusOr<std::string>(
      const ::gonka::trainshard::v1::Settlement&,
      const std::vector<::gonka::trainshard::v1::SettlementSignature>&)>
      submit_settlement;
  // Starts the run's worker; empty: the ts_worker process (StartWorkerProcess).
  RunWorkerStarter start_worker;
  // Starts the run's collective transport; empty: TCP on ShardRunOptions::collective_host.
  std::function<absl::StatusOr<StartedTransport>()> start_transport;
  // The other members' ShardRound; empty: gRPC (MakeGrpcRoundPeers).
  std::function<std::unique_ptr<RoundPeers>()> make_peers;
  // The host's TLS identity for the collective's links (each member pinned to the certificate
  // its reservation names); null: the links run in the clear.
  std::shared_ptr<const common::TlsContext> tls;
  // Whether the chain records settlements (false under gonka-v0, whose creator settles): only
  // then do the members after the first wait before submitting, so that one tx lands.
  bool settles_on_chain = true;
};

struct ShardRunOptions {
  std::string worker_binary;  // the ts_worker executable
  int worker_threads = 2;
  std::string worker_device = "cpu";  // the worker's --device
  // The worker's --memory-bytes-max (its fp32 training state must fit); 0: the machine's memory.
  uint64_t worker_memory_bytes_max = 0;
  std::string work_root;  // absolute; this run's files go under <work_root>/<shard_id>/
  // The host the collective listener binds (port chosen by the kernel); announced to members.
  std::string collective_host = "127.0.0.1";
  int64_t heartbeat_interval_ms = 500;
};

// The settlement this host's records imply for rounds 1..`rounds` of the spec's (ledger.h
// DraftSettlement; fewer than the spec's: a partial settlement): its certificates with their
// verdicts under the spec's verification, and the shard's members, escrow and reward policy as
// the chain has them. FAILED_PRECONDITION while a round's certificate is missing (the run has
// not got that far here). In settlement_exchange.cc.
absl::StatusOr<::gonka::trainshard::v1::Settlement> DraftFromRecords(
    const ShardRunHost& host, uint64_t shard_id, const ::gonka::trainshard::v1::RunSpec& spec,
    uint64_t rounds);

class ShardRun {
 public:
  // Starts the run's thread. The spec's hash must be the shard's run_spec_hash (the manager
  // checks it).
  static std::unique_ptr<ShardRun> Start(const ShardRunHost& host, const ShardRunOptions& options,
                                         uint64_t shard_id, ParsedRunSpec spec);
  ~ShardRun();  // Stop()s.
  ShardRun(const ShardRun&) = delete;
  ShardRun& operator=(const ShardRun&) = delete;

  // Stops the worker and joins the thread; what is certified stays in the records. Idempotent.
  void Stop();
  // Stop without the wait: the run's thread ends soon after (a simulation schedules it there).
  void RequestStop();

  ::gonka::trainshard::v1::ShardRunStatus Status() const;
  const std::string& spec_hash() const { return spec_.hash; }

  // ShardRound, for a verified member `signer`.
  ::gonka::trainshard::v1::AnnounceResponse OnAnnounce(
      const std::string& signer, const ::gonka::trainshard::v1::AnnounceRequest& request);
  absl::StatusOr<::gonka::trainshard::v1::GetCertificatesResponse> OnGetCertificates(
      const ::gonka::trainshard::v1::GetCertificatesRequest& request) const;
  // Evaluates a checkpoint artifact held in the shard's store on the run's held-out set. Called
  // on a gRPC thread: it touches none of the run thread's fields, only the store and what the
  // run shares under its lock (its worker, by shared ownership, and the held-out set's file);
  // UNAVAILABLE while the worker is not prepared, being restarted, or the run stops.
  absl::StatusOr<::gonka::trainshard::v1::SignedEvaluation> EvaluateArtifact(
      const std::string& artifact_id, uint64_t windows_max);

  struct Impl;

 private:
  explicit ShardRun(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  ParsedRunSpec spec_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_SHARD_RUN_H_
