"""The guides run for real: every ```sh block of docs/operator-guide.md, then of
docs/researcher-guide.md, in order, in one bash session (as a person at a terminal: variables,
the working folder and background jobs carry from block to block), against a devnet and real
hosts on loopback in a temporary folder.

The session starts in a view of the checkout (its top-level entries linked, `build` linked to the
build under test), with the guides' variables set to the test's folders and free ports:
PREFIX, TS_HOME, TS_KEY, TS_CONFIG, TS_LOG, SHARD_ENDPOINT, STATS_LISTEN, FILES, BACKUP (operator
guide) and WORK, KEY, HOST_DIR (researcher guide; HOST_DIR is the operator guide's host). Each
block runs under `set -euo pipefail`; a block that fails or runs past BLOCK_TIMEOUT_S fails the
test with the guide's line, the block and its output.

What the markdown says to the test, in HTML comments:
- `<!-- guide: not run (why) -->` on the line before a ```sh block: the block is shown, not run.
  At most MAX_NOT_RUN such blocks; today five, all in the operator guide:
  the variables' example values (the test sets its own), `scripts/install-deps.sh` and
  `scripts/build.sh` (root and apt; the test runs on the build it was given), the `ufw` rules
  (the machine's firewall, as root), and the systemd start and the systemd upgrade (no systemd
  as PID 1 here, and root). The test's own `cmake --install` into PREFIX, the start in the
  background and the upgrade by SIGTERM run instead.
- `<!-- guide: setup devnet ... -->`: here the test makes a devnet whose genesis funds the
  account of $TS_KEY (made by the blocks before) and gives it a PoC weight of 60 beside two more
  hosts (100 and 80) that it starts through harness.py, opens a shard for the guide's host to
  join (a tiny llama on the fortunes corpus, three hosts), and sets TRAINSHARD_CHAIN, SHARD_ID
  and, for the researcher guide, FAUCET_KEY (a funded genesis account) and VOTER_KEYS (the two
  hosts' keys).

Every other fenced block must be data (yaml, json, toml, text): a command in a ```bash or
unlabelled block would escape the test, so the test refuses them. The guides use `jq`, `curl`,
`tar`, `basenc` and Debian's fortunes.

TS_KEEP=1 keeps the temporary folder: each block and its output are under `session/`, the
guide's host under `op/`, the devnet and the other hosts under `net/`.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDES = ("docs/operator-guide.md", "docs/researcher-guide.md")
# Blocks a guide may show without the test running them (see the docstring for which and why).
MAX_NOT_RUN = 5
# The longest one block may take: the waits for a shard to train and settle are the long ones.
BLOCK_TIMEOUT_S = 300
# Fenced blocks that are data, not commands.
DATA_LANGUAGES = {"yaml", "json", "toml", "text"}
NOT_RUN = re.compile(r"^<!-- guide: not run \((.+)\) -->$")
SETUP = re.compile(r"^<!-- guide: setup ([a-z-]+)\b.* -->$")
# The shard the setup opens for the operator guide's host: blocks it stays open for, so the host
# can start, catch up and reserve.
RESERVATION_WINDOW_BLOCKS = 1500


def say(msg):
    print(f"[guides {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class GuideError(Exception):
    pass


def parse_guide(path):
    """The guide's steps in order: ("sh", line, text), ("not run", line, text, why) and
    ("setup", line, name). Raises GuideError for a fence of another language, a marker that is
    not followed by a ```sh block, an unknown `guide:` comment or an unclosed fence."""
    with open(path) as f:
        lines = f.read().split("\n")
    rel = os.path.relpath(path, SOURCE_DIR)
    steps = []
    pending_not_run = None  # (line, why) of a marker that must precede the next line's fence
    i = 0
    while i < len(lines):
        line = lines[i]
        n = i + 1
        stripped = line.strip()
        if pending_not_run and not stripped.startswith("```"):
            raise GuideError(f"{rel}:{pending_not_run[0]}: `not run` is not on the line before "
                             "a ```sh block")
        if stripped.startswith("<!-- guide:"):
            m_not_run, m_setup = NOT_RUN.match(stripped), SETUP.match(stripped)
            if m_not_run:
                pending_not_run = (n, m_not_run.group(1))
            elif m_setup:
                steps.append(("setup", n, m_setup.group(1)))
            else:
                raise GuideError(f"{rel}:{n}: unknown guide comment: {stripped}")
        elif stripped.startswith("```"):
            language = stripped[3:].strip()
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise GuideError(f"{rel}:{n}: the fence is never closed")
            text = "\n".join(lines[i + 1:end]) + "\n"
            if language == "sh":
                if pending_not_run:
                    steps.append(("not run", n, text, pending_not_run[1]))
                else:
                    steps.append(("sh", n, text))
            elif language not in DATA_LANGUAGES:
                raise GuideError(f"{rel}:{n}: a ```{language} block: commands go in ```sh "
                                 f"blocks (run by this test), data in {sorted(DATA_LANGUAGES)}")
            elif pending_not_run:
                raise GuideError(f"{rel}:{pending_not_run[0]}: `not run` before a "
                                 f"```{language} block")
            pending_not_run = None
            i = end
        i += 1
    if pending_not_run:
        raise GuideError(f"{rel}:{pending_not_run[0]}: `not run` at the end of the file")
    return steps


