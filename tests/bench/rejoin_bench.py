"""Rejoin benchmark: the time a SIGKILLed host takes to rejoin a training shard and contribute
again, as a multiple of the time its checkpoint takes across the link (checkpoint bytes / link
rate). Real devnet, real trainshardd hosts with their ts_worker processes, the real CLI, on
loopback (docs/training.md, "Catching up and joining"). Prints its figures and a final JSON line;
exits non-zero only when it cannot run (a step failed).

Three hosts open a shard and train a small GPT (the functional suite's run spec; --rounds,
--inner-steps, --layers, --d-model change it). Once round 2 is certified, a host that is not the
planner of the round in progress is SIGKILLed as that round is being planned; when the survivors
have certified a round without it, its trainshardd is started again (it resumes the run by
itself), and from that start the bench measures:

  listen       its operator address is written                                  (polled)
  answers      its operator (`host status`) answers                             (polled)
  resuming     the daemon resumes the stored run ("resuming run")
  worker       its worker process is up ("worker started")
  data         its data is built again ("data prepared")
  published    its data set is published again ("data set published")
  restarted    the round-0 checkpoint made and evaluated, its certificates read, its own last
               checkpoint loaded ("restarted at certified round")
  certs        the survivors' newer certificates verified ("caught up from")
  caught_up    the checkpoint fetched and loaded ("checkpoint of round N fetched ... and loaded")
  contributing it holds the certificate of a round it was a member of ("round N certified")

The phases from `resuming` on are the host's own log lines (millisecond timestamps, the same
clock); the bench also polls `shard train-status` every --poll-ms and prints when it saw the
host caught up and contributing. --repeats kills and restarts a host that many times, while the
run has rounds left. The checkpoint size is that of the checkpoint artifact the host fetched
(`trainshard artifact list` on it); the link rate is --link-mbit, nominal: every host is on
loopback, where the transfer itself takes far less. Then the run is left to settle, and every
host must end on the same root.

  TS_BUILD_DIR=build /usr/bin/python3 tests/bench/rejoin_bench.py [--repeats 2] [--rounds 16]
      [--inner-steps 8] [--link-mbit 100] [--verbose]
"""

import argparse
import json
import os
import platform
import re
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "functional"))
import harness  # noqa: E402
from test_training import certified, open_shard, wait_round, wait_settled  # noqa: E402

# Frozen weights of the three hosts: host2 and host3 each hold less than a third, so the other
# two keep a quorum (more than 2/3) without either of them.
HOST_WEIGHTS = (60, 50, 50)
# The phases in the host's log after the restart, in the order they happen: (key, how its
# message starts).
LOG_PHASES = [("resuming", "resuming run"), ("worker", "worker started"),
              ("data", "data prepared"), ("published", "data set "),
              ("restarted", "restarted at certified round"), ("certs", "caught up from"),
              ("caught_up", "checkpoint of round "), ("contributing", "round ")]
LOG_LINE = re.compile(r'^ts=(\d+) level=\w+ component=(\w+) msg=("(?:[^"\\]|\\.)*"|\S+)')
FETCHED = re.compile(r"checkpoint of round (\d+) fetched in ([\d.]+) s \((.*)\) and loaded$")
CERTIFIED = re.compile(r"round (\d+) certified \(")
FROM_PEER = re.compile(r"(.*) (\d+) KiB$")


def say(msg):
    print(msg, flush=True)


def members_of(status, after_round):
    """{round: members} of the certified rounds past `after_round` in a run status."""
    return {int(r["round"]): r.get("members", []) for r in status.get("rounds", [])
            if int(r["round"]) > after_round}


def fmt(seconds):
    return "-" if seconds is None else f"{seconds:.2f}s"


