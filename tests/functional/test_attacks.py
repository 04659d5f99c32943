"""Byzantine hosts in real shards (docs/verification.md "Attacks"): devnet, trainshardd hosts,
their workers, the CLI — and attackers, hosts whose worker is ts_byzantine_worker, a real
ts_worker underneath a proxy that tampers with what the host commits, evaluates or replays.

One network of equal-weight hosts (4 with 1 attacker, or 7 with 2: TS_ATTACK_SHAPE=4 or 7)
trains the same run spec in one shard per attack, the first with every host honest: the default
aggregation (the trimmed mean at the Byzantine bound), commitments, and every member-round
replayed. For each attack: every attacker is marked and paid nothing, no honest host is marked
and each is paid at least what the honest run paid it, the honest hosts end on one root, and the
final eval loss is at most 5 % above the honest run's (the attack does not hurt the model; a
run may end lower than the honest one by more than that when a host of the honest run missed
a round on a loaded machine, which moves the loss by a few per cent either way).

TS_ATTACKS names the attacks (comma-separated, or "all"); without it, the CI's four: a Δ
attack (sign_flip), a lying evaluator, a lying validator and a lying scorer. scripts/attack_suite.sh runs them all in both shapes
and prints the table in docs/benchmarks.md.
"""

import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_training import open_shard, wait_settled  # noqa: E402

ALL_ATTACKS = ("free_rider", "copier", "lazy", "noise", "scale100", "sign_flip", "alie", "stale",
               "wrong_data", "lying_evaluator", "lying_validator", "lying_scorer")
CI_ATTACKS = ("sign_flip", "lying_evaluator", "lying_validator", "lying_scorer")
# The final eval loss may be this much above the honest run's, relatively.
LOSS_TOLERANCE = 0.05
WEIGHT = 60
ESCROW = 300000  # harness.Network.write_spec's default
# Every member-round replayed, so every attacked round is checked; a join window long enough
# that a host slowed by the others on one machine still makes its rounds (the loss compared
# depends on how many hosts trained each round).
RUN = {"rounds": 8, "innerSteps": 30, "aggregation": "auto", "evalEvery": 2, "joinWindowMs": 4000,
       "verification": {"commitments": True, "replayRateBps": 10000}}
# The rounds a settlement pays tokens for: with replays, the last two (whose checks no
# certificate could confirm) pay nobody.
PAID_ROUNDS = RUN["rounds"] - 2


def attacks_asked():
    asked = os.environ.get("TS_ATTACKS", "")
    if not asked:
        return CI_ATTACKS
    if asked == "all":
        return ALL_ATTACKS
    names = tuple(a for a in asked.split(",") if a)
    unknown = [a for a in names if a not in ALL_ATTACKS]
    if unknown:
        raise ValueError(f"TS_ATTACKS: unknown attacks {unknown} (known: {ALL_ATTACKS})")
    return names