class Session:
    """One bash reading the blocks on its stdin, as a terminal would: each block is sourced
    under `set -euo pipefail` with its output to a file of its own, so a failing command ends
    the session (and the test) and the block's output says why."""

    def __init__(self, folder, cwd, env):
        self.folder = folder
        os.makedirs(folder)
        self.count = 0
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=cwd, env=env, text=True, start_new_session=True)

    def run(self, text, timeout_s):
        """Runs one block; returns (ok, exit status or None for a timeout, output)."""
        self.count += 1
        base = os.path.join(self.folder, f"block-{self.count:02d}")
        script, out, done = base + ".sh", base + ".out", base + ".done"
        with open(script, "w") as f:
            f.write(text)
        self.proc.stdin.write(f"exec >{shlex.quote(out)} 2>&1\n"
                              "set -euo pipefail\n"
                              f"source {shlex.quote(script)} </dev/null\n"
                              "set +euo pipefail\n"
                              f": >{shlex.quote(done)}\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        status = None
        while True:
            if os.path.exists(done):
                return True, 0, self.output(out)
            status = self.proc.poll()
            if status is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        return False, status, self.output(out)

    def export(self, variables):
        """Sets variables in the session, exported, as a person would type them."""
        for name, value in variables.items():
            self.proc.stdin.write(f"export {name}={shlex.quote(str(value))}\n")
        self.proc.stdin.flush()

    @staticmethod
    def output(path, limit=12000):
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def stop(self):
        """Ends the session and what it left running in the background (its process group:
        the background jobs of a shell without job control stay in it)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        for sig, wait_s in ((signal.SIGTERM, 40), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    break
                self.proc.poll()
                time.sleep(0.2)
        self.proc.poll()


class GuidesTest(unittest.TestCase):
    def setUp(self):
        self.keep = bool(os.environ.get("TS_KEEP"))
        self.root = tempfile.mkdtemp(prefix="ts-guides-")
        self.net = None
        self.session = None
        for tool in ("jq", "curl", "tar", "basenc"):
            if not shutil.which(tool):
                self.fail(f"the guides use {tool}, which is not installed")

    def tearDown(self):
        if self.session:
            self.session.stop()
        if self.net:
            self.net.stop()
        if self.keep:
            say(f"kept {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def checkout_view(self):
        """The checkout's top-level entries, linked, with `build` the build under test."""
        view = os.path.join(self.root, "checkout")
        os.makedirs(view)
        for name in os.listdir(SOURCE_DIR):
            if name != "build":
                os.symlink(os.path.join(SOURCE_DIR, name), os.path.join(view, name))
        os.symlink(os.path.abspath(harness.BUILD_DIR), os.path.join(view, "build"))
        return view

    def environment(self):
        op = os.path.join(self.root, "op")
        files = os.path.join(op, "files")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSHARD_")}
        env.update({
            "PREFIX": os.path.join(self.root, "prefix"),
            "TS_HOME": os.path.join(op, "data"),
            "TS_KEY": os.path.join(op, "data", "host.key"),
            "TS_CONFIG": os.path.join(op, "trainshardd.toml"),
            "TS_LOG": os.path.join(op, "trainshardd.log"),
            "SHARD_ENDPOINT": f"127.0.0.1:{harness.free_port()}",
            "STATS_LISTEN": f"127.0.0.1:{harness.free_port()}",
            "FILES": files,
            "BACKUP": os.path.join(self.root, "backup"),
            "WORK": os.path.join(files, "research"),
            "KEY": os.path.join(self.root, "researcher.key"),
            "HOST_DIR": os.path.join(op, "data"),
        })
        os.makedirs(op)
        return env

    def setup_devnet(self, env):
        """The devnet the operator guide's host joins (see the module docstring)."""
        net = harness.Network(root=os.path.join(self.root, "net"), voting_period=10,
                              host_weights=(100, 80), keep=True)
        self.net = net
        os.makedirs(net.root)
        op_address = net.cli("keys", "show", "--key", env["TS_KEY"])["address"]
        for name in ("creator", "authority", "host1", "host2"):
            net.new_key(name)
        args = ["devnet", "init", "--home", net.home, "--chain-id", net.chain_id,
                "--poc-authority", net.address("authority"), "--voting-period",
                str(net.voting_period), "--epoch-length", "1000000", "--min-deposit", "1000"]
        for address in [k["address"] for k in net.keys.values()] + [op_address]:
            args += ["--account", f"{address}=1000000000"]
        for name, weight in (("host1", 100), ("host2", 80)):
            args += ["--weight", f"{net.address(name)}={weight}"]
        args += ["--weight", f"{op_address}=60"]
        net.cli(*args)
        net.start_devnet()
        for name in ("host1", "host2"):
            net.add_host(name).wait_shard_listen()
        run_spec = net.write_run_spec(
            "operator", rounds=3, innerSteps=10, evalEvery=1,
            model={"kind": "llama", "preset": "tiny", "seed": "7",
                   "config": {"vocab": 384, "context": 32}})
        spec = net.write_spec("operator", min_nodes=3, max_nodes=3, max_duration=6000,
                              window=RESERVATION_WINDOW_BLOCKS, run_spec=run_spec)
        _, sid = net.propose_and_pass(spec, voters=("host1", "host2"), run_spec=run_spec)
        harness.wait_for(lambda: len(net.shard(sid).get("reservations", [])) == 2, 60,
                         f"hosts 1 and 2 to reserve shard {sid}")
        say(f"devnet {net.chain}: hosts 1 and 2 running, shard {sid} open for the guide's host")
        return {"TRAINSHARD_CHAIN": net.chain, "SHARD_ID": sid,
                "FAUCET_KEY": net.keys["creator"]["file"],
                "VOTER_KEYS": " ".join(net.keys[h]["file"] for h in ("host1", "host2"))}

    def other_logs(self):
        """The last lines of the devnet's and the other hosts' logs, for a failure."""
        if not self.net:
            return ""
        procs = [p for p in [self.net.devnet] + [h.process for h in self.net.hosts] if p]
        return "".join(f"\n--- the tail of {p.name}'s log ---\n{p.log_tail(15)}" for p in procs)

    def test_every_block_of_the_guides(self):
        started = time.monotonic()
        guides = [(g, parse_guide(os.path.join(SOURCE_DIR, g))) for g in GUIDES]
        not_run = [(g, s[1], s[3]) for g, steps in guides for s in steps if s[0] == "not run"]
        blocks = sum(1 for _, steps in guides for s in steps if s[0] in ("sh", "not run"))
        self.assertLessEqual(len(not_run), MAX_NOT_RUN,
                             "blocks the test does not run:\n" +
                             "\n".join(f"  {g}:{n}: {why}" for g, n, why in not_run))
        env = self.environment()
        self.session = Session(os.path.join(self.root, "session"), self.checkout_view(), env)
        ran = 0
        for guide, steps in guides:
            for step in steps:
                kind, line = step[0], step[1]
                if kind == "not run":
                    say(f"{guide}:{line}: not run ({step[3]})")
                    continue
                if kind == "setup":
                    if step[2] != "devnet":
                        self.fail(f"{guide}:{line}: the test has no setup step {step[2]!r}")
                    say(f"{guide}:{line}: setup devnet")
                    self.session.export(self.setup_devnet(env))
                    continue
                text = step[2]
                lines = text.strip().split("\n")
                say(f"{guide}:{line}: {lines[0]}" + (" ..." if len(lines) > 1 else ""))
                t0 = time.monotonic()
                ok, status, output = self.session.run(text, BLOCK_TIMEOUT_S)
                if not ok:
                    why = (f"ran past {BLOCK_TIMEOUT_S} s" if status is None
                           else f"exited {status}")
                    log = Session.output(env["TS_LOG"], limit=4000)
                    self.fail(f"{guide}:{line}: the block {why}:\n{text}"
                              f"--- its output ---\n{output}\n"
                              f"--- the tail of $TS_LOG ---\n{log}" + self.other_logs())
                ran += 1
                if time.monotonic() - t0 > 5:
                    say(f"  took {time.monotonic() - t0:.0f} s")
        self.assertEqual(ran + len(not_run), blocks)
        say(f"{ran} blocks run, {len(not_run)} not run, in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    unittest.main()
