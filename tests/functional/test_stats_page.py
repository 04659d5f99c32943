"""The stats page trainshardd serves (sidecar/host/stats_page/), in headless Chromium.

A small server on 127.0.0.1 serves the page's three files as the daemon does (/, /stats.css,
/stats.js) and GET /api/v1/overview from fixtures built here after the API's contract (the
overview: proto3 JSON of host.proto, chain.proto and training.proto with snake_case names, every
field present, 64-bit integers as strings, bytes as base64, enums by name). Each overview the
page fetches certifies one more round of a 3-host shard: a host leaves for a round and rejoins,
every second round is evaluated, and after the last round the shard settles.
tests/functional/web/stats_page_check.mjs drives the page (playwright-core with Debian's
/usr/bin/chromium; `npm ci` in tests/functional/web first when its node_modules is missing) and
checks that the shard, its hosts and its train-loss chart show and that the chart gains points
as rounds complete, with no console errors, no request off the page's origin (the browser
aborts them all, as with the network off), keyboard access, no sideways scroll at 360 px and
updates that keep focus and place. Screenshots go to $TS_ARTIFACTS_DIR/stats_page, or
<build>/test-artifacts/stats_page.

When the API answers HTTP 500 the page must show the reconnecting state and keep the last data,
without an error of its own code. Chromium logs each HTTP error answer to a fetch as a console
error ("Failed to load resource: ... 500"); the check counts those for the API's URL apart and
tolerates them there only (--allow-api-errors); any other console error fails.
"""

import base64
import hashlib
import http.server
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PAGE_DIR = os.path.join(ROOT, "sidecar", "host", "stats_page")
WEB_DIR = os.path.join(HERE, "web")
CHECK = os.path.join(WEB_DIR, "stats_page_check.mjs")
BUILD_DIR = os.environ.get("TS_BUILD_DIR", os.path.join(ROOT, "build"))
ARTIFACTS_DIR = os.path.join(
    os.environ.get("TS_ARTIFACTS_DIR", os.path.join(BUILD_DIR, "test-artifacts")), "stats_page")
CHROMIUM = os.environ.get("TS_CHROMIUM", "/usr/bin/chromium")

# Text from peers and the chain that the page must show as text: parsed as markup, it would
# make the browser fetch /injected.png (an unknown path here, and a console error there).
MARKUP = '<img src="/injected.png" onerror="console.error(\'injected\')"><b>bold</b>'

# The page's files and the paths the daemon serves them at: nothing else.
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/stats.css": ("stats.css", "text/css; charset=utf-8"),
    "/stats.js": ("stats.js", "text/javascript; charset=utf-8"),
}
API_PATH = "/api/v1/overview"
STATS_SERVER_CC = os.path.join(ROOT, "sidecar", "host", "stats_server.cc")


def daemon_security_headers():
    """The headers trainshardd sends with every answer (kSecurityHeaders in stats_server.cc,
    read from there so this server holds the page to the same Content-Security-Policy)."""
    with open(STATS_SERVER_CC, encoding="utf-8") as f:
        source = f.read()
    block = re.search(r"kSecurityHeaders\s*=\s*((?:\s*\"(?:[^\"\\]|\\.)*\")+)\s*;", source)
    if block is None:
        raise RuntimeError(f"no kSecurityHeaders in {STATS_SERVER_CC}")
    text = "".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", block.group(1)))
    headers = []
    for line in text.split("\\r\\n"):
        if line:
            name, value = line.split(":", 1)
            headers.append((name.strip(), value.strip()))
    if not any(name == "Content-Security-Policy" for name, _ in headers):
        raise RuntimeError(f"kSecurityHeaders in {STATS_SERVER_CC} sets no Content-Security-Policy")
    return headers

CHECK_TIMEOUT_S = 120


