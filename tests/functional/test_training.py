"""Training in a shard (docs/training.md), multi-process on loopback: devnet, trainshardd hosts,
their ts_worker processes, the CLI.

- 3 hosts (workers with different thread counts) train a small GPT for a few DiLoCo rounds: the
  eval loss at the end is below the round-0 checkpoint's by a stated margin, every host holds the
  same final root, and the settlement the hosts draft, sign and submit themselves lands.
- Determinism: a second shard with the same run and members ends on the same root, its
  pseudo-gradients exchanged as fp32-zstd (lossless: fp32's bits).
- Elastic: 4 hosts; one joins mid-run; an ordinary host and then a round's planner are SIGKILLed
  mid-run and the rounds go on without them; restarted, each rejoins from the certified
  checkpoint and contributes again; the same again with overlap.
- Overlap: 3 hosts train with each round's allreduce during the next round's inner steps.
- Bad input: a run spec that does not match the shard, a malformed one, an unknown model; a
  corrupt data shard, a killed worker and a killed shard process are recovered from.
"""

import base64
import hashlib
import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

# The final eval loss must be at least this far (nats) below the round-0 checkpoint's.
LOSS_MARGIN = 0.4
# A shard process whose run is done is stopped after this long (trainshardd.toml).
IDLE_STOP_MS = 3000


def worker_pid_of(status):
    """The pid the run's latest "worker started (pid N, ...)" transition names."""
    pids = [int(t.split("worker started (pid ")[1].split(",")[0])
            for t in status.get("transitions", [])
            if "worker started (pid " in t]
    return pids[-1] if pids else 0


def shard_process_pids(host, sid):
    """The live processes of `host`'s ts_shard for shard `sid`."""
    want = f"--shard-id\0{sid}\0--shards-dir\0{os.path.abspath(host.data_dir)}/shards\0"
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline") as f:
                cmdline = f.read()
        except OSError:
            continue
        if want in cmdline and process_running(int(name)):
            pids.append(int(name))
    return pids


