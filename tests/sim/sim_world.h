// The simulated world a round-protocol simulation runs hosts in (docs/training.md
// "Simulation"): the network between them (reachability, partitions, delays, dropped and
// duplicated calls), and, for each host, the parts of the machine its run talks to — the other
// members' ShardRound (SimPeers), the collective's mesh (SimTransport: in-memory links whose
// sends never block), a worker with a tiny model in plain C++ (SimWorker), and the host
// sidecar's artifact store (SimArtifacts). Everything waits on the SimScheduler, so it is
// deterministic for a seed; the run's own code (planning, exchange, certificates, catch-up,
// publishing, settlement) is the real one.
//
// Thread-safety: called by the simulation's threads, one at a time (the scheduler's baton).
#ifndef TS_TESTS_SIM_SIM_WORLD_H_
#define TS_TESTS_SIM_SIM_WORLD_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "sidecar/collective/transport.h"
#include "sidecar/shard/host_link.h"
#include "sidecar/shard/round_peers.h"
#include "sidecar/shard/run_worker.h"
#include "sidecar/shard/shard_run.h"
#include "tests/sim/round_sim.h"
#include "tests/sim/sim_scheduler.h"

namespace ts::sim {

namespace pb = ::gonka::trainshard::v1;

class SimNet;

// One host of the world: its address and what the simulation currently runs there.
struct SimHostState {
  std::string address;
  uint64_t weight = 0;
  const common::PrivateKey* key = nullptr;
  sidecar::ShardRun* run = nullptr;  // null while the shard process is down
  bool lies = false;                 // answers Announce with a plan of its own making
  int64_t stall_until_ms = 0;        // its worker's inner steps take long until then
  std::map<std::string, std::map<std::string, std::string>> artifacts;  // id -> files
  std::map<std::string, pb::ArtifactSummary> summaries;                 // id -> summary
  Attack attack = Attack::kNone;  // what its worker does (SimOptions.attack)
  // For the attacks that need them: the last aggregate its worker stepped with, its own
  // honest Δ of its last round, and the rounds whose Δ it tampered with.
  std::vector<float> aggregate, own;
  std::set<uint64_t> attacked_rounds;
  // Every Δ its worker wrote, by base root ‖ data seed: what its commitments must bind.
  std::map<std::string, std::string> deltas;
};

// A mesh being connected or connected: its members' queues of frames in flight.
struct SimMeshGroup {
  sidecar::GroupSpec group;
  std::vector<bool> connected;
  absl::Status failure;
  struct InFlight {
    sidecar::Frame frame;
    int64_t deliver_at = 0;
  };
  std::map<std::pair<size_t, size_t>, std::deque<InFlight>> queues;  // (from, to)
  void Fail(const absl::Status& status) {
    if (failure.ok()) failure = status;
  }
};

class SimNet {
 public:
  SimNet(SimScheduler* scheduler, uint64_t seed) : scheduler_(*scheduler), rng_(seed) {}

  SimScheduler& scheduler() { return scheduler_; }
  Rng& rng() { return rng_; }
  std::map<std::string, SimHostState>& hosts() { return hosts_; }
  SimHostState* Host(const std::string& address);
  // The host whose ShardRound endpoint or collective endpoint this is.
  SimHostState* ByEndpoint(const std::string& endpoint);
  static std::string RoundEndpoint(const std::string& address) { return "round:" + address; }
  static std::string MeshEndpoint(const std::string& address) { return "mesh:" + address; }

  // Whether `a` reaches `b` now (both ways).
  bool Reachable(const std::string& a, const std::string& b) const;
  void Partition(const std::string& a, const std::string& b) { cuts_.insert(Cut(a, b)); }
  void Heal() { cuts_.clear(); }
  // A message's one-way delay, and whether a call is dropped or delivered twice.
  int64_t Delay();
  bool Drop() { return faulty_ && rng_.Chance(0.03); }
  bool Duplicate() { return faulty_ && rng_.Chance(0.05); }
  void set_faulty(bool faulty) { faulty_ = faulty; }
  void set_slow_until(int64_t ms) { slow_until_ms_ = ms; }

  // The group connecting or connected under `group`'s mesh id (a failed or rejoined one is
  // replaced by a new one).
  std::shared_ptr<SimMeshGroup> Group(const sidecar::GroupSpec& group, size_t self);
  // Every mesh `address` is in fails, naming it (its process died: the connections reset).
  void FailMeshesOf(const std::string& address, const std::string& why);

 private:
  static std::pair<std::string, std::string> Cut(const std::string& a, const std::string& b) {
    return a < b ? std::make_pair(a, b) : std::make_pair(b, a);
  }

  SimScheduler& scheduler_;
  Rng rng_;
  std::map<std::string, SimHostState> hosts_;
  std::set<std::pair<std::string, std::string>> cuts_;
  std::map<std::string, std::shared_ptr<SimMeshGroup>> meshes_;
  bool faulty_ = false;
  int64_t slow_until_ms_ = 0;
};

// The ShardRound calls of `self`'s run to the other hosts' runs.
std::unique_ptr<sidecar::RoundPeers> MakeSimPeers(SimNet* net, const std::string& self);
// The collective transport of `self`.
sidecar::StartedTransport MakeSimTransport(SimNet* net, const std::string& self);
// The worker of `self`'s run, in its work dir (the request files are real files there).
std::shared_ptr<sidecar::RunWorker> MakeSimWorker(SimNet* net, const std::string& self,
                                                  const std::string& work_dir);
// Kills a worker MakeSimWorker made: its calls fail UNAVAILABLE, Running is false.
void KillSimWorker(sidecar::RunWorker* worker);
// `self`'s artifact store (it lives in the host's SimHostState, across shard-process restarts).
std::unique_ptr<sidecar::ShardArtifacts> MakeSimArtifacts(SimNet* net, const std::string& self);

}  // namespace ts::sim

#endif  // TS_TESTS_SIM_SIM_WORLD_H_
