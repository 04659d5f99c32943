"""The shard lifecycle demo: devnet + 3 host sidecars + CLI on loopback, narrated: proposal, votes,
reservations, a checkpoint artifact published by one host and fetched by the others, settlement.

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
        supply = int(net.cli("chain", "status")["total_supply"])

        spec = net.write_spec("demo", min_nodes=2, max_nodes=3, escrow=300000, bps=5000)
        out = net.cli("proposal", "submit", "--spec", spec, "--deposit", "1000", "--title",
                      "demo shard", "--wait", key="creator")
        pid, sid = out["proposal_id"], out["shard_id"]
        say(f"proposal {pid} submitted for shard {sid} (escrow 300000 ngonka, 2-3 nodes)")
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

        # A checkpoint moves between the members as a content-addressed artifact: host1 publishes
        # it, host2 fetches it from host1, host3 from both; each copy is checked with hashlib.
        ckpt = os.path.join(net.root, "checkpoint-round-1")
        harness.write_random_files(ckpt, {"model.bin": 24 << 20, "optimizer/state.bin": 8 << 20,
                                          "meta.json": 200})
        want = harness.tree_sha256(ckpt)
        h1, h2, h3 = net.hosts
        for h in net.hosts:
            h.wait_shard_listen()
        pub = net.artifact(h1, "publish", "--shard", str(sid), "--dir", ckpt, "--round", "1")
        art = pub["artifact_id"]
        say(f"host1 published checkpoint {art[:16]}... ({int(pub['bytes_total']) >> 20} MiB, "
            f"{pub['chunks_total']} chunks)")
        for h, peers in ((h2, [h1]), (h3, [h1, h2])):
            out_dir = os.path.join(net.root, f"{h.name}-checkpoint")
            peer_args = []
            for p in peers:
                peer_args += ["--peer", p.address]
            t0 = time.monotonic()
            got = net.artifact(h, "fetch", "--shard", str(sid), "--id", art, "--out", out_dir,
                               *peer_args)
            dt = time.monotonic() - t0
            by_peer = ", ".join(f"{n.name} {int(got['bytes_by_peer'].get(n.address, 0)) >> 20} MiB"
                                for n in peers)
            same = harness.tree_sha256(out_dir) == want
            say(f"{h.name} fetched it in {dt:.1f} s ({by_peer}); byte-identical: {same}")
            if not same:
                raise RuntimeError(f"{h.name}'s copy differs from the published checkpoint")

        addrs = {h.name: h.address for h in net.hosts}
        payouts = {addrs["host1"]: 100000, addrs["host2"]: 80000, addrs["host3"]: 60000}
        before = {a: net.balance(a) for a in payouts}
        args_payouts = []
        for a, amt in payouts.items():
            args_payouts += ["--payout", f"{a}={amt}"]
        out = net.cli("shard", "settle", "--id", sid, "--hosts",
                      ",".join(h.operator for h in net.hosts), "--final-root", art,
                      *args_payouts, "--eval-metric", "eval_loss", "--eval-value-micro",
                      "2500000", "--submit-via", net.hosts[0].operator)
        say(f"settlement signed by {out['signatures']} hosts, tx {out['txhash'][:16]}...")
        net.wait_shard_status(sid, "SHARD_STATUS_SETTLED", 60)
        record = net.cli("shard", "settlement", "--id", sid)
        say(f"shard {sid} SETTLED at height {record['height']} with signed weight "
            f"{record['signed_weight']} of {shard['total_weight']}")

        print("\nPayouts")
        print(f"  {'host':<48} {'paid':>10} {'balance':>14}")
        for a, amt in payouts.items():
            bal = net.balance(a)
            print(f"  {a:<48} {bal - before[a]:>10} {bal:>14}")
        print(f"  refund to creator: {record['settlement']['refund']}")
        now = int(net.cli("chain", "status")["total_supply"])
        print(f"  total supply: {now} (unchanged: {now == supply})")
        net.stop()
        r = net.replay()
        report = json.loads(r.stdout) if r.stdout.strip() else {}
        replay_ok = r.returncode == 0 and report.get("ok") is True
        print(f"  replay from genesis: {report.get('blocks', '?')} blocks, every app hash "
              f"{'reproduced' if replay_ok else 'NOT reproduced: ' + r.stdout + r.stderr}")
        return 0 if now == supply and replay_ok else 1
    finally:
        if args.keep:
            net.stop()
            print(f"kept {net.root}")
        else:
            net.cleanup()


if __name__ == "__main__":
    sys.exit(main())
