// ts_round_sim: runs the round protocol's simulation for many seeds (scripts/soak.sh). Prints a
// line per failing seed (its replay command) and a summary; exit 1 when a seed fails.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "tests/sim/round_sim.h"

int main(int argc, char** argv) {
  CLI::App app{"ts_round_sim: the round protocol's deterministic simulation", "ts_round_sim"};
  uint64_t from = 1, seeds = 100;
  bool verbose = false, no_faults = false;
  app.add_option("--from", from, "first seed");
  app.add_option("--seeds", seeds, "how many seeds")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_flag("--verbose", verbose, "print each seed's faults and end");
  app.add_flag("--no-faults", no_faults, "run without faults");
  std::string attack_name = "none";
  int attacker = 0;
  app.add_option("--attack", attack_name,
                 "every seed with host --attacker attacking so (free_rider, copier, lazy, noise, "
                 "scale100, sign_flip, alie, stale, wrong_data, lying_validator, lying_evaluator, "
                 "lying_scorer; none: drawn on every fourth seed)");
  app.add_option("--attacker", attacker, "the attacker's index with --attack")
      ->check(CLI::Range(0, 4));
  size_t hosts = 5;
  uint32_t rounds = 0, rate = 0;
  app.add_option("--hosts", hosts, "hosts with --attack (equal weights)")->check(CLI::Range(4, 5));
  app.add_option("--rounds", rounds, "rounds (0: 3..5 drawn)")->check(CLI::Range(0u, 50u));
  app.add_option("--replay-rate-bps", rate, "replay rate (0: the seed's)")
      ->check(CLI::Range(0u, 10000u));
  int64_t deadline_ms = 0;
  app.add_option("--deadline-ms", deadline_ms,
                 "the shard's deadline in simulated ms (0: none); the run settles what it "
                 "certified before it")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}));
  CLI11_PARSE(app, argc, argv);
  const std::optional<ts::sim::Attack> attack = ts::sim::ParseAttack(attack_name);
  if (!attack.has_value()) {
    std::fprintf(stderr, "ts_round_sim: --attack: \"%s\" is not an attack\n", attack_name.c_str());
    return 2;
  }
  const bool attacking = *attack != ts::sim::Attack::kNone;
  const auto start = std::chrono::steady_clock::now();
  uint64_t failed = 0, events = 0;
  uint64_t caught = 0, marked = 0;  // seeds whose attacker was paid nothing, was marked
  // Seeds in which a host's records were superseded by a later attempt's certificate (a rare
  // path, which round_sim_test pins with such a seed), and the first of them.
  uint64_t superseded = 0, first_superseded = 0;
  for (uint64_t seed = from; seed < from + seeds; ++seed) {
    ts::sim::SimResult r = ts::sim::RunRoundSim({.seed = seed,
                                                 .faults = !no_faults,
                                                 .verbose = verbose,
                                                 .attacker = attacking ? attacker : -1,
                                                 .attack = *attack,
                                                 .hosts = attacking ? hosts : 0,
                                                 .rounds = rounds,
                                                 .replay_rate_bps = rate,
                                                 .deadline_ms = deadline_ms});
    if (attacking && r.ok) {
      caught += r.attacker_paid == 0 ? 1 : 0;
      marked += r.attacker_marks > 0 ? 1 : 0;
    }
    events += r.events;
    if (r.superseded > 0) {
      if (superseded == 0) first_superseded = seed;
      ++superseded;
    }
    if (verbose || !r.ok) {
      std::printf(
          "seed %llu: %s; %zu hosts, %llu of %u rounds settled, %llu events, %.1f s simulated; "
          "faults: %s\n",
          static_cast<unsigned long long>(seed), r.ok ? "ok" : r.violation.c_str(), r.hosts,
          static_cast<unsigned long long>(r.rounds_settled), r.rounds,
          static_cast<unsigned long long>(r.events), r.sim_ms / 1000.0,
          r.faults.empty() ? "none" : r.faults.c_str());
    }
    if (!r.ok) {
      ++failed;
      std::printf("  replay: ts_round_sim --from %llu --seeds 1 --verbose\n",
                  static_cast<unsigned long long>(seed));
    }
    std::fflush(stdout);
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("ts_round_sim: %llu seeds from %llu, %llu failed, %llu events, %.1f s\n",
              static_cast<unsigned long long>(seeds), static_cast<unsigned long long>(from),
              static_cast<unsigned long long>(failed), static_cast<unsigned long long>(events),
              wall);
  if (superseded > 0) {
    std::printf("ts_round_sim: records superseded in %llu seeds (the first: %llu)\n",
                static_cast<unsigned long long>(superseded),
                static_cast<unsigned long long>(first_superseded));
  }
  if (attacking) {
    std::printf(
        "ts_round_sim: attacker (%s) marked in %llu and paid nothing in %llu of %llu seeds\n",
        attack_name.c_str(), static_cast<unsigned long long>(marked),
        static_cast<unsigned long long>(caught), static_cast<unsigned long long>(seeds - failed));
  }
  return failed == 0 ? 0 : 1;
}
