// A deterministic simulation of the round protocol (docs/training.md "Simulation"), in the
// manner of FoundationDB's and TigerBeetle's simulators: N hosts (3 to 5, weights equal or
// drawn) each run the real ShardRun — preparation, planning and the rendezvous, the exchange over
// the collective, certificates, publishing, catch-up, settlement — over a simulated world
// (sim_world.h: in-memory mesh and ShardRound calls, a tiny worker, the artifact store, a chain
// that settles), on simulated time with a seeded scheduler (sim_scheduler.h). Each host keeps its
// records in a real RocksDB.
//
// Faults, while they last (the first faults_until_ms of simulated time): shard processes killed
// at any point and restarted later from their records, workers killed, hosts cut off from the
// others, slow links, dropped and duplicated calls, planners that lie (a plan on a base of their
// own), members whose inner steps stall. Invariants, checked after every event: no two
// certificates of a round with different roots; every certificate continues the round before it
// and holds more than 2/3 of the shard's weight (counted here, not by the code under test); a
// restarted member resumes from its records; and once the faults stop, the shard settles within
// settle_within_ms with every member on the settled root (or a member's run fails, saying why).
//
// A failing seed names itself; RunRoundSim with the same options replays it exactly (the same
// events in the same order: SimResult::trace).
#ifndef TS_TESTS_SIM_ROUND_SIM_H_
#define TS_TESTS_SIM_ROUND_SIM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ts::sim {

// What the attacker host does (docs/verification.md "Attacks"), here in the simulated worker as
// tests/functional/byzantine_worker.cc does it on real workers. Every kind but the lying
// validator commits another Δ than its steps compute ("a Δ attack"): Δ = 0; the previous
// round's aggregate (0 in the first); the steps of a quarter of the assignment; Δ plus noise;
// 100·Δ; −Δ; ALIE (μ − 1.5σ from its Δ and the last aggregate); its own Δ of the round before;
// the steps on another round's data. The lying validator's replays come out a little off; the
// lying evaluator's evaluations of the rounds it trains report half the loss.
enum class Attack : uint8_t {
  kNone,
  kFreeRider,
  kCopier,
  kLazy,
  kNoise,
  kScaled,
  kSignFlip,
  kAlie,
  kStale,
  kWrongData,
  kLyingValidator,
  kLyingEvaluator,
  kLyingScorer,  // its honest Δ with a held-out score claimed better than its steps' own
};
inline constexpr int kAttackKinds = 13;
// "none", "free_rider", "copier", "lazy", "noise", "scale100", "sign_flip", "alie", "stale",
// "wrong_data", "lying_validator", "lying_evaluator", "lying_scorer": the attack suite's names.
const char* AttackName(Attack a);
std::optional<Attack> ParseAttack(std::string_view name);

struct SimOptions {
  uint64_t seed = 1;
  bool faults = true;
  int64_t faults_until_ms = 40'000;
  int64_t settle_within_ms = 300'000;
  bool verbose = false;  // every fault and the end, on stderr
  // The index of a host that attacks with `attack` and otherwise behaves (it signs, plans,
  // replays), or -1. Only checks of its rounds may fail then (a Δ attack, the lying
  // evaluator), or only its own (the lying validator); no honest host is ever marked; without
  // faults and with every round replayed, an attacker whose tampered work is in a certified
  // round two rounds before the last is marked and paid nothing (round_sim.cc, Attacked).
  int attacker = -1;
  Attack attack = Attack::kNone;
  // 0: 3..5 hosts drawn, weights equal or drawn — on every fourth seed (3, 7, 11, ...) 4 or 5
  // equal hosts, one of them an attacker of a drawn kind, every round replayed (when
  // `attacker` is -1); else that many, equal.
  size_t hosts = 0;
  uint32_t rounds = 0;           // 0: 3..5, drawn from the seed
  uint32_t replay_rate_bps = 0;  // 0: 5000 on every fourth seed (1, 5, 9, ...), else none
  // With replays, the spec's verification.scoring ("drop", "record" or "off"). "drop" by
  // default: the simulation's honest scores are alike, so only a lie moves them.
  std::string scoring = "drop";
  // The shard's deadline in simulated ms (the chain makes a block every kSimBlockMs), or 0 for
  // none. With one, the members settle the rounds they certified before it (partial
  // settlement): the shard must settle, on a root some host ends on, before it expires.
  int64_t deadline_ms = 0;
};

inline constexpr int64_t kSimBlockMs = 1000;

struct SimResult {
  bool ok = true;
  std::string violation;  // "seed S at t=… ms (event E): what"
  size_t hosts = 0;
  uint32_t rounds = 0;
  uint64_t events = 0;
  int64_t sim_ms = 0;
  std::string final_root;         // hex
  uint64_t trace = 0;             // a hash of the run's course: equal for a replay
  std::string faults;             // the faults injected, counted by kind
  int superseded = 0;             // records replaced by a later attempt's certificate
  uint64_t replays = 0;           // replays by the hosts still up at the end (docs/verification.md)
  uint64_t replays_failed = 0;    // of those, the ones that did not reproduce the commitment
  Attack attack = Attack::kNone;  // the attack run (drawn or asked for)
  // The attacker: its marks as the certificates have them, and
  // what the settlement that landed paid it and all other hosts together.
  uint32_t attacker_marks = 0;
  bool attacker_excluded = false;
  uint64_t attacker_paid = 0;
  uint64_t honest_paid = 0;
  uint64_t rounds_settled = 0;  // the settlement's rounds_completed
  uint64_t refund = 0;          // what it refunded
};

SimResult RunRoundSim(const SimOptions& options);

}  // namespace ts::sim

#endif  // TS_TESTS_SIM_ROUND_SIM_H_
