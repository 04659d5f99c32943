"""One DiLoCo round of a ~125 M-parameter llama, end to end, in a 3-host shard on loopback.

Real processes: the devnet, three trainshardd with their shard processes and workers. The
benchmark corpus (bench_corpus.py) is packed once (32 k vocabulary) and published by host 1's
operator; the proposal carries the run spec on chain and the hosts start the run by themselves.
The round is then broken into its parts as each host's shard process timed them
(`train-status`): the inner steps, the exchange (the allreduce of the pseudo-gradients), the
certification (outer step, evaluation, signatures) and the publishing of the checkpoint; with the
bytes each host sent and the peak memory of each worker.

  python3 tests/bench/round_bench.py [--preset 125m] [--inner-steps 2] [--work DIR]

The last line is one JSON document with every figure.
"""

import argparse
import base64
import json
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "functional"))
import harness  # noqa: E402
import bench_corpus  # noqa: E402


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def worker_peak_rss(host_dir):
    """Peak resident memory of the worker processes under a host's data dir, by pid files of
    ts_worker (read from /proc while they run)."""
    best = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not cmd or not cmd[0].endswith(b"ts_worker") or host_dir.encode() not in b" ".join(
                    cmd):
                continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        best = max(best, int(line.split()[1]) * 1024)
        except OSError:
            continue
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="125m")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--inner-steps", type=int, default=2)
    p.add_argument("--codec", default="int8-zstd")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--work", default="/var/tmp/trainshard-bench",
                   help="where the packed corpus is kept between runs")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()

    os.makedirs(args.work, exist_ok=True)
    t0 = time.monotonic()
    dataset = bench_corpus.packed(args.work, args.vocab)
    dataset_dir = os.path.join(args.work, f"dataset-v{args.vocab}")
    say(f"corpus: {int(dataset['train_tokens']):,} training tokens, {int(dataset['eval_tokens']):,} "
        f"held out, vocab {dataset['vocab']} ({time.monotonic() - t0:.0f}s)")

    net = harness.Network(keep=args.keep)
    peaks = {}
    try:
        net.init()
        net.start_devnet()
        for i in range(1, 4):
            net.add_host(f"host{i}", extra_config={"worker_threads": args.threads})
        for h in net.hosts:
            h.wait_shard_listen()
        run_spec = net.write_run_spec(
            "round", rounds=1, innerSteps=args.inner_steps, batchSize=args.batch,
            model={"kind": "llama", "preset": args.preset, "seed": "7",
                   "config": {"vocab": args.vocab, "context": args.context}},
            data={"corpus": "packed", "vocab": args.vocab,
                  "datasetRoot": base64.b64encode(bytes.fromhex(dataset["root"])).decode()},
            codec=args.codec, evalEvery=1, evalWindowsMax="16", exchangeTimeoutMs=600000,
            plannerTimeoutMs=10000, joinWindowMs=5000)
        spec = net.write_spec("round", run_spec=run_spec, min_nodes=3, max_nodes=3,
                              max_duration=100000, window=100, quota_bytes=64 << 30)
        _, sid = net.propose_and_pass(spec, run_spec=run_spec)
        net.wait_shard_status(sid, "SHARD_STATUS_RUNNING", 120)
        # The operator publishes from under the host's files_root (the network's folder).
        local = os.path.join(net.root, "dataset")
        shutil.copytree(dataset_dir, local)
        published = net.artifact(net.hosts[0], "publish", "--shard", sid, "--dir", local,
                                 "--kind", "dataset", timeout=1200)
        say(f"shard {sid} running; dataset published on host1 ({published['artifact_id'][:16]}...)")
        t_run = time.monotonic()

        def done():
            for h in net.hosts:
                peaks[h.name] = max(peaks.get(h.name, 0), worker_peak_rss(h.dir))
            return all(net.train_status(h, sid, check=False).get("state") == "done"
                       for h in net.hosts)
        harness.wait_for(done, 7200, "the round on every host", interval_s=2)
        wall = time.monotonic() - t_run
        rows = []
        for h in net.hosts:
            st = net.train_status(h, sid)
            r = st["rounds"][-1]
            row = {"host": h.name, "params": int(st["parameters"]),
                   "inner_s": float(r.get("inner_seconds", 0)),
                   "exchange_s": float(r.get("exchange_seconds", 0)),
                   "certify_s": float(r.get("certify_seconds", 0)),
                   "publish_s": float(r.get("publish_seconds", 0)),
                   "round_s": float(r.get("round_seconds", 0)),
                   "bytes_sent": int(r.get("bytes_exchanged", 0)),
                   "checkpoint_bytes": int(st.get("checkpoint_bytes", 0)),
                   "worker_peak_rss": peaks.get(h.name, 0),
                   "train_loss": float(r.get("train_loss", 0))}
            rows.append(row)
            say(f"{h.name}: {row['params']:,} params; inner steps {row['inner_s']:.1f}s, exchange "
                f"{row['exchange_s']:.1f}s ({row['bytes_sent'] >> 20} MiB sent, {args.codec}), "
                f"certify {row['certify_s']:.1f}s, publish {row['publish_s']:.1f}s "
                f"(checkpoint {row['checkpoint_bytes'] >> 20} MiB); worker peak "
                f"{row['worker_peak_rss'] >> 20} MiB")
        roots = {net.train_status(h, sid)["root"] for h in net.hosts}
        say(f"one root on every host: {len(roots) == 1}; wall time from the dataset's publishing "
            f"to every run done: {wall:.0f}s")
        print(json.dumps({"bench": "round", "preset": args.preset, "vocab": args.vocab,
                          "context": args.context, "batch": args.batch,
                          "inner_steps": args.inner_steps, "codec": args.codec,
                          "threads": args.threads, "hosts": rows, "one_root": len(roots) == 1,
                          "wall_s": round(wall, 1)}))
        return 0 if len(roots) == 1 else 1
    finally:
        net.cleanup()


if __name__ == "__main__":
    sys.exit(main())