def process_running(pid):
    """True while `pid` exists and is not a zombie (a reaped or exited process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def certified(net, host, sid):
    s = net.train_status(host, sid, check=False)
    return int(s.get("certified_round", 0)) if isinstance(s, dict) else 0


def wait_round(net, hosts, sid, r, timeout_s=300):
    harness.wait_for(lambda: all(certified(net, h, sid) >= r for h in hosts), timeout_s,
                     f"round {r} certified on {[h.name for h in hosts]}", interval_s=0.5)


def wait_settled(net, sid, timeout_s=300):
    net.wait_shard_status(sid, "SHARD_STATUS_SETTLED", timeout_s)


def open_shard(net, name, run_spec, on_chain=False, status="SHARD_STATUS_RUNNING", **kwargs):
    """Proposes and passes a shard pinning `run_spec`; with on_chain, the proposal carries the
    document and the hosts start the run by themselves. Waits for `status`."""
    spec = net.write_spec(name, run_spec=run_spec, max_duration=6000, window=100, **kwargs)
    voters = tuple(h.name for h in net.hosts)
    pid, sid = net.propose_and_pass(spec, voters=voters,
                                    run_spec=run_spec if on_chain else None)
    net.wait_shard_status(sid, status, 90)
    return sid


class TrainTest(unittest.TestCase):
    def setUp(self):
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")))
        self.net.init()
        self.net.start_devnet()
        for i, threads in enumerate((1, 2, 1), start=1):
            # host2 lets its workers choose (auto: CUDA where there is one, the CPU here).
            device = '"auto"' if i == 2 else '"cpu"'
            self.net.add_host(f"host{i}", extra_config={"worker_threads": threads,
                                                        "worker_device": device,
                                                        "shard_idle_stop_ms": IDLE_STOP_MS,
                                                        "worker_memory_bytes_max": 2 << 30})
        for h in self.net.hosts:
            h.wait_shard_listen()

    def tearDown(self):
        self.net.cleanup()

    def run_shard(self, name, run_spec, during=None):
        """Opens a shard, starts its run on every host, calls during(sid) if given, and waits
        until the shard is settled and every run done."""
        net = self.net
        sid = open_shard(net, name, run_spec, min_nodes=3, max_nodes=3)
        for h in net.hosts:
            net.start_run(h, sid, run_spec)
        if during is not None:
            during(sid)
        wait_settled(net, sid)
        harness.wait_for(lambda: all(net.train_status(h, sid, check=False).get("state") == "done"
                                     for h in net.hosts), 60, "every run done")
        return sid

    def test_train_settle_and_determinism(self):
        net = self.net
        run_spec = net.write_run_spec("train", rounds=4, innerSteps=30)
        before = {h.address: net.balance(h.address) for h in net.hosts}

        def bogus_settlement_refused(sid):
            # While the hosts train, a settlement drafted by hand (any root, any payouts) is
            # refused by every host, and takes nothing from the honest one that follows.
            payouts = [a for h in net.hosts for a in ("--work", f"{h.address}=4")]
            out = net.cli("shard", "settle", "--id", sid, "--hosts",
                          ",".join(h.operator for h in net.hosts), "--final-root", "ab" * 32,
                          *payouts, "--submit-via", net.hosts[0].operator, check=False)
            self.assertNotEqual(out.returncode, 0, out.stdout)
            for h in net.hosts:
                self.assertIn(f"host {h.operator} did not sign", out.stderr)
            self.assertRegex(out.stderr, "certify [0-9]+ of 4 rounds|no training records")
            # Nor is there a draft to take from a host's records yet.
            early = net.cli("shard", "settle", "--id", sid, "--hosts", net.hosts[0].operator,
                            "--draft-from", net.hosts[0].operator, "--submit-via",
                            net.hosts[0].operator, check=False)
            self.assertEqual(early.returncode, 1, early.stderr)
            self.assertRegex(early.stderr, "certify [0-9]+ of 4 rounds|no training records")
        sid = self.run_shard("train-a", run_spec, during=bogus_settlement_refused)
        statuses = [net.train_status(h, sid) for h in net.hosts]
        roots = {s["root"] for s in statuses}
        self.assertEqual(len(roots), 1, f"hosts hold different final roots: {roots}")
        for s in statuses:
            self.assertEqual(int(s["certified_round"]), 4)
            self.assertEqual(s["state"], "done", s.get("transitions"))
        s = statuses[0]
        initial = int(s["initial_eval_loss_micro"]) / 1e6
        final = int(s["rounds"][-1]["eval_loss_micro"]) / 1e6
        self.assertLess(final, initial - LOSS_MARGIN,
                        f"eval loss {initial:.3f} -> {final:.3f}: not down by {LOSS_MARGIN}")
        record = net.cli("shard", "settlement", "--id", sid)
        settlement = record["settlement"]
        self.assertEqual(settlement["final_checkpoint_root"], s["root"])
        self.assertEqual(int(settlement["rounds_completed"]), 4)
        self.assertEqual(int(settlement["evaluation"]["value_micro"]),
                         int(s["rounds"][-1]["eval_loss_micro"]))
        # What each host's records imply is exactly what was settled on chain.
        for h in net.hosts:
            implied = net.cli("shard", "draft", "--id", sid, "--host", h.operator)
            self.assertEqual(implied, settlement, f"{h.name}'s records imply another settlement")
        paid = {p["host"]: int(p["amount"]) for p in settlement["payouts"]}
        for h in net.hosts:
            self.assertGreater(paid.get(h.address, 0), 0, f"{h.name} was not paid")
            self.assertEqual(net.balance(h.address) - before[h.address], paid[h.address])
        # Every round's members agree on the thread-count-independent outer step: each
        # certificate carries the signatures of all its members (a host the loaded machine kept
        # out of a round's plan is not among them), and some round has all three.
        weight = dict(zip((h.address for h in net.hosts), net.host_weights))
        for r in s["rounds"]:
            self.assertEqual(int(r["signed_weight"]), sum(weight[m] for m in r["members"]), r)
        self.assertTrue(any(len(r["members"]) == 3 for r in s["rounds"]), s["rounds"])

        # `trainshard eval` on the final checkpoint artifact, by another host.
        art = statuses[1]["final_checkpoint_artifact_id"]
        ev = net.cli("eval", "--shard", sid, "--artifact",
                     harness.b64_to_hex(art), "--host", net.hosts[2].operator,
                     "--windows-max", "64", timeout=300)
        self.assertEqual(ev["evaluation"]["result"]["checkpoint_root"], s["root"])
        self.assertAlmostEqual(int(ev["evaluation"]["result"]["loss_micro"]) / 1e6, final,
                               delta=0.05)

        # Once a run has been done for IDLE_STOP_MS its process is stopped: its status is still
        # answered (as the sidecar saw it last), and `trainshard eval` starts it again.
        for h in net.hosts:
            harness.wait_for(lambda h=h: not shard_process_pids(h, sid), 60,
                             f"{h.name}'s process of the finished shard to be stopped")
            stopped = net.train_status(h, sid)
            self.assertEqual(int(stopped.get("shard_process_pid", 0)), 0)
            self.assertEqual(stopped["state"], "done")
            self.assertEqual(stopped["root"], s["root"])
        again_ev = net.cli("eval", "--shard", sid, "--artifact",
                           harness.b64_to_hex(art), "--host", net.hosts[2].operator,
                           "--windows-max", "64", timeout=300)
        self.assertEqual(again_ev["evaluation"]["result"]["checkpoint_root"], s["root"])
        self.assertEqual(again_ev["evaluation"]["result"]["loss_micro"],
                         ev["evaluation"]["result"]["loss_micro"])
        self.assertTrue(shard_process_pids(net.hosts[2], sid), "eval did not start the process")

        # Determinism: the same run and members again, in another shard, with the pseudo-gradients
        # exchanged as fp32-zstd — lossless, so every round's mean and the final root are fp32's.
        lossless = net.write_run_spec("train-lossless", rounds=4, innerSteps=30,
                                      codec="fp32-zstd")
        sid2 = self.run_shard("train-b", lossless)
        again = net.train_status(net.hosts[0], sid2)
        self.assertEqual(again["root"], s["root"],
                         "the same seed with the lossless codec gave another final root")

    def test_packed_dataset_trains_a_llama(self):
        """A user's text packed into a dataset by one host's operator, published as an artifact;
        a llama run spec pins it by root; the other members find it, fetch it, check it, and
        the three hosts train the tiny llama on it to settlement, the loss down, one root."""
        net = self.net
        # The user's files: paragraphs of English (fortunes, one per paragraph), in a folder.
        src = os.path.join(net.root, "my-text")
        os.makedirs(src)
        for name in ("fortunes", "literature", "wisdom", "people", "science"):
            with open(os.path.join("/usr/share/games/fortunes", name), errors="replace") as f:
                entries = [e.strip() for e in f.read().split("\n%\n") if e.strip()]
            with open(os.path.join(src, f"{name}.txt"), "w") as f:
                f.write("\n\n".join(entries) + "\n")
        dataset = os.path.join(net.root, "my-dataset")
        packed = net.cli("data", "pack", "--input", src, "--vocab", "384", "--shard-tokens",
                         "16384", "--eval-every", "20", "--out", dataset)
        self.assertGreater(int(packed["train_tokens"]), 100000, packed)
        root_b64 = base64.b64encode(bytes.fromhex(packed["root"])).decode()
        run_spec = net.write_run_spec(
            "packed", rounds=4, innerSteps=30,
            model={"kind": "llama", "preset": "tiny", "seed": "7",
                   "config": {"vocab": 384, "context": 32}},
            data={"corpus": "packed", "vocab": 384, "datasetRoot": root_b64},
            training={"microBatch": 4, "schedule": "cosine", "warmupSteps": "10",
                      "minLrRatio": 0.1})
        # The proposal carries the run spec: no operator starts the run, the hosts do.
        sid = open_shard(net, "packed", run_spec, on_chain=True, min_nodes=3, max_nodes=3)
        with open(run_spec, "rb") as f:
            self.assertEqual(net.shard(sid)["spec"]["run_spec"],
                             base64.b64encode(f.read()).decode())
        # Host 1's operator publishes the dataset into the shard; the others find it there
        # (their runs, started already, wait for it).
        published = net.artifact(net.hosts[0], "publish", "--shard", sid, "--dir", dataset,
                                 "--kind", "dataset")
        self.assertTrue(published["done"], published)
        wait_settled(net, sid)
        harness.wait_for(lambda: all(net.train_status(h, sid, check=False).get("state") == "done"
                                     for h in net.hosts), 60, "every run done")
        statuses = [net.train_status(h, sid) for h in net.hosts]
        self.assertEqual(len({s["root"] for s in statuses}), 1, "hosts hold different roots")
        s = statuses[0]
        initial = int(s["initial_eval_loss_micro"]) / 1e6
        final = int(s["rounds"][-1]["eval_loss_micro"]) / 1e6
        self.assertLess(final, initial - LOSS_MARGIN, f"eval loss {initial:.3f} -> {final:.3f}")
        # Each certified round is timed in its parts, which add up to less than the whole.
        for r in s["rounds"]:
            parts = [float(r.get(k, 0)) for k in ("inner_seconds", "exchange_seconds",
                                                  "certify_seconds")]
            self.assertTrue(all(p > 0 for p in parts), r)
            self.assertLessEqual(sum(parts), float(r["round_seconds"]) + 1e-3, r)
            self.assertGreater(float(r.get("publish_seconds", 0)), 0, r)
        for h, st in zip(net.hosts[1:], statuses[1:]):
            self.assertTrue(any("fetched as artifact" in t for t in st.get("transitions", [])),
                            f"{h.name} did not fetch the dataset: {st.get('transitions')}")
        for h in net.hosts:
            with open(h.process.log_path, errors="replace") as f:
                self.assertIn("started the shard's run from its chain spec", f.read())
            starts = net.cli("host", "status", "--host", h.operator).get("run_starts", [])
            mine = [r for r in starts if r["shard_id"] == sid]
            self.assertTrue(mine and mine[0].get("started") and mine[0].get("attempts", 0) >= 1,
                            starts)

        # The result in the payer's hands: the creator, not a member, fetches the settled
        # checkpoint and its tokenizer from the members; the root is the settlement's.
        final_root = base64.b64decode(net.cli("shard", "settlement", "--id", sid)["settlement"][
            "final_checkpoint_root"]).hex()
        model_dir = os.path.join(net.root, "my-model")
        fetched = net.cli("model", "fetch", "--shard", sid, "--out", model_dir, key="creator",
                          timeout=120)
        self.assertEqual(fetched["root"], final_root)
        with open(fetched["checkpoint"], "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), final_root)
        exported = net.cli("model", "export", "--checkpoint", fetched["checkpoint"],
                           "--tokenizer", fetched["tokenizer"], "--out",
                           os.path.join(net.root, "my-model-hf"))
        self.assertEqual(exported["root"], final_root)
        self.assertEqual(sorted(os.listdir(exported["out"])),
                         ["config.json", "model.safetensors", "tokenizer.model"])
        written = net.cli("model", "generate", "--checkpoint", fetched["checkpoint"],
                          "--tokenizer", fetched["tokenizer"], "--prompt", "The", "--max-tokens",
                          "12", "--samples", "2", timeout=120)
        self.assertEqual(written["root"], final_root)
        self.assertEqual(len(written["samples"]), 2)
        for text in written["samples"]:
            self.assertTrue(text.startswith("The") and len(text) > 3, text)
        # An outsider is refused by every member, and nothing is left where it asked.
        refused = net.cli("model", "fetch", "--shard", sid, "--out",
                          os.path.join(net.root, "stolen"), key="outsider", check=False,
                          json_out=False, timeout=120)
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("is neither a member nor a reader of shard", refused.stderr)
        self.assertFalse(any(n.startswith(".partial-stolen") or n == "stolen"
                             for n in os.listdir(net.root)))

        # A run no host here can train (a 1 B-parameter model; each host declares 2 GiB for its
        # worker): every host refuses it before reserving, with the reason, and the shard stays
        # OPEN with no member.
        too_big = net.write_run_spec(
            "too-big", model={"kind": "llama", "preset": "1b", "seed": "7",
                              "config": {"vocab": 384, "context": 32}},
            data={"corpus": "packed", "vocab": 384, "datasetRoot": root_b64})
        big = open_shard(net, "too-big", too_big, on_chain=True, status="SHARD_STATUS_OPEN",
                         min_nodes=3, max_nodes=3)

        def skip_reason(h):
            shards = net.cli("host", "shards", "--host", h.operator).get("shards", [])
            return next((s.get("skip_reason", "") for s in shards if s["shard_id"] == big), "")

        for h in net.hosts:
            harness.wait_for(lambda: skip_reason(h), 60, f"{h.name} to decide on shard {big}")
            reason = skip_reason(h)
            self.assertIn("bytes of fp32 training state", reason)
            self.assertIn("2147483648 bytes of worker_memory_bytes_max", reason)
        self.assertEqual(net.shard(big).get("reservations", []), [])

        # Every worker said where it trains; a run that needs GPU workers is refused by these
        # CPU hosts (host2's "auto" found no CUDA) before they reserve.
        for h in net.hosts:
            self.assertEqual(net.train_status(h, sid)["worker_device"], "cpu")
        gpu_only = net.write_run_spec(
            "gpu-only", requirements={"device": "cuda"},
            model={"kind": "llama", "preset": "tiny", "seed": "7",
                   "config": {"vocab": 384, "context": 32}},
            data={"corpus": "packed", "vocab": 384, "datasetRoot": root_b64})
        big = open_shard(net, "gpu-only", gpu_only, on_chain=True, status="SHARD_STATUS_OPEN",
                         min_nodes=3, max_nodes=3)
        for h in net.hosts:
            harness.wait_for(lambda: skip_reason(h), 60, f"{h.name} to decide on shard {big}")
            self.assertEqual(skip_reason(h), "run spec: requirements.device \"cuda\" is not "
                                             "where this host's workers train (cpu)")
        self.assertEqual(net.shard(big).get("reservations", []), [])
        # A host told its workers train on CUDA, where there is none, does not start, and says
        # why.
        gpu_host = net.add_host("gpuhost", key_name="host1", start=False,
                                extra_config={"worker_device": '"cuda"'})
        with self.assertRaises(RuntimeError) as failed:
            gpu_host.start()
        self.assertIn("libtorch sees no CUDA device", str(failed.exception))

    def test_overlap_trains_and_settles(self):
        """The one-step-delayed outer update (docs/training.md "Overlap"): each round's
        allreduce runs during the next round's inner steps; the hosts still end on one root,
        the loss goes down and the settlement lands. The pseudo-gradients go as int8-zstd, whose
        frames vary in size, so a real run exercises the variable-size codec too."""
        net = self.net
        run_spec = net.write_run_spec("overlap", rounds=5, innerSteps=30, overlap=True,
                                      codec="int8-zstd")
        sid = self.run_shard("overlap", run_spec)
        statuses = [net.train_status(h, sid) for h in net.hosts]
        roots = {s["root"] for s in statuses}
        self.assertEqual(len(roots), 1, f"hosts hold different final roots: {roots}")
        s = statuses[0]
        self.assertEqual(int(s["certified_round"]), 5)
        for r in s["rounds"]:
            self.assertEqual(len(r["members"]), 3, r)
        initial = int(s["initial_eval_loss_micro"]) / 1e6
        final = int(s["rounds"][-1]["eval_loss_micro"]) / 1e6
        self.assertLess(final, initial - LOSS_MARGIN,
                        f"eval loss {initial:.3f} -> {final:.3f}: not down by {LOSS_MARGIN}")
        settlement = net.cli("shard", "settlement", "--id", sid)["settlement"]
        self.assertEqual(settlement["final_checkpoint_root"], s["root"])

    def test_replays_check_members_on_other_thread_counts(self):
        """Commitments and replays (docs/verification.md): every round's result commits each
        member's Δ; after it is certified, every member's steps are replayed by another member
        drawn from the certified root — the hosts' workers run 1, 2 and 1 threads, so a replay
        runs with the member's thread count — and each replay reproduces the honest member's
        commitment bit for bit."""
        net = self.net
        run_spec = net.write_run_spec("replays", rounds=3, codec="int8",
                                      verification={"commitments": True,
                                                    "replayRateBps": 10000})
        sid = self.run_shard("replays", run_spec)
        statuses = [net.train_status(h, sid) for h in net.hosts]
        self.assertEqual(len({s["root"] for s in statuses}), 1)
        replays = [int(s.get("replays", 0)) for s in statuses]
        passed = [int(s.get("replays_passed", 0)) for s in statuses]
        members_of = {}
        for s in statuses:
            for r in s["rounds"]:
                members_of[int(r["round"])] = len(r["members"])
        self.assertEqual(sorted(members_of), [1, 2, 3])
        members = sum(members_of.values())
        # Every member of every round is replayed once (a host that missed a round was not a
        # member of it), by a validator that holds the round's base.
        print(f"replays by host: {replays} of {members} member-rounds, all reproduced")
        self.assertEqual(sum(replays), members, statuses[0].get("transitions"))
        self.assertEqual(passed, replays, [s.get("transitions") for s in statuses])
        for s in statuses:
            self.assertFalse([t for t in s.get("transitions", []) if "replay" in t and
                              ("FAILED" in t or "not run" in t)], s.get("transitions"))
        # Scoring (docs/verification.md "Scoring", recorded by default with replays): each
        # member's claimed loss-delta scores were reproduced by the replays above on other
        # thread counts, and the settlement carries them: round 1's steps (the round it pays
        # for) lowered the held-out loss of every host that trained it (a host the loaded
        # machine kept out of round 1 has no tokens and no score), and nothing was left out.
        record = net.cli("shard", "settlement", "--id", sid)
        payouts = record["settlement"]["payouts"]
        scores = {p["host"][-8:]: int(p.get("score", 0)) for p in payouts}
        print(f"held-out scores settled (micro-nats): {scores}")
        self.assertTrue(any(int(p.get("tokens", 0)) > 0 for p in payouts), payouts)
        for p in payouts:
            if int(p.get("tokens", 0)) > 0:
                self.assertGreater(int(p.get("score", 0)), 0, p)
            self.assertEqual(int(p.get("unhelpful", 0)), 0, p)

    def test_bad_input(self):
        net = self.net
        run_spec = net.write_run_spec("bad", rounds=8, innerSteps=30)
        sid = open_shard(net, "bad", run_spec, min_nodes=3, max_nodes=3)
        h1 = net.hosts[0]
        # A document other than the one the shard pins.
        other = net.write_run_spec("other", rounds=5)
        r = net.cli("shard", "run", "--id", sid, "--run-spec", other, "--host", h1.operator,
                    check=False, json_out=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is not shard", r.stderr)
        # Malformed and unknown model: refused before anything starts, the field named.
        for doc, want in (('{"version": 1, "rounds": "x"}', "not a RunSpec document"),
                          (json.dumps({"version": 1, "model": {"kind": "lstm"}}),
                           'model.kind: "lstm" is not a known model')):
            path = os.path.join(net.root, "bad-doc.json")
            with open(path, "w") as f:
                f.write(doc)
            r = net.cli("shard", "run", "--id", sid, "--run-spec", path, "--host", h1.operator,
                        check=False, json_out=False)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn(want, r.stderr)
        self.assertNotEqual(net.train_status(h1, sid, check=False, ), None)

        for h in net.hosts:
            net.start_run(h, sid, run_spec)
        wait_round(net, net.hosts, sid, 1)
        # A corrupt data shard on host2: its worker refuses it, the run builds the data again.
        h2 = net.hosts[1]
        shard_file = os.path.join(h2.data_dir, "shards", str(sid), "work", "data",
                                  "train-0000.tsds")
        with open(shard_file, "r+b") as f:
            f.write(b"JUNK")
        # The worker of host3 dies (SIGKILL): the run starts another one.
        s3 = net.train_status(net.hosts[2], sid)
        worker_pid = int(s3["transitions"][0].split("pid ")[1].split(",")[0]) if s3[
            "transitions"] else 0
        self.assertGreater(worker_pid, 0)
        os.kill(worker_pid, signal.SIGKILL)
        # host1's shard process dies (SIGKILL): its sidecar stays up, starts the process
        # again, the run resumes from the process's records, and the killed process's worker
        # does not outlive it.
        wait_round(net, [h1], sid, 2)
        s1 = net.train_status(h1, sid)
        shard_pid = int(s1["shard_process_pid"])
        old_worker = worker_pid_of(s1)
        self.assertGreater(shard_pid, 0)
        self.assertGreater(old_worker, 0)
        os.kill(shard_pid, signal.SIGKILL)
        harness.wait_for(lambda: not process_running(old_worker), 30,
                         f"the killed shard process's worker (pid {old_worker}) to go")
        harness.wait_for(
            lambda: int(net.train_status(h1, sid, check=False).get("shard_process_restarts", 0))
            >= 1, 60, "host1's shard process to be started again")
        self.assertTrue(h1.process.alive(), "the sidecar died with its shard process")
        s1 = net.train_status(h1, sid)
        self.assertNotEqual(int(s1["shard_process_pid"]), shard_pid)
        wait_settled(net, sid)
        for h in net.hosts:
            harness.wait_for(lambda h=h: certified(net, h, sid) >= 8, 120,
                             f"{h.name} to hold every certificate")
        t2 = "\n".join(net.train_status(h2, sid)["transitions"])
        self.assertIn("preparing the data again", t2)
        self.assertIn("shard_files", t2)
        st3 = net.train_status(net.hosts[2], sid)
        self.assertGreaterEqual(int(st3.get("worker_restarts", 0)), 1)
        self.assertIn("the worker died", "\n".join(st3["transitions"]))
        st1 = net.train_status(h1, sid)
        self.assertIn("restarted at certified round", "\n".join(st1["transitions"]))
        # The restarted process contributed again: host2's last round has host1 among its
        # members.
        last = net.train_status(h2, sid)["rounds"][-1]
        self.assertEqual(int(last["round"]), 8)
        self.assertIn(h1.address, last["members"])
        roots = {net.train_status(h, sid)["root"] for h in net.hosts}
        self.assertEqual(len(roots), 1)


class ElasticTest(unittest.TestCase):
    def setUp(self):
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")),
                                   host_weights=(70, 60, 60, 50))
        self.net.init()
        self.net.start_devnet()
        self.net.add_hosts()
        for h in self.net.hosts:
            h.wait_shard_listen()

    def tearDown(self):
        self.net.cleanup()

    def test_join_kill_rejoin(self):
        self.join_kill_rejoin_or_dump(overlap=False)

    def test_join_kill_rejoin_with_overlap(self):
        """The same with each round's allreduce overlapping the next round's inner steps."""
        self.join_kill_rejoin_or_dump(overlap=True)

    def join_kill_rejoin_or_dump(self, overlap):
        try:
            self.join_kill_rejoin(overlap)
        except Exception:
            # What each host's run did, for a failure seen only on a loaded machine.
            for h in self.net.hosts:
                lines = [l for l in h.process.log_tail(4000).splitlines() if "component=shard_run" in l]
                sys.stderr.write(f"--- {h.name} ({h.address}): last shard_run lines\n")
                sys.stderr.write("\n".join(lines[-40:]) + "\n")
            raise

    def join_kill_rejoin(self, overlap):
        net = self.net
        h1, h2, h3, h4 = net.hosts
        # Rounds to spare: on a loaded machine the joins and restarts take several rounds each.
        rounds = 20
        run_spec = net.write_run_spec("elastic", rounds=rounds, innerSteps=8, evalEvery=3,
                                      overlap=overlap)
        sid = open_shard(net, "elastic", run_spec, min_nodes=4, max_nodes=4, bps=4000)
        for h in (h1, h2, h3):
            net.start_run(h, sid, run_spec)
        wait_round(net, (h1, h2, h3), sid, 1)

        # A fourth host joins mid-run: it fetches the certified checkpoint and takes part.
        net.start_run(h4, sid, run_spec)
        harness.wait_for(lambda: any(h4.address in r["members"] for r in
                                     net.train_status(h1, sid).get("rounds", [])), 180,
                         "host4 in a certified round", interval_s=0.5)
        t4 = "\n".join(net.train_status(h4, sid)["transitions"])
        self.assertIn("caught up from", t4)
        self.assertIn("fetched", t4)

        # The certified round and the planner of the round after it, once h1 is obtaining that
        # round's plan (during the inner steps its status still names the previous round's).
        def planning(h):
            s = net.train_status(h, sid)
            certified = int(s["certified_round"])
            if int(s.get("planner_round", "0")) == certified + 1 and s.get("planner"):
                return certified, s["planner"]
            return None

        def wait_planning():
            return harness.wait_for(lambda: planning(h1), 120, "h1 obtaining a plan",
                                    interval_s=0.05)

        # SIGKILL an ordinary host (not the current round's planner), mid-round.
        r0, planner = wait_planning()
        victim = next(h for h in (h2, h3, h4) if h.address != planner)
        victim.process.kill(signal.SIGKILL)
        t_kill = time.monotonic()
        survivors = [h for h in net.hosts if h is not victim]
        wait_round(net, survivors, sid, r0 + 2, timeout_s=180)
        elapsed = time.monotonic() - t_kill
        last = net.train_status(h1, sid)["rounds"][-1]
        self.assertNotIn(victim.address, last["members"])
        self.assertLess(elapsed, 120, "the rounds did not go on without the killed host")
        # Restarted, it resumes its run by itself (the records hold the run spec) and rejoins.
        r_restart = int(net.train_status(h1, sid)["certified_round"])
        victim.start()

        def contributed_since(h, r):
            return any(h.address in x["members"] for x in net.train_status(h1, sid)["rounds"]
                       if int(x["round"]) > r)

        harness.wait_for(lambda: contributed_since(victim, r_restart), 180,
                         f"{victim.name} contributing again", interval_s=0.5)

        # SIGKILL the planner of the round in progress.
        r1, planner = wait_planning()
        if planner == h1.address:
            observer = h2
        else:
            observer = h1
        planner_host = next(h for h in net.hosts if h.address == planner)
        planner_host.process.kill(signal.SIGKILL)
        survivors = [h for h in net.hosts if h is not planner_host]
        wait_round(net, survivors, sid, min(r1 + 3, rounds), timeout_s=180)
        # The survivors noticed the planner gone (its plan failed, or it did not answer when
        # asked for one), unless the round it was planning was certified at its first attempt
        # without it (seen once in CI, with overlap): then no survivor needed it before the
        # next round's planner in order, and there was nothing to notice.
        t = "\n".join("\n".join(net.train_status(h, sid)["transitions"]) for h in survivors)
        after = [x for x in net.train_status(observer, sid)["rounds"] if int(x["round"]) >= r1]
        # With overlap the round after r1 may already carry the planner's signature, given before
        # the kill (its exchange ran during r1's inner steps and it was certified as the planner
        # died; seen once in CI); the rounds after that cannot.
        in_flight = 1 if overlap else 0
        for x in after:
            if int(x["round"]) > r1 + in_flight:
                self.assertNotIn(planner, x["members"], f"round {x['round']} after the kill")
        planned_without = any(int(x["round"]) == r1 and int(x.get("attempt", 0)) == 0 and
                              planner not in x["members"] for x in after)
        if not planned_without:
            self.assertRegex(t, r"(does not answer|failed)")
        planner_host.start()
        wait_settled(net, sid, timeout_s=400)

        roots = set()
        for h in net.hosts:
            harness.wait_for(lambda h=h: certified(net, h, sid) >= rounds, 120,
                             f"{h.name} to hold every certificate")
            roots.add(net.train_status(h, sid)["root"])
        self.assertEqual(len(roots), 1)
        record = net.cli("shard", "settlement", "--id", sid)["settlement"]
        contributed = {p["host"]: int(p["rounds_contributed"]) for p in record["payouts"]}
        self.assertEqual(len(contributed), 4, contributed)
        self.assertLess(contributed[victim.address], rounds)
        self.assertLess(contributed[h4.address], rounds)


if __name__ == "__main__":
    unittest.main()