def log_messages(path, offset):
    """[(unix ms, component, message)] of the daemon log's lines past byte `offset`."""
    out = []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f.read().decode(errors="replace").splitlines():
            m = LOG_LINE.match(raw)
            if not m:
                continue
            msg = m.group(3)
            if msg.startswith('"'):
                msg = msg[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            out.append((int(m.group(1)), m.group(2), msg))
    return out


def log_phases(messages, t0_ms):
    """{phase: seconds since t0_ms} of the first log line of each phase, and the fetches."""
    phases, fetches = {}, []
    for ts, component, msg in messages:
        if component != "shard_run":
            continue
        f = FETCHED.match(msg)
        if f:
            by_peer = {}
            for part in f.group(3).split(", "):
                peer = FROM_PEER.match(part)
                if peer:
                    by_peer[peer.group(1)] = int(peer.group(2)) << 10
            fetches.append({"round": int(f.group(1)), "seconds": float(f.group(2)),
                            "bytes_by_peer": by_peer, "at_s": round((ts - t0_ms) / 1000, 3)})
        for key, prefix in LOG_PHASES:
            if key in phases or not msg.startswith(prefix):
                continue
            if key == "caught_up" and not f:
                continue
            if key == "contributing":
                c = CERTIFIED.match(msg)
                if not c:
                    continue
                phases["contributing_round"] = int(c.group(1))
            phases[key] = (ts - t0_ms) / 1000
    return phases, fetches


class Bench:
    def __init__(self, args):
        self.args = args
        self.link = args.link_mbit * 1e6 / 8  # bytes/s
        self.repeats = []

    def setup(self):
        a = self.args
        self.net = harness.Network(keep=a.keep, host_weights=HOST_WEIGHTS)
        net = self.net
        net.init()
        net.start_devnet()
        for i in range(1, len(HOST_WEIGHTS) + 1):
            net.add_host(f"host{i}", extra_config={"worker_threads": a.worker_threads})
        for h in net.hosts:
            h.wait_shard_listen()
        model = {"kind": "gpt", "seed": "7",
                 "config": {"layers": a.layers, "dModel": a.d_model, "heads": 4, "context": 32,
                            "vocab": 384, "mlpRatio": 4}}
        self.run_spec = net.write_run_spec("rejoin", rounds=a.rounds, innerSteps=a.inner_steps,
                                           evalEvery=a.rounds, model=model)
        with open(self.run_spec) as f:
            spec = json.load(f)
        self.sid = open_shard(net, "rejoin", self.run_spec, min_nodes=3, max_nodes=3)
        for h in net.hosts:
            net.start_run(h, self.sid, self.run_spec)
        say(f"devnet {net.chain}; hosts {[h.name for h in net.hosts]} on loopback, weights "
            f"{HOST_WEIGHTS}, worker_threads {a.worker_threads}; shard {self.sid}: {a.rounds} "
            f"rounds of {a.inner_steps} inner steps, GPT {a.layers} layers, d_model "
            f"{a.d_model}; join window {spec['joinWindowMs']} ms, exchange timeout "
            f"{spec['exchangeTimeoutMs']} ms; work dir {net.root}")

    def total_weight(self):
        return sum(HOST_WEIGHTS)

    def weight(self, host):
        return HOST_WEIGHTS[self.net.hosts.index(host)]

    def pick_victim(self):
        """A host whose loss leaves a quorum and that is not the planner any host names for the
        round in progress; (victim, planners, certified round)."""
        net = self.net
        statuses = [net.train_status(h, self.sid) for h in net.hosts]
        r = min(int(s.get("certified_round", 0)) for s in statuses)
        # A host names the planner of a round once its inner steps are done (current_round is
        # then the round in progress); before, the planner it names is the last round's.
        planners = {s.get("planner", "") for s in statuses
                    if int(s.get("current_round", 0)) > int(s.get("certified_round", 0))}
        if not planners:
            return None, planners, r
        total = self.total_weight()
        for h in net.hosts:
            if h.address not in planners and (total - self.weight(h)) * 3 > total * 2:
                return h, planners, r
        return None, planners, r

    def kill(self, k):
        """SIGKILLs a host, waits for a round certified without it; (victim, observer, kill
        round, round without it, seconds to it, certified round at the restart)."""
        net, sid, a = self.net, self.sid, self.args
        victim = None
        deadline = time.monotonic() + a.timeout
        while victim is None:
            victim, planners, r_kill = self.pick_victim()
            if victim is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no host to kill: planners {planners}")
                time.sleep(0.1)
        observer = next(h for h in net.hosts if h is not victim)
        before = set(net.train_status(observer, sid).get("transitions", []))
        victim.process.kill(signal.SIGKILL)
        t_kill = time.monotonic()
        say(f"repeat {k}: SIGKILL {victim.name} (weight {self.weight(victim)} of "
            f"{self.total_weight()}) after round {r_kill} is certified; planner(s) of the round in "
            f"progress: {[h.name for h in net.hosts if h.address in planners]}")

        def without():
            rounds = members_of(net.train_status(observer, sid), r_kill)
            done = [r for r, m in rounds.items() if victim.address not in m]
            return min(done) if done else None
        r_without = harness.wait_for(without, a.timeout, "a round certified without "
                                     f"{victim.name}", interval_s=0.2)
        detect_s = time.monotonic() - t_kill
        r_restart = certified(net, observer, sid)
        new = [t for t in net.train_status(observer, sid).get("transitions", [])
               if t not in before]
        failed = [t for t in new if " failed" in t]
        say(f"  the survivors certified round {r_without} without it {detect_s:.2f}s after the "
            f"kill ({len(failed)} failed attempt(s) first); restart at certified round "
            f"{r_restart}")
        for t in (new if a.verbose else failed):
            say(f"    {observer.name} | {t[:400]}")
        return victim, observer, r_kill, r_without, detect_s, r_restart

    def one(self, k):
        net, sid, a = self.net, self.sid, self.args
        victim, observer, r_kill, r_without, detect_s, r_restart = self.kill(k)

        log_offset = os.path.getsize(victim.process.log_path)
        t0_ms = time.time() * 1000
        t0 = time.monotonic()
        victim.start()
        polled = {"listen": time.monotonic() - t0}
        harness.wait_for(lambda: victim.status() is not None, a.timeout,
                         f"{victim.name}'s operator to answer", interval_s=0.02)
        polled["answers"] = time.monotonic() - t0
        artifact = None  # (summary, source) of the checkpoint artifact it fetched
        status = {}
        answered = []  # when each train-status answer came
        ended = False  # the run reached its last round without this host
        while True:
            now = time.monotonic() - t0
            if now > a.timeout:
                raise TimeoutError(f"{victim.name} not contributing {a.timeout}s after its "
                                   f"restart; transitions {status.get('transitions', [])[-20:]}")
            if not victim.process.alive():
                raise RuntimeError(f"{victim.name} exited:\n{victim.process.log_tail()}")
            if artifact is None:
                # The artifact it fetched, listed as soon as its log has the fetch, before the
                # host takes part in a round and collects it.
                _, fetches = log_phases(log_messages(victim.process.log_path, log_offset), t0_ms)
                if fetches:
                    artifact = self.checkpoint_artifact(victim, fetches[0]["round"])
            status = net.train_status(victim, sid, check=False)
            now = time.monotonic() - t0  # when the answer came
            if status:
                answered.append(now)
                polled.setdefault("resumed", now)
                if status.get("state") == "failed":
                    raise RuntimeError(f"{victim.name}'s run failed: {status.get('error')}")
                if "caught_up" not in polled and any(
                        FETCHED.match(t.split(" ", 1)[-1]) for t in status.get("transitions", [])):
                    polled["caught_up"] = now
            seen = net.train_status(observer, sid)
            done = [r for r, m in members_of(seen, r_restart).items() if victim.address in m]
            if done:
                polled["contributing"] = time.monotonic() - t0
                break
            if int(seen.get("certified_round", 0)) >= a.rounds:
                ended = True
                break
            time.sleep(a.poll_ms / 1000.0)

        # The host's own log lines; its "round N certified" may come a moment after the
        # observer's.
        def from_log():
            p, f = log_phases(log_messages(victim.process.log_path, log_offset), t0_ms)
            return (p, f) if ended or "contributing" in p else None
        phases, fetches = harness.wait_for(from_log, 30, f"{victim.name}'s log of the round",
                                           interval_s=0.1)
        contributed = phases.pop("contributing_round", None)
        if artifact is None and fetches:
            artifact = self.checkpoint_artifact(victim, fetches[0]["round"])
        if artifact is None:
            raise RuntimeError(f"no checkpoint artifact in {victim.name}'s store")
        artifact, ckpt_source = artifact
        ckpt_bytes = int(artifact["total_bytes"])
        nominal = ckpt_bytes / self.link
        rounds = net.train_status(observer, sid).get("rounds", [])

        def median_of(field, pick):
            values = [float(r.get(field, 0)) for r in rounds if pick(r)]
            return round(statistics.median(values), 3) if values else None
        full = lambda r: len(r["members"]) == len(net.hosts) and int(r["round"]) <= r_kill  # noqa
        short = lambda r: victim.address not in r["members"]  # noqa
        gaps = [y - x for x, y in zip(answered, answered[1:])]
        rec = {
            "victim": victim.name, "killed_after_round": r_kill,
            "round_without": r_without, "detect_s": round(detect_s, 3),
            "restart_at_round": r_restart, "contributed_round": contributed,
            "complete": not ended and "caught_up" in phases and "contributing" in phases,
            "phases_s": {key: round(v, 3) for key, v in phases.items()},
            "polled_s": {key: round(v, 3) for key, v in polled.items()},
            "checkpoint_round": int(artifact["round"]), "checkpoint_source": ckpt_source,
            "checkpoint_bytes": ckpt_bytes, "checkpoint_files": int(artifact["files"]),
            "checkpoint_chunks": int(artifact["chunks"]),
            "round0_checkpoint_bytes": int(status.get("checkpoint_bytes", 0)),
            "fetches": fetches,
            "nominal_transfer_s": round(nominal, 4),
            "caught_up_multiple": round(phases["caught_up"] / nominal, 2)
            if nominal and "caught_up" in phases else None,
            "rejoin_multiple": round(phases["contributing"] / nominal, 2)
            if nominal and "contributing" in phases else None,
            "round_s_all_members": median_of("round_seconds", full),
            "inner_s_all_members": median_of("inner_seconds", full),
            "round_s_without_it": median_of("round_seconds", short),
            "status_polls": len(answered),
            "longest_poll_gap_s": round(max(gaps), 3) if gaps else None,
        }
        self.report(rec, status)
        self.repeats.append(rec)
        return rec

    def checkpoint_artifact(self, host, rnd):
        """(summary, source) of the complete checkpoint artifact of round `rnd` in the host's
        store; when the host has collected it already, of its newest checkpoint artifact, which
        has the same layout (parameters and outer momentum); None when it holds none."""
        listed = self.net.artifact(host, "list", "--shard", self.sid).get("artifacts", [])
        ckpts = [x for x in listed if x.get("kind") == "checkpoint" and x.get("complete")]
        for x in ckpts:
            if int(x.get("round", 0)) == rnd:
                return x, "the fetched artifact"
        if ckpts:
            x = max(ckpts, key=lambda x: int(x.get("round", 0)))
            return x, (f"round {x.get('round', 0)}'s artifact (round {rnd}'s fetched one was "
                       f"collected before it was listed; same layout)")
        return None

    def report(self, rec, status):
        p, q = rec["phases_s"], rec["polled_s"]
        say("  from the restart (the host's log): " +
            ", ".join(f"{key} {fmt(p.get(key))}" for key, _ in LOG_PHASES))
        steps, prev = [], 0.0
        for key, _ in LOG_PHASES:
            if key in p:
                steps.append(f"{key} +{p[key] - prev:.2f}s")
                prev = p[key]
        say(f"  phase by phase: {', '.join(steps)}")
        say(f"  as polled (every {self.args.poll_ms} ms; {rec['status_polls']} status answers, "
            f"longest gap {fmt(rec['longest_poll_gap_s'])}; each when the answer came): "
            f"operator address written {fmt(q['listen'])}, operator answers "
            f"{fmt(q['answers'])}, run status answers "
            f"{fmt(q.get('resumed'))}, caught up {fmt(q.get('caught_up'))}, contributing "
            f"{fmt(q.get('contributing'))}")
        for f in rec["fetches"]:
            say(f"  fetch of round {f['round']}'s checkpoint at {f['at_s']:.2f}s: "
                f"{f['seconds']:.3f}s by the sidecar's own timer (fetch, export, load), bytes by "
                f"peer {f['bytes_by_peer']}")
        say(f"  checkpoint: {rec['checkpoint_source']}, round {rec['checkpoint_round']}, "
            f"{rec['checkpoint_bytes']} bytes, {rec['checkpoint_files']} file(s), "
            f"{rec['checkpoint_chunks']} chunk(s) (the round-0 checkpoint, without outer "
            f"momentum: {rec['round0_checkpoint_bytes']}); at a nominal "
            f"{self.args.link_mbit:g} Mbit/s {rec['nominal_transfer_s']:.3f}s")
        say(f"  the survivors' median round (inner steps + exchange, without waiting for a plan): "
            f"{fmt(rec['round_s_all_members'])} with every member (inner steps "
            f"{fmt(rec['inner_s_all_members'])}), {fmt(rec['round_s_without_it'])} without "
            f"{rec['victim']}")
        if not rec["complete"]:
            say(f"  the run reached its last round before {rec['victim']} took part in one: this "
                f"repeat is left out of the medians (raise --rounds)")
        else:
            say(f"  caught up (checkpoint loaded) {fmt(p['caught_up'])} = "
                f"{rec['caught_up_multiple']}x the nominal transfer; contributing again (member "
                f"of round {rec['contributed_round']}) {fmt(p['contributing'])} = "
                f"{rec['rejoin_multiple']}x")
        if self.args.verbose:
            for t in status.get("transitions", []):
                say(f"    {rec['victim']} | {t[:400]}")

    def settle(self):
        net, sid = self.net, self.sid
        wait_settled(net, sid, timeout_s=self.args.timeout)
        wait_round(net, net.hosts, sid, self.args.rounds, timeout_s=self.args.timeout)
        roots = {net.train_status(h, sid)["root"] for h in net.hosts}
        if len(roots) != 1:
            raise RuntimeError(f"the hosts end on different roots: {roots}")
        record = net.cli("shard", "settlement", "--id", sid)["settlement"]
        paid = {p["host"]: int(p["rounds_contributed"]) for p in record["payouts"]}
        contributed = {h.name: paid.get(h.address, 0) for h in net.hosts}
        say(f"settled: every host on root {harness.b64_to_hex(roots.pop())[:16]}; rounds "
            f"contributed {contributed}")
        return contributed

    def run(self):
        a = self.args
        say(f"rejoin_bench: {a.repeats} repeat(s), {a.rounds} rounds of {a.inner_steps} inner "
            f"steps, nominal link {a.link_mbit:g} Mbit/s; {platform.node()}, {os.cpu_count()} "
            f"cores, load {os.getloadavg()[0]:.1f}, {platform.platform()}")
        say("the hosts are on loopback: the link rate is nominal, not the rate the checkpoint "
            "crossed at")
        contributed = {}
        skipped = 0
        try:
            self.setup()
            wait_round(self.net, self.net.hosts, self.sid, 2, timeout_s=a.timeout)
            need = a.rounds_per_repeat
            for k in range(1, a.repeats + 1):
                left = a.rounds - certified(self.net, self.net.hosts[0], self.sid)
                if left < need:
                    skipped = a.repeats - k + 1
                    say(f"repeat {k}: {left} rounds left, a repeat takes about {need}; "
                        f"{skipped} repeat(s) not run (raise --rounds)")
                    break
                rec = self.one(k)
                if not rec["complete"]:
                    skipped = a.repeats - k
                    break
                # The next repeat needs as many rounds as this one took, and some margin.
                need = max(need, (rec["contributed_round"] - rec["killed_after_round"]) * 3 // 2)
                # The next kill once every host holds the round it rejoined in.
                wait_round(self.net, self.net.hosts, self.sid, rec["contributed_round"],
                           timeout_s=a.timeout)
            contributed = self.settle()
        finally:
            self.net.cleanup()
        if not any(r["complete"] for r in self.repeats):
            raise RuntimeError("no repeat saw the host contribute again: raise --rounds")
        self.summary(contributed, skipped)

    def summary(self, contributed, skipped):
        a = self.args
        done = [r for r in self.repeats if r["complete"]]

        def med(key, where="phases_s"):
            return round(statistics.median(r[where][key] for r in done), 3)
        mult = round(statistics.median(r["rejoin_multiple"] for r in done), 2)
        caught = round(statistics.median(r["caught_up_multiple"] for r in done), 2)
        ckpt = statistics.median(r["checkpoint_bytes"] for r in done)
        detect = round(statistics.median(r["detect_s"] for r in done), 3)
        for r in done:
            p = r["phases_s"]
            say(f"{r['victim']}: answers {r['polled_s']['answers']:.2f}s, caught up "
                f"{p['caught_up']:.2f}s ({r['caught_up_multiple']}x), contributing "
                f"{p['contributing']:.2f}s ({r['rejoin_multiple']}x); dropped after "
                f"{r['detect_s']:.2f}s")
        say(f"median of {len(done)} repeat(s), from the restart: sidecar answers "
            f"{med('answers', 'polled_s'):.2f}s, worker up {med('worker'):.2f}s, data built "
            f"{med('data'):.2f}s, caught up {med('caught_up'):.2f}s, contributing "
            f"{med('contributing'):.2f}s; checkpoint {ckpt:.0f} bytes = {ckpt / self.link:.3f}s "
            f"at a nominal {a.link_mbit:g} Mbit/s (the link is loopback): rejoin = {mult}x "
            f"(checkpoint size / link rate), caught up = {caught}x; the survivors dropped the "
            f"killed host after {detect:.2f}s")
        results = {
            "bench": "rejoin", "link": "loopback", "link_mbit_nominal": a.link_mbit,
            "rounds": a.rounds, "inner_steps": a.inner_steps, "layers": a.layers,
            "d_model": a.d_model, "worker_threads": a.worker_threads,
            "repeats_run": len(done), "repeats_incomplete": len(self.repeats) - len(done),
            "repeats_skipped": skipped,
            "median_answers_s": med("answers", "polled_s"),
            "median_worker_s": med("worker"), "median_data_s": med("data"),
            "median_caught_up_s": med("caught_up"),
            "median_contributing_s": med("contributing"),
            "median_checkpoint_bytes": int(ckpt),
            "median_rejoin_multiple": mult, "median_caught_up_multiple": caught,
            "median_detect_s": detect,
            "rounds_contributed": contributed, "repeats": self.repeats,
            "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
        }
        print(json.dumps(results), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="kill/restart cycles")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--inner-steps", type=int, default=8)
    p.add_argument("--layers", type=int, default=2, help="GPT layers (the checkpoint's size)")
    p.add_argument("--d-model", type=int, default=64, help="GPT width, a multiple of 4")
    p.add_argument("--link-mbit", type=float, default=100,
                   help="nominal link rate the multiple is taken against (the hosts are on "
                        "loopback)")
    p.add_argument("--worker-threads", type=int, default=1)
    p.add_argument("--rounds-per-repeat", type=int, default=5,
                   help="rounds the first repeat needs left in the run, or it is not started "
                        "(later ones: 1.5x the rounds the previous one took)")
    p.add_argument("--poll-ms", type=int, default=200, help="status polling interval")
    p.add_argument("--timeout", type=int, default=600, help="seconds any one wait may take")
    p.add_argument("--verbose", action="store_true", help="print the hosts' transitions")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats: {args.repeats} is below 1")
    if args.rounds < 2 + args.rounds_per_repeat:
        p.error(f"--rounds: {args.rounds} leaves no round for a repeat after round 2")
    if args.d_model < 4 or args.d_model % 4:
        p.error(f"--d-model: {args.d_model} is not a positive multiple of 4")
    if args.link_mbit <= 0:
        p.error("--link-mbit must be positive")
    Bench(args).run()


if __name__ == "__main__":
    main()
