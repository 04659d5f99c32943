"""The main job on the embedded default: devnet + 3 host sidecars with CPU workers + CLI on
loopback, narrated: a proposal for a small GPT, votes, reservations, DiLoCo rounds with the loss
going down, one host killed and rejoined, a checkpoint evaluated, the shard settled by the hosts,
payouts, and a summary (loss curve, bytes exchanged, payouts).

Run through scripts/demo.sh (which builds first). --keep leaves the working directory (keys,
chain data, logs) in place and prints where it is.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()

    net = harness.Network(keep=args.keep)
    try:
        say(f"working directory {net.root}")
        net.init()
        say(f"genesis: chain {net.chain_id}, hosts with PoC weights {list(net.host_weights)}")
        net.start_devnet()
        say(f"devnet listening on {net.chain}")
        net.add_hosts()
        for h in net.hosts:
            say(f"{h.name} {h.address} sidecar on {h.operator}")
        for h in net.hosts:
            url = h.stats_url()
            say(f"{h.name}'s live stats page: {url}/ (Prometheus metrics: {url}/metrics)")
        supply = int(net.cli("chain", "status")["total_supply"])

        run_spec = net.write_run_spec(
            "demo", rounds=10, innerSteps=30, evalEvery=2,
            model={"kind": "llama", "preset": "tiny", "seed": "7",
                   "config": {"vocab": 384, "context": 32}},
            training={"schedule": "cosine", "warmupSteps": "20", "minLrRatio": 0.1})
        with open(run_spec) as f:
            rs = json.load(f)
        cfg = rs["model"]["config"]
        say(f"run spec: llama preset {rs['model']['preset']} (2 layers x 64 wide, grouped-query "
            f"attention, SwiGLU, rotary), context {cfg['context']}, vocab {cfg['vocab']}; "
            f"fortunes corpus; {rs['rounds']} DiLoCo rounds of H={rs['innerSteps']} AdamW steps "
            f"(warm-up then cosine), outer Nesterov lr {rs['outer']['lr']}")
        spec = net.write_spec("demo", min_nodes=3, max_nodes=3, escrow=300000, bps=5000,
                              max_duration=6000, run_spec=run_spec)
        out = net.cli("proposal", "submit", "--spec", spec, "--run-spec", run_spec, "--deposit",
                      "1000", "--title", "demo shard", "--wait", key="creator")
        pid, sid = out["proposal_id"], out["shard_id"]
        say(f"proposal {pid} submitted for shard {sid} (escrow 300000 ngonka, 3 nodes, run spec "
            f"{net.shard(sid)['spec']['run_spec_hash'][:12]}... carried on chain)")
        for v in ("host1", "host2", "host3"):
            net.cli("proposal", "vote", "--id", pid, "--option", "yes", "--wait", key=v)
            say(f"{v} voted yes")
        harness.wait_for(lambda: net.shard(sid)["status"] in ("SHARD_STATUS_OPEN",
                                                              "SHARD_STATUS_RUNNING"), 60,
                         f"shard {sid} to open")
        say(f"proposal passed: shard {sid} opened, escrow locked")
        net.wait_shard_status(sid, "SHARD_STATUS_RUNNING", 60)
        shard = net.shard(sid)
        for r in shard["reservations"]:
            say(f"reserved: {r['host']} weight {r['frozen_weight']} at height "
                f"{r['reserved_height']}")
        say(f"shard {sid} RUNNING with total weight {shard['total_weight']}")

        h1, h2, h3 = net.hosts
        harness.wait_for(lambda: all(net.train_status(h, sid, check=False) for h in net.hosts),
                         120, "every host to start the run")
        say("every host started the run by itself from the run spec on chain: each prepares the "
            "data with its worker, then trains")

        shown = {"round": 0, "transitions": {h.name: 0 for h in net.hosts}}
        curve = []

        def progress(observer):
            st = net.train_status(observer, sid, check=False)
            if not isinstance(st, dict):
                return {}
            if not curve and int(st.get("initial_eval_loss_micro", 0)):
                curve.append((0, None, int(st["initial_eval_loss_micro"]) / 1e6))
                say(f"round 0: eval loss {curve[0][2]:.3f} (the initial checkpoint)")
            for r in st.get("rounds", []):
                n = int(r["round"])
                if n <= shown["round"]:
                    continue
                shown["round"] = n
                ev = int(r["eval_loss_micro"]) / 1e6
                curve.append((n, float(r["train_loss"]), ev if ev else None))
                say(f"round {n} certified: {len(r['members'])} members, train loss "
                    f"{float(r['train_loss']):.3f}" + (f", eval loss {ev:.3f}" if ev else "") +
                    f", {int(r['bytes_exchanged']) >> 10} KiB sent by {observer.name}")
            return st

        def transitions(h, pattern):
            st = net.train_status(h, sid, check=False)
            lines = st.get("transitions", []) if isinstance(st, dict) else []
            new = lines[shown["transitions"][h.name]:]
            shown["transitions"][h.name] = len(lines)
            for t in new:
                if any(p in t for p in pattern):
                    say(f"  {h.name}: {t[9:]}")

        harness.wait_for(lambda: int(progress(h1).get("certified_round", 0)) >= 3, 600,
                         "round 3", interval_s=0.5)
        say(f"SIGKILL {h3.name}'s trainshardd (weight 60 of 240: the others keep > 2/3)")
        h3.process.kill()
        harness.wait_for(lambda: int(progress(h1).get("certified_round", 0)) >= 5, 600,
                         "round 5", interval_s=0.5)
        transitions(h1, ("failed", "does not answer"))
        say(f"restarting {h3.name}: it resumes its run from its records")
        h3.start()
        harness.wait_for(lambda: h3.address in (progress(h1).get("rounds") or [{}])[-1].get(
            "members", []), 600, f"{h3.name} to contribute again", interval_s=0.5)
        transitions(h3, ("restarted", "caught up", "fetched"))
        say(f"{h3.name} contributes again")
        harness.wait_for(lambda: progress(h1).get("state") in ("settling", "done"), 600,
                         "the last round", interval_s=0.5)
        net.wait_shard_status(sid, "SHARD_STATUS_SETTLED", 120)
        final = net.train_status(h1, sid)
        transitions(h1, ("settlement",))
        art = harness.b64_to_hex(final["final_checkpoint_artifact_id"])
        ev = net.cli("eval", "--shard", sid, "--artifact", art, "--host", h2.operator,
                     timeout=600)["evaluation"]["result"]
        say(f"trainshard eval by {h2.name} of the final checkpoint artifact {art[:16]}...: "
            f"loss {int(ev['loss_micro']) / 1e6:.4f} over {ev['tokens']} held-out tokens")
        roots = {net.train_status(h, sid)["root"] for h in net.hosts}
        say(f"final checkpoint root identical on every host: {len(roots) == 1}")
        record = net.cli("shard", "settlement", "--id", sid)
        say(f"shard {sid} SETTLED at height {record['height']} with signed weight "
            f"{record['signed_weight']} of {shard['total_weight']}")

        # The result in the payer's hands: the creator fetches the settled checkpoint from the
        # members (it is not one), exports it for the Hugging Face tools, and has it write.
        model_dir = os.path.join(net.root, "model")
        fetched = net.cli("model", "fetch", "--shard", sid, "--out", model_dir, key="creator",
                          timeout=300)
        say(f"creator fetched the settled checkpoint ({int(fetched['checkpoint_bytes']) >> 10} "
            f"KiB, root {fetched['root'][:16]}..., the settlement's) and its tokenizer from "
            f"{len(fetched['from'])} members")
        exported = net.cli("model", "export", "--checkpoint", fetched["checkpoint"],
                           "--tokenizer", fetched["tokenizer"], "--out", model_dir + "-hf")
        say(f"exported for Hugging Face: {exported['out']} (model.safetensors, config.json, "
            f"tokenizer.model; {exported['parameters']} parameters in {exported['tensors']} "
            f"tensors)")
        written = net.cli("model", "generate", "--checkpoint", fetched["checkpoint"],
                          "--tokenizer", fetched["tokenizer"], "--prompt", "The", "--max-tokens",
                          "24", "--samples", "3", "--seed", "5", timeout=300)

        print("\nLoss curve (round, mean train loss, median eval loss)")
        for n, tl, el in curve:
            print(f"  {n:>3}  {'-' if tl is None else f'{tl:.4f}':>8}  "
                  f"{'-' if el is None else f'{el:.4f}':>8}")
        total_bytes = sum(int(net.train_status(h, sid)["bytes_exchanged"]) for h in net.hosts)
        print(f"Bytes exchanged by the collective (all hosts): {total_bytes >> 10} KiB; "
              f"checkpoint {int(final['checkpoint_bytes']) >> 10} KiB, "
              f"{final['parameters']} parameters")
        print(f"Wall time of host1's run: {float(final['wall_seconds']):.1f} s, of which "
              f"{float(final['inner_seconds']):.1f} s in inner steps")
        payouts = {p["host"]: int(p["amount"]) for p in record["settlement"]["payouts"]}
        contributed = {p["host"]: p["rounds_contributed"] for p in record["settlement"]["payouts"]}
        # The loss-delta score of the work each host is paid for, where the run scores
        # (docs/verification.md "Scoring"; this run, the ring mean without replays, does not).
        all_scores = {p["host"]: int(p.get("score", 0)) for p in record["settlement"]["payouts"]}
        scored = {a: f"{v / 1e6:.3f}" if any(all_scores.values()) else "-"
                  for a, v in all_scores.items()}
        before = {a: net.balance(a) - payouts.get(a, 0) for a in payouts}
        ok_loss = curve and curve[-1][2] is not None and curve[0][2] is not None and \
            curve[-1][2] < curve[0][2]
        print("\nPayouts")
        print(f"  {'host':<48} {'rounds':>6} {'score':>7} {'paid':>10} {'balance':>14}")
        for a, amt in payouts.items():
            bal = net.balance(a)
            print(f"  {a:<48} {contributed[a]:>6} {scored[a]:>7} {bal - before[a]:>10} "
                  f"{bal:>14}")
        print(f"  refund to creator: {record['settlement']['refund']}")
        now = int(net.cli("chain", "status")["total_supply"])
        print(f"  total supply: {now} (unchanged: {now == supply})")
        net.stop()
        r = net.replay()
        report = json.loads(r.stdout) if r.stdout.strip() else {}
        replay_ok = r.returncode == 0 and report.get("ok") is True
        print(f"  replay from genesis: {report.get('blocks', '?')} blocks, every app hash "
              f"{'reproduced' if replay_ok else 'NOT reproduced: ' + r.stdout + r.stderr}")
        print("\nWhat the settled model writes (trainshard model generate --prompt \"The\", "
              "on the creator's copy)")
        for text in written["samples"]:
            print("  " + " ".join(text.split()))
        return 0 if now == supply and replay_ok and ok_loss and len(roots) == 1 else 1
    finally:
        if args.keep:
            net.stop()
            print(f"kept {net.root}")
        else:
            net.cleanup()


if __name__ == "__main__":
    sys.exit(main())
