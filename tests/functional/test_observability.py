"""Seeing a shard (docs/stats.md), multi-process on loopback: a devnet, three trainshardd hosts
training a shard they start by themselves, a real Prometheus server (Debian's `prometheus`)
scraping the hosts' /metrics every second, and the stats page of one host in headless Chromium
(Debian's `chromium`, driven by playwright-core from tests/functional/web).

- Prometheus' HTTP API shows trainshard_rounds_certified_total rising on every host, through
  every round, and the train-loss series with a point for the rounds, going down; an artifact
  one host publishes and another fetches shows as the same bytes served and fetched, each side
  naming the other, and the fetch timed.
- The stats page, read while the run goes on: it shows the shard, its hosts and a loss chart
  whose points increase as rounds complete; no console errors; no request leaves the page's own
  origin (it works with the network off); screenshots at desktop and phone widths are saved
  under <build>/test-artifacts/stats-page/.
- The JSON the page reads names the shard, its three members and the rounds with their
  certificates; after settlement it carries the settlement with every host paid.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_training  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WEB = os.path.join(HERE, "web")
ROUNDS = 6
# Inner steps long enough (a few seconds a round here) that one-second scrapes see each round.
INNER_STEPS = 100
PROMETHEUS = "/usr/bin/prometheus"


def http_json(url, timeout_s=5):
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read().decode())


def ensure_web_tools():
    """playwright-core from the lock file, once (node_modules is not committed)."""
    if not os.path.isdir(os.path.join(WEB, "node_modules", "playwright-core")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=WEB, check=True,
                       stdout=subprocess.DEVNULL)


class Prometheus:
    """A Prometheus server scraping `targets` every second, its data in `root`."""

    def __init__(self, root, targets):
        self.root = root
        self.port = harness.free_port()
        config = os.path.join(root, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                    "scrape_configs:\n  - job_name: trainshardd\n    static_configs:\n"
                    f"      - targets: {json.dumps(targets)}\n")
        self.process = harness.Process(
            "prometheus",
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root}/data",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            os.path.join(root, "prometheus.log"))
        self.process.start()

    def query(self, promql):
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?" +
               urllib.parse.urlencode({"query": promql}))
        out = http_json(url)
        assert out["status"] == "success", out
        return out["data"]["result"]

    def query_range(self, promql, start, end):
        url = (f"http://127.0.0.1:{self.port}/api/v1/query_range?" +
               urllib.parse.urlencode({"query": promql, "start": start, "end": end, "step": 1}))
        out = http_json(url)
        assert out["status"] == "success", out
        return out["data"]["result"]

    def ready(self):
        if not self.process.alive():
            raise RuntimeError(f"prometheus exited:\n{self.process.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self):
        self.process.stop()


class ObservabilityTest(unittest.TestCase):
    def setUp(self):
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")))
        self.net.init()
        self.net.start_devnet()
        for i in range(1, 4):
            self.net.add_host(f"host{i}", extra_config={"worker_threads": 1,
                                                        "worker_memory_bytes_max": 2 << 30})
        for h in self.net.hosts:
            h.wait_shard_listen()
        self.prometheus = None

    def tearDown(self):
        if self.prometheus is not None:
            self.prometheus.stop()
        self.net.cleanup()

    def test_prometheus_and_the_stats_page_follow_a_run(self):
        net = self.net
        ensure_web_tools()
        urls = [h.stats_url() for h in net.hosts]
        targets = [u.removeprefix("http://") for u in urls]
        self.prometheus = prom = Prometheus(net.root, targets)
        harness.wait_for(prom.ready, 60, "prometheus to be ready", interval_s=0.5)
        harness.wait_for(lambda: len([r for r in prom.query("up == 1")]) == 3, 60,
                         "prometheus to scrape all three hosts", interval_s=0.5)

        start = time.time()
        run_spec = net.write_run_spec("seen", rounds=ROUNDS, innerSteps=INNER_STEPS)
        sid = test_training.open_shard(net, "seen", run_spec, on_chain=True, min_nodes=3,
                                       max_nodes=3)
        # An artifact moves between two hosts while the run goes on (checkpoints of an honest
        # run need none: every member publishes the same one).
        src = os.path.join(net.root, "src", "data")
        harness.write_random_files(src, {f"part-{i}.bin": 1 << 20 for i in range(3)})
        art = net.artifact(net.hosts[0], "publish", "--shard", str(sid), "--dir", src,
                           "--kind", "data")
        net.artifact(net.hosts[1], "fetch", "--shard", str(sid), "--id", art["artifact_id"],
                     "--peer", net.hosts[0].address)
        # The page, read from the first host while the run goes on.
        shots = os.path.join(harness.BUILD_DIR, "test-artifacts", "stats-page")
        os.makedirs(shots, exist_ok=True)
        page = subprocess.Popen(
            ["node", os.path.join(WEB, "stats_page_check.mjs"), "--url", urls[0] + "/",
             "--screenshots", shots, "--min-increase", "2", "--timeout-s", "400"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        test_training.wait_settled(net, sid, timeout_s=600)
        out, err = page.communicate(timeout=600)
        self.assertEqual(page.returncode, 0, f"stats page check failed:\n{out}\n{err}")
        summary = json.loads(out.strip().splitlines()[-1])
        self.assertGreaterEqual(summary["points_last"], summary["points_first"] + 2, summary)
        self.assertEqual(summary["console_errors"], [], summary)
        for name in os.listdir(shots):
            self.assertGreater(os.path.getsize(os.path.join(shots, name)), 10_000, name)

        # Let a few more scrapes see the last round on every host.
        harness.wait_for(
            lambda: all(float(r["value"][1]) >= ROUNDS for r in prom.query(
                f'trainshard_rounds_certified_total{{shard="{sid}"}}')) and
            len(prom.query(f'trainshard_rounds_certified_total{{shard="{sid}"}}')) == 3,
            60, "prometheus to see every round on every host", interval_s=1)
        # The range's last point (start + k steps of 1 s, at most `end`) must come after the
        # scrape that saw the last round.
        time.sleep(2)
        end = time.time()
        rounds = prom.query_range(f'trainshard_rounds_certified_total{{shard="{sid}"}}', start,
                                  end)
        self.assertEqual(len(rounds), 3, rounds)
        for series in rounds:
            values = [float(v) for _, v in series["values"]]
            self.assertEqual(values, sorted(values), series["metric"])
            # Rising through the run: most rounds were seen on their own, not all at once (a
            # loaded machine may certify two within one scrape).
            self.assertGreaterEqual(len(set(values)), ROUNDS - 2, series)
            self.assertEqual(values[-1], ROUNDS)
        losses = prom.query_range(f'trainshard_train_loss{{shard="{sid}"}}', start, end)
        self.assertEqual(len(losses), 3, losses)
        for series in losses:
            values = [float(v) for _, v in series["values"]]
            self.assertGreaterEqual(len(set(values)), ROUNDS - 2, series)
            self.assertLess(values[-1], values[0], series)
        phases = prom.query(f'trainshard_round_phase_seconds_count{{shard="{sid}",'
                            f'phase="inner"}}')
        self.assertEqual(len(phases), 3, phases)
        # The artifact's bytes, named by peer on both sides, and the fetch timed.
        a, b = net.hosts[0], net.hosts[1]
        served = prom.query(f'trainshard_artifact_bytes_total{{direction="served",'
                            f'instance="{targets[0]}",peer="{b.address}"}}')
        fetched = prom.query(f'trainshard_artifact_bytes_total{{direction="fetched",'
                             f'instance="{targets[1]}",peer="{a.address}"}}')
        self.assertEqual(len(served), 1, served)
        self.assertEqual(len(fetched), 1, fetched)
        self.assertGreaterEqual(float(served[0]["value"][1]), 3 << 20, served)
        self.assertEqual(float(served[0]["value"][1]), float(fetched[0]["value"][1]))
        timed = prom.query(f'trainshard_transfer_seconds_count{{kind="fetch",result="ok",'
                           f'instance="{targets[1]}"}}')
        # Ours, and the shard process adopting each round's checkpoint (present: no bytes).
        self.assertGreaterEqual(float(timed[0]["value"][1]), 1, timed)

        # The JSON the page reads: the shard, its members, its rounds and the settlement.
        def settled_overview():
            o = http_json(urls[0] + "/api/v1/overview")
            mine = [s for s in o.get("shards", []) if s["record"]["shard_id"] == str(sid)]
            return o if mine and mine[0]["settlement"] else None
        overview = harness.wait_for(settled_overview, 60, "the overview to show the settlement")
        entry = [s for s in overview["shards"] if s["record"]["shard_id"] == str(sid)][0]
        self.assertEqual(len(entry["record"]["members"]), 3)
        self.assertEqual(int(entry["run"]["certified_round"]), ROUNDS)
        self.assertEqual(len(entry["run"]["rounds"]), ROUNDS)
        paid = {p["host"] for p in entry["settlement"]["settlement"]["payouts"]
                if int(p["amount"]) > 0}
        self.assertEqual(paid, {h.address for h in net.hosts})
        self.assertIn(str(sid), [s["id"] for s in overview["network"]["shards"]])
        self.assertEqual(overview["host"]["address"], net.hosts[0].address)

        # Each reservation carries the SHA-256 of its host's own TLS certificate (DER), made at
        # the host's first start in its data dir.
        pinned = {r["host"]: base64.b64decode(r["tls_cert_sha256"])
                  for r in net.shard(sid)["reservations"]}
        for h in net.hosts:
            with open(os.path.join(h.data_dir, "tls.crt")) as f:
                body = "".join(line for line in f.read().splitlines() if "-----" not in line)
            self.assertEqual(pinned[h.address], hashlib.sha256(base64.b64decode(body)).digest())
            self.assertEqual(os.stat(os.path.join(h.data_dir, "tls.key")).st_mode & 0o777, 0o600)


if __name__ == "__main__":
    unittest.main()