def say(msg):
    print(f"  [stats-page] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Fixtures: an overview after the API's contract.

def b64(data):
    return base64.b64encode(data).decode()


def digest(*parts):
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()


def address(name):
    """A gonka1… address of 38 lower-case characters after the prefix, fixed per name."""
    alphabet = "023456789acdefghjklmnpqrstuvwxyz"
    return "gonka1" + "".join(alphabet[b % 32] for b in digest("address", name)[:38])


class ShardFixture:
    """A running 3-host shard seen by its first host. overview(certified) is the daemon's answer
    once `certified` rounds are certified; at rounds_total the shard is settled."""

    SHARD_ID = 7
    OPEN_SHARD_ID = 8  # known to the host, not run here: record only
    ESCROW = 3_000_000_000
    CHAIN_ID = "trainshard-devnet"

    def __init__(self, rounds_total=8, eval_every=2, leaves_at=4):
        self.rounds_total = rounds_total
        self.eval_every = eval_every
        self.leaves_at = leaves_at  # the third host misses this round and rejoins after it
        self.hosts = [address("host1"), address("host2"), address("host3")]
        self.weights = [100, 80, 60]
        self.outsider = address("host4")
        self.total_weight = sum(self.weights)

    # Rounds ------------------------------------------------------------------------------------

    def members_of(self, r):
        return self.hosts[:2] if r == self.leaves_at else list(self.hosts)

    def evaluated(self, r):
        return r % self.eval_every == 0 or r == self.rounds_total

    def train_loss(self, r):
        return round(3.1 + 2.4 * math.exp(-r / 3.0) + 0.04 * math.sin(r * 1.7), 6)

    def eval_loss_micro(self, r):
        return int(round((3.3 + 2.3 * math.exp(-r / 3.2)) * 1e6)) if self.evaluated(r) else 0

    def round_summary(self, r):
        members = self.members_of(r)
        return {
            "round": str(r),
            "attempt": 2 if r == self.leaves_at else 1,
            "members": members,
            "new_root": b64(digest("root", r)),
            "train_loss": self.train_loss(r),
            "eval_loss_micro": str(self.eval_loss_micro(r)),
            "bytes_exchanged": str(2_400_000 + 37_000 * r),
            "signed_weight": str(sum(w for h, w in zip(self.hosts, self.weights) if h in members)),
            "inner_seconds": 4.2 + 0.1 * r,
            "round_seconds": 6.0 + 0.1 * r,
            "exchange_seconds": 0.9,
            "certify_seconds": 0.35,
            "publish_seconds": 0.2,
        }

    def transitions(self, certified):
        lines = ["worker started (pid 4242, cpu, 2 threads)",
                 "data prepared: 12 training shards, 1 eval set"]
        for r in range(1, certified + 1):
            if r == self.leaves_at:
                lines.append(f"round {r}: attempt 1 failed: {self.hosts[2][:14]} did not answer "
                             f"({MARKUP}); planning again without it")
            if r == self.leaves_at + 1:
                lines.append(f"round {r}: {self.hosts[2][:14]} joined again after catching up")
            s = self.round_summary(r)
            lines.append(f"round {r} certified (attempt {s['attempt']}, {len(s['members'])} "
                         f"signatures, weight {s['signed_weight']}/{self.total_weight}): root "
                         f"{digest('root', r).hex()[:8]}, train loss {s['train_loss']}")
        return [f"12:{i // 60:02d}:{i % 60:02d} {line}" for i, line in enumerate(lines)]

    # Messages ----------------------------------------------------------------------------------

    def settlement(self, certified):
        tokens = {h: 0 for h in self.hosts}
        rounds = {h: 0 for h in self.hosts}
        for r in range(1, certified + 1):
            for h in self.members_of(r):
                rounds[h] += 1
                if r <= certified - 2:  # the last two rounds pay nobody
                    tokens[h] += 4096 * self.weights[self.hosts.index(h)] // 20
        all_tokens = sum(tokens.values())
        payouts = []
        paid = 0
        for h, w in zip(self.hosts, self.weights):
            amount = self.ESCROW * tokens[h] // all_tokens
            paid += amount
            payouts.append({
                "host": h, "amount": str(amount), "rounds_contributed": str(rounds[h]),
                "tokens": str(tokens[h]), "verified": rounds[h] // 3, "rejected": 0, "marks": 0,
                "score": str(120_000 * rounds[h]), "unhelpful": 0,
            })
        return {
            "chain_id": self.CHAIN_ID,
            "shard_id": str(self.SHARD_ID),
            "final_checkpoint_root": b64(digest("root", certified)),
            "evaluation": {"metric": "eval_loss", "value_micro": str(self.eval_loss_micro(certified)),
                           "evaluators": 3, "eval_set_root": b64(digest("eval-set"))},
            "payouts": payouts,
            "refund": str(self.ESCROW - paid),
            "rounds_completed": str(certified),
            "rounds_planned": str(self.rounds_total),
        }

    def record(self, settled):
        return {
            "shard_id": str(self.SHARD_ID),
            "status": "SHARD_STATUS_SETTLED" if settled else "SHARD_STATUS_RUNNING",
            "hardware_profile": "cpu-small",
            "max_nodes": 4,
            "escrow": str(self.ESCROW),
            "reservation_sent": True,
            "reserved": True,
            "frozen_weight": str(self.weights[0]),
            "members": [{"host": h, "weight": str(w)} for h, w in zip(self.hosts, self.weights)],
            "total_weight": str(self.total_weight),
            "deadline_height": "5400",
            "skip_reason": "",
            "settlement_signed": settled,
            "settlement_root": b64(digest("root", self.rounds_total)) if settled else "",
        }

    def open_record(self):
        return {
            "shard_id": str(self.OPEN_SHARD_ID), "status": "SHARD_STATUS_OPEN",
            "hardware_profile": "cpu-small", "max_nodes": 3, "escrow": "500000000",
            "reservation_sent": True, "reserved": True, "frozen_weight": str(self.weights[0]),
            "members": [{"host": self.outsider, "weight": "40"},
                        {"host": self.hosts[0], "weight": str(self.weights[0])}],
            "total_weight": str(40 + self.weights[0]),
            "deadline_height": "9000",
            "skip_reason": "",
            "settlement_signed": False, "settlement_root": "",
        }

    def run(self, certified):
        done = certified >= self.rounds_total
        rounds = [self.round_summary(r) for r in range(1, certified + 1)]
        run = {
            "shard_id": str(self.SHARD_ID),
            "state": "done" if done else "training",
            "error": "",
            "certified_round": str(certified),
            "rounds_total": str(self.rounds_total),
            "root": b64(digest("root", certified)),
            "current_round": str(certified if done else certified + 1),
            "attempt": 1,
            "planner": self.hosts[certified % 3],
            "rounds": rounds,
            "transitions": self.transitions(certified),
            "bytes_exchanged": str(sum(int(r["bytes_exchanged"]) for r in rounds)),
            "inner_seconds": sum(r["inner_seconds"] for r in rounds),
            "wall_seconds": 12.0 + sum(r["round_seconds"] for r in rounds),
            "final_checkpoint_artifact_id": b64(digest("artifact", certified)) if done else "",
            "settlement_txhash": digest("tx", certified).hex().upper() if done else "",
            "parameters": "1204224",
            "checkpoint_bytes": "4817152",
            "initial_eval_loss_micro": str(self.eval_loss_micro(0) or 5_612_000),
            "worker_restarts": 0,
            "planner_round": str(certified + 1),
            "shard_process_pid": "31337",
            "shard_process_restarts": 0,
            "worker_device": "cpu",
            "replays": certified // 2,
            "replays_passed": certified // 2,
            "marks": 0,
            "replay_seconds": 1.5 * (certified // 2),
        }
        if done:
            run["settlement"] = self.settlement(certified)
        return run

    def chain_shard(self, shard_id, status, reservations, closed=0, reason="CLOSE_REASON_UNSPECIFIED"):
        return {
            "id": str(shard_id),
            "spec": {
                "run_spec_hash": b64(digest("spec", shard_id)), "hardware_profile": "cpu-small",
                "min_nodes": 2, "max_nodes": 4, "min_host_weight": "10",
                "max_duration_blocks": "5000",
                "escrow": {"denom": "ngonka", "amount": str(self.ESCROW)},
                "artifact_quota": {"bytes_max": "1073741824", "files_max": "64"},
                "reward_policy": {"kind": "KIND_VERIFIED_WORK", "max_host_share_bps": 10000},
                "reservation_window_blocks": "100", "run_spec": "", "readers": [],
            },
            "creator": address("creator"),
            "status": status,
            "proposal_id": str(shard_id),
            "proposed_height": str(100 * shard_id),
            "open_height": str(100 * shard_id + 10),
            "reservation_deadline_height": str(100 * shard_id + 110),
            "deadline_height": str(100 * shard_id + 5010),
            "closed_height": str(closed),
            "close_reason": reason,
            "escrow_held": "0" if closed else str(self.ESCROW),
            "reservations": [{
                "shard_id": str(shard_id), "host": h, "endpoint": f"127.0.0.1:{7100 + i}",
                "tls_cert_sha256": b64(digest("cert", h)), "valid_until_height": "0",
                "signature": b64(digest("sig", h, shard_id) * 2 + b"\x01"),
                "frozen_weight": str(w), "reserved_height": str(100 * shard_id + 20 + i),
            } for i, (h, w) in enumerate(reservations)],
            "total_weight": str(sum(w for _, w in reservations)),
        }

    def overview(self, certified):
        certified = max(0, min(certified, self.rounds_total))
        settled = certified >= self.rounds_total
        members = list(zip(self.hosts, self.weights))
        height = 800 + 3 * certified
        shard = self.chain_shard(self.SHARD_ID, "SHARD_STATUS_SETTLED" if settled
                                 else "SHARD_STATUS_RUNNING", members,
                                 closed=height - 1 if settled else 0,
                                 reason="CLOSE_REASON_SETTLED" if settled
                                 else "CLOSE_REASON_UNSPECIFIED")
        network_shards = [
            self.chain_shard(5, "SHARD_STATUS_SETTLED", members[:2], closed=690,
                             reason="CLOSE_REASON_SETTLED"),
            self.chain_shard(6, "SHARD_STATUS_EXPIRED", [], closed=720,
                             reason="CLOSE_REASON_NOT_ENOUGH_NODES"),
            shard,
            self.chain_shard(self.OPEN_SHARD_ID, "SHARD_STATUS_OPEN",
                             [(self.outsider, 40), (self.hosts[0], self.weights[0])]),
        ]
        entry = {"record": self.record(settled), "run": self.run(certified), "settlement": None,
                 "store_bytes": 4817152 * min(certified, 2) + 1_310_720}
        if settled:
            entry["settlement"] = {
                "settlement": self.settlement(certified),
                "signatures": [{"host": h, "signature": b64(digest("ssig", h) * 2 + b"\x00")}
                               for h in self.hosts],
                "signed_weight": str(self.total_weight),
                "height": str(height - 1),
                "submitter": self.hosts[0],
            }
        return {
            "generated_unix_ms": int(time.time() * 1000),
            "host": {
                "address": self.hosts[0], "chain_id": self.CHAIN_ID,
                "cursor_height": str(height - 2), "chain_height": str(height),
                "pending_txs": 0, "events_processed": str(40 + 6 * certified),
                "current_weight": str(self.weights[0]), "version": "0.9.0",
                "follower_error": "", "follower_error_since_unix_ms": "0",
                "records_path": "/var/lib/trainshard/state", "records_error": "",
                "records_error_since_unix_ms": "0", "records_recoveries": "0",
                "run_starts": [{"shard_id": str(self.SHARD_ID), "started": True,
                                "waiting_for_operator": False, "attempts": 1, "last_error": ""},
                               {"shard_id": str(self.OPEN_SHARD_ID), "started": False,
                                "waiting_for_operator": True, "attempts": 0,
                                "last_error": f"the shard is not RUNNING yet {MARKUP}"}],
            },
            "network": {
                "shards_total": len(network_shards),
                "shards": network_shards,
                "weights": {
                    "epoch": "3",
                    "weights": [{"host": h, "weight": str(w)} for h, w in
                                members + [(self.outsider, 40)]],
                    "total_weight": str(self.total_weight + 40),
                },
            },
            "shards": [entry, {"record": self.open_record(), "run": None, "settlement": None,
                               "store_bytes": 0}],
        }


def sparse_overview(n):
    """An overview with what a daemon may leave out or null: the errors in place of the host's
    status (host_error), the network (network_error) and a run (run_error), a run whose rounds
    carry little, nulls where messages and lists go. Round n + 1 is certified, so the page has
    something to draw."""
    return {
        "generated_unix_ms": int(time.time() * 1000),
        "host_error": "operator API: deadline exceeded",
        "network_error": "chain client: connection refused",
        "shards_error": "operator API: deadline exceeded",
        "shards": [
            {"record": {"shard_id": "3", "members": [{"host": address("sparse")},
                                                     {"weight": "5"}, None]},
             "run": {"state": "catching_up", "rounds": [{"round": str(r + 1),
                                                         "train_loss": 2.5 - 0.1 * r,
                                                         "members": None, "new_root": "%%"}
                                                        for r in range(n + 1)] + [None],
                     "transitions": None, "settlement": {"payouts": [{}, None]}},
             "settlement": None},
            {"record": {"shard_id": "4"}, "run": None, "settlement": None,
             "run_error": "shard process: connection refused", "store_bytes": None},
            {"record": None, "run": None},
            None,
        ],
    }


# ---------------------------------------------------------------------------------------------
# The server

class PageServer:
    """Serves the page's files and the overview on 127.0.0.1, on a port the kernel picks.

    mode "progress": each overview certifies one round more (from `start` rounds);
    "fail_after_first": the first overview, then HTTP 500 for each; "always_500": HTTP 500;
    "sparse": sparse_overview() (fields missing or null)."""

    def __init__(self, fixture, mode, start=1):
        self.headers = daemon_security_headers()
        self.fixture = fixture
        self.mode = mode
        self.start = start
        self.lock = threading.Lock()
        self.overviews = 0
        self.unknown_paths = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.handle(self)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, req):
        path = req.path.split("?", 1)[0]
        if path in STATIC:
            name, content_type = STATIC[path]
            with open(os.path.join(PAGE_DIR, name), "rb") as f:
                self.send(req, 200, content_type, f.read())
            return
        if path != API_PATH:
            with self.lock:
                self.unknown_paths.append(path)
            self.send(req, 404, "text/plain; charset=utf-8", b"not found\n")
            return
        with self.lock:
            n = self.overviews
            self.overviews += 1
        if self.mode == "always_500" or (self.mode == "fail_after_first" and n > 0):
            self.send(req, 500, "text/plain; charset=utf-8",
                      b"reading the chain: deadline exceeded\n")
            return
        overview = (sparse_overview(n) if self.mode == "sparse"
                    else self.fixture.overview(self.start + n))
        body = json.dumps(overview).encode()
        self.send(req, 200, "application/json", body)

    def send(self, req, code, content_type, body):
        req.send_response(code)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        for name, value in self.headers:
            req.send_header(name, value)
        req.end_headers()
        req.wfile.write(body)


# ---------------------------------------------------------------------------------------------

def ensure_node_modules():
    if os.path.isdir(os.path.join(WEB_DIR, "node_modules", "playwright-core")):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed (Debian: apt-get install npm)")
    say("npm ci in tests/functional/web")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=WEB_DIR, check=True, timeout=600)


class StatsPageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for tool, why in (("node", "Debian: apt-get install nodejs"),):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not installed ({why})")
        if not os.access(CHROMIUM, os.X_OK):
            raise RuntimeError(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
        ensure_node_modules()
        os.makedirs(ARTIFACTS_DIR, exist_ok=True)

    def drive(self, url, label, *extra, min_increase=0):
        cmd = ["node", CHECK, "--url", url, "--screenshots", ARTIFACTS_DIR,
               "--min-increase", str(min_increase), "--timeout-s", str(CHECK_TIMEOUT_S),
               "--label", label, "--chromium", CHROMIUM, *extra]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S + 60)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        self.assertTrue(lines, f"the check printed nothing; stderr:\n{proc.stderr}")
        result = json.loads(lines[-1])
        say(f"{label}: exit {proc.returncode} in {time.monotonic() - started:.1f} s: {lines[-1]}")
        self.assertEqual(proc.returncode, 0,
                         f"the check failed: {result.get('failures')}\nstderr:\n{proc.stderr}")
        self.assertTrue(result["ok"])
        self.assertEqual(result["console_errors"], [])
        self.assertEqual(result["page_errors"], [])
        self.assertEqual(result["foreign_requests"], [])
        self.assertLessEqual(result["page_width"]["360"]["scroll_width"],
                             result["page_width"]["360"]["client_width"])
        self.assertTrue(result["keyboard"]["skip_link"], result["keyboard"])
        self.assertEqual(len(result["screenshots"]), 2)
        for shot in result["screenshots"]:
            with open(shot, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", shot)
        return result

    def test_page_follows_a_shard_live(self):
        fixture = ShardFixture(rounds_total=8)
        with PageServer(fixture, "progress", start=1) as server:
            result = self.drive(server.url, "stats", min_increase=4)
            self.assertEqual(server.unknown_paths, [])
        self.assertEqual(result["connection_state"], "live")
        self.assertEqual(result["shard_id"], str(ShardFixture.SHARD_ID))
        self.assertEqual(result["shards"], 2)  # the running shard and the open one, not run here
        self.assertEqual(result["hosts"], 3)
        self.assertGreaterEqual(result["points_first"], 1)
        self.assertGreaterEqual(result["points_last"], result["points_first"] + 4)
        self.assertEqual(result["api_load_errors"], 0)
        self.assertTrue(result["keyboard"]["tabs"], result["keyboard"])
        kept = result["update_kept"]
        self.assertTrue(kept["focus"] and kept["details_open"], kept)

    def test_page_keeps_the_last_update_while_the_api_fails(self):
        fixture = ShardFixture(rounds_total=8)
        with PageServer(fixture, "fail_after_first", start=3) as server:
            result = self.drive(server.url, "stats-api-failing", "--expect", "reconnecting",
                                "--allow-api-errors")
            self.assertEqual(server.unknown_paths, [])
            self.assertGreaterEqual(server.overviews, 2)
        self.assertEqual(result["connection_state"], "reconnecting")
        self.assertIn("HTTP 500", result["connection_text"])
        self.assertEqual(result["shards"], 2)
        self.assertEqual(result["hosts"], 3)
        self.assertEqual(result["points_last"], 3)
        self.assertGreaterEqual(result["api_load_errors"], 1)

    def test_page_without_any_answer_shows_reconnecting(self):
        with PageServer(ShardFixture(), "always_500") as server:
            result = self.drive(server.url, "stats-api-down", "--expect", "reconnecting",
                                "--allow-api-errors")
            self.assertEqual(server.unknown_paths, [])
        self.assertEqual(result["connection_state"], "reconnecting")
        self.assertIn("HTTP 500", result["connection_text"])
        self.assertEqual(result["shards"], 0)
        self.assertGreaterEqual(result["api_load_errors"], 1)

    def test_page_renders_an_overview_with_fields_missing(self):
        with PageServer(ShardFixture(), "sparse") as server:
            result = self.drive(server.url, "stats-sparse", min_increase=1)
            self.assertEqual(server.unknown_paths, [])
        self.assertEqual(result["connection_state"], "live")
        self.assertEqual(result["shard_id"], "3")
        self.assertEqual(result["shards"], 2)  # entries without a shard id are left out
        self.assertEqual(result["hosts"], 1)  # members without an address are left out
        self.assertGreaterEqual(result["points_last"], result["points_first"] + 1)

    def test_the_files_are_self_contained(self):
        """Only the three files, no outside origin, and data never parsed as markup."""
        self.assertEqual(sorted(os.listdir(PAGE_DIR)), ["index.html", "stats.css", "stats.js"])
        for name in ("index.html", "stats.css", "stats.js"):
            with open(os.path.join(PAGE_DIR, name), encoding="utf-8") as f:
                text = f.read()
            urls = [u for u in re.findall(r"https?://[^\s'\")]+", text)
                    if not u.startswith("http://www.w3.org/2000/svg")]
            self.assertEqual(urls, [], f"{name} names another origin")
            self.assertNotRegex(text, r"@import|url\((?!['\"]?data:)", f"{name} loads a resource")
        with open(os.path.join(PAGE_DIR, "index.html"), encoding="utf-8") as f:
            html = f.read()
        loads = re.findall(r"(?:src|href)=\"([^\"#][^\"]*)\"", html)
        self.assertEqual(sorted(u for u in loads if not u.startswith("data:")),
                         ["api/v1/overview", "stats.css", "stats.js"])
        with open(os.path.join(PAGE_DIR, "stats.js"), encoding="utf-8") as f:
            js = f.read()
        self.assertNotRegex(js, r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(")


if __name__ == "__main__":
    unittest.main(verbosity=2)