class AttackTest(unittest.TestCase):
    def setUp(self):
        shape = int(os.environ.get("TS_ATTACK_SHAPE", "4"))
        if shape not in (4, 7):
            raise ValueError(f"TS_ATTACK_SHAPE: {shape} is not 4 or 7")
        self.attackers = 1 if shape == 4 else 2
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")),
                                   host_weights=(WEIGHT,) * shape)
        net = self.net
        net.init()
        net.start_devnet()
        self.attack_file = os.path.join(net.root, "attack")
        self.set_attack("none")
        build = os.environ["TS_BUILD_DIR"]
        for i in range(1, shape + 1):
            config = {"worker_threads": 1 + i % 2, "worker_device": '"cpu"',
                      "shard_idle_stop_ms": 3000, "worker_memory_bytes_max": 1 << 30}
            if i > shape - self.attackers:
                script = os.path.join(net.root, f"host{i}-worker.sh")
                with open(script, "w") as f:
                    f.write("#!/bin/sh\n"
                            f"export TS_ATTACK_FILE='{self.attack_file}'\n"
                            f"export TS_HONEST_WORKER='{build}/worker/ts_worker'\n"
                            f"exec '{build}/tests/functional/ts_byzantine_worker' \"$@\"\n")
                os.chmod(script, 0o755)
                config["worker_binary"] = f'"{script}"'
            net.add_host(f"host{i}", extra_config=config)
        for h in net.hosts:
            h.wait_shard_listen()
        self.honest = net.hosts[:shape - self.attackers]
        self.byzantine = net.hosts[shape - self.attackers:]

    def tearDown(self):
        self.net.cleanup()

    def set_attack(self, attack):
        with open(self.attack_file, "w") as f:
            f.write(attack + "\n")

    def run_attack(self, attack, run_spec, honest=None):
        """One shard with the attackers doing `attack`: its outcome as a dict, its roots and
        losses read from the `honest` hosts (the hosts that are not attackers by default)."""
        net = self.net
        honest = honest or self.honest
        self.set_attack(attack)
        n = len(net.hosts)
        started = time.monotonic()
        sid = open_shard(net, f"attack-{attack}", run_spec, min_nodes=n, max_nodes=n)
        for h in net.hosts:
            net.start_run(h, sid, run_spec)
        wait_settled(net, sid, timeout_s=600)
        harness.wait_for(lambda: all(net.train_status(h, sid, check=False).get("state") == "done"
                                     for h in honest), 120, "every honest run done")
        statuses = {h.name: net.train_status(h, sid) for h in honest}
        settlement = net.cli("shard", "settlement", "--id", sid)["settlement"]
        payouts = {p["host"]: p for p in settlement["payouts"]}
        last = statuses[honest[0].name]["rounds"][-1]
        return {
            "attack": attack,
            "shard": sid,
            "seconds": round(time.monotonic() - started, 1),
            "roots": {s["root"] for s in statuses.values()},
            "final_eval_loss": int(last["eval_loss_micro"]) / 1e6,
            "paid": {h.name: int(payouts.get(h.address, {}).get("amount", "0"))
                     for h in net.hosts},
            "marks": {h.name: int(payouts.get(h.address, {}).get("marks", 0))
                      for h in net.hosts},
            "rejected": {h.name: int(payouts.get(h.address, {}).get("rejected", 0))
                         for h in net.hosts},
            "rounds": {h.name: int(payouts.get(h.address, {}).get("rounds_contributed", 0))
                       for h in net.hosts},
            # The rounds each host was a member of among those a settlement pays for: with
            # replays, all but the last two (docs/verification.md "Pay").
            "paid_rounds": {h.name: sum(1 for r in statuses[honest[0].name]["rounds"]
                                        if int(r["round"]) <= PAID_ROUNDS
                                        and h.address in r["members"])
                            for h in net.hosts},
            "refund": int(settlement["refund"]),
            # The verification's cost: the honest hosts' replays and re-evaluations beside their
            # own inner steps.
            "inner_seconds": round(sum(float(s.get("inner_seconds", 0))
                                       for s in statuses.values()), 2),
            "replay_seconds": round(sum(float(s.get("replay_seconds", 0))
                                        for s in statuses.values()), 2),
            "members_last_round": len(last["members"]),
        }

    def test_attackers_are_marked_unpaid_and_do_not_hurt_the_model(self):
        net = self.net
        run_spec = net.write_run_spec("attacks", **RUN)
        honest = self.run_attack("none", run_spec)
        self.report(honest)
        self.assertEqual(len(honest["roots"]), 1, honest)
        self.assertFalse(any(honest["marks"].values()), honest)
        for attack in attacks_asked():
            outcome = self.run_attack(attack, run_spec)
            self.report(outcome, honest)
            with self.subTest(attack=attack):
                self.check(outcome, honest)

    def test_honest_runs_mark_no_one(self):
        """No false positives: every host honest (the proxies pass everything through), seeded
        runs of other data orders and initial models, hosts on one and two worker threads
        replaying each other's steps: nobody is marked or rejected, every host is paid and the
        hosts end on one root. TS_HONEST_SEEDS runs (2 here; scripts/honest_soak.sh runs 20)."""
        net = self.net
        seeds = int(os.environ.get("TS_HONEST_SEEDS", "2"))
        if seeds < 1:
            raise ValueError(f"TS_HONEST_SEEDS: {seeds} is not a positive count")
        for i in range(seeds):
            model = {"kind": "gpt", "seed": str(1000 + i),
                     "config": {"layers": 2, "dModel": 64, "heads": 4, "context": 32,
                                "vocab": 384, "mlpRatio": 4}}
            run_spec = net.write_run_spec(f"honest-{i}", **dict(RUN, seed=str(5000 + i),
                                                                model=model))
            outcome = self.run_attack("none", run_spec, honest=net.hosts)
            outcome["seed"] = 5000 + i
            self.report(outcome)
            with self.subTest(seed=5000 + i):
                self.assertEqual(len(outcome["roots"]), 1, outcome)
                self.assertFalse(any(outcome["marks"].values()), outcome)
                self.assertFalse(any(outcome["rejected"].values()), outcome)
                for h in net.hosts:
                    self.assertGreater(outcome["paid"][h.name], 0, f"{h.name}: {outcome}")

    def check(self, outcome, honest):
        attack = outcome["attack"]
        self.assertEqual(len(outcome["roots"]), 1, f"{attack}: honest hosts disagree: {outcome}")
        for h in self.byzantine:
            self.assertGreater(outcome["marks"][h.name], 0, f"{attack}: {h.name} not marked")
            self.assertEqual(outcome["paid"][h.name], 0, f"{attack}: {h.name} was paid")
        # Paid in full: at least the escrow's n-th share for each of the paid rounds it
        # contributed (its share were every host honest and in every round).
        n = len(self.net.hosts)
        for h in self.honest:
            self.assertEqual(outcome["marks"][h.name], 0, f"{attack}: honest {h.name} marked")
            full = ESCROW * outcome["paid_rounds"][h.name] // (n * PAID_ROUNDS)
            self.assertGreaterEqual(outcome["paid"][h.name], full,
                                    f"{attack}: honest {h.name} paid less than in full")
        base = honest["final_eval_loss"]
        self.assertLessEqual(outcome["final_eval_loss"] - base, LOSS_TOLERANCE * base,
                             f"{attack}: final eval loss {outcome['final_eval_loss']:.4f} vs "
                             f"{base:.4f} in the honest run")

    def report(self, outcome, honest=None):
        """One JSON line per run (scripts/attack_suite.sh collects them)."""
        line = dict(outcome, roots=len(outcome["roots"]),
                    shape=f"{self.attackers}/{len(self.net.hosts)}")
        if honest is not None:
            line["loss_vs_honest"] = round(outcome["final_eval_loss"] /
                                           honest["final_eval_loss"], 4)
        print("ATTACK " + json.dumps(line, sort_keys=True), flush=True)


if __name__ == "__main__":
    unittest.main()
