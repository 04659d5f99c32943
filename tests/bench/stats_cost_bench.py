"""What the stats page and /metrics cost a round: the same 3-host shard trained with the stats
face off (`stats_listen = ""`: no sampler, no server) and on with every host's /metrics and
/api/v1/overview read every second (as a Prometheus scrape and an open page would), alternating
off and on so the machine's drift falls on both.

Real processes: the devnet, three trainshardd with their shard processes and workers, one run
spec (a tiny llama, its rounds a couple of seconds of inner steps here), started by the hosts from
the chain. Each host's shard process times every round (`train-status`): the inner steps and the
exchange are what a reader could slow down.

  python3 tests/bench/stats_cost_bench.py [--pairs 2] [--rounds 6] [--inner-steps 100]

Prints the mean inner-step and exchange seconds per round of each run, the on/off ratio of the
means, and the spread between runs of the same mode (the noise the ratio is read against). The
last line is one JSON document with every figure.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "functional"))
import harness  # noqa: E402
import test_training  # noqa: E402


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Scraper:
    """Reads every URL once a second on a thread of its own until stopped."""

    def __init__(self, urls):
        self.urls = urls
        self.reads = 0
        self.failures = 0
        self.bytes = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stopping.is_set():
            start = time.monotonic()
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        self.bytes += len(r.read())
                    self.reads += 1
                except OSError:
                    self.failures += 1
            self.stopping.wait(max(0.0, 1.0 - (time.monotonic() - start)))

    def stop(self):
        self.stopping.set()
        self.thread.join()


def run_once(mode, args):
    net = harness.Network()
    try:
        net.init()
        net.start_devnet()
        extra = {"worker_threads": 1, "worker_memory_bytes_max": 2 << 30}
        if mode == "off":
            extra["stats_listen"] = '""'
        for i in range(1, 4):
            net.add_host(f"host{i}", extra_config=dict(extra))
        for h in net.hosts:
            h.wait_shard_listen()
        scraper = None
        if mode == "scraped":
            urls = []
            for h in net.hosts:
                base = h.stats_url()
                urls += [base + "/metrics", base + "/api/v1/overview"]
            scraper = Scraper(urls)
        run_spec = net.write_run_spec("cost", rounds=args.rounds, innerSteps=args.inner_steps,
                                      model={"kind": "llama", "preset": "tiny", "seed": "7",
                                             "config": {"vocab": 384, "context": 32}})
        sid = test_training.open_shard(net, "cost", run_spec, on_chain=True, min_nodes=3,
                                       max_nodes=3)
        test_training.wait_settled(net, sid, timeout_s=900)
        harness.wait_for(lambda: all(net.train_status(h, sid, check=False).get("state") == "done"
                                     for h in net.hosts), 60, "every run done")
        if scraper is not None:
            scraper.stop()
        inner, exchange = [], []
        for h in net.hosts:
            for r in net.train_status(h, sid)["rounds"]:
                if float(r.get("round_seconds", 0)) > 0:
                    inner.append(float(r["inner_seconds"]))
                    exchange.append(float(r["exchange_seconds"]))
        out = {"mode": mode, "rounds": len(inner), "inner_s": statistics.mean(inner),
               "exchange_s": statistics.mean(exchange)}
        if scraper is not None:
            out.update(reads=scraper.reads, read_failures=scraper.failures,
                       read_bytes=scraper.bytes)
        say(f"{mode}: {out}")
        return out
    finally:
        net.cleanup()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--inner-steps", type=int, default=100)
    args = p.parse_args()
    runs = []
    for _ in range(args.pairs):
        for mode in ("off", "scraped"):
            runs.append(run_once(mode, args))

    def figures(mode, key):
        return [r[key] for r in runs if r["mode"] == mode]

    result = {"pairs": args.pairs, "rounds": args.rounds, "inner_steps": args.inner_steps,
              "runs": runs}
    for key in ("inner_s", "exchange_s"):
        off, on = figures("off", key), figures("scraped", key)
        result[f"{key}_ratio"] = statistics.mean(on) / statistics.mean(off)
        # The noise: how far apart runs of one mode land, as a ratio of their extremes.
        result[f"{key}_spread_off"] = max(off) / min(off)
        result[f"{key}_spread_scraped"] = max(on) / min(on)
        print(f"{key}: off {[round(x, 3) for x in off]}, scraped {[round(x, 3) for x in on]}; "
              f"scraped/off {result[f'{key}_ratio']:.3f} (runs of one mode apart by up to "
              f"{max(result[f'{key}_spread_off'], result[f'{key}_spread_scraped']):.3f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
