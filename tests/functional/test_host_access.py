"""Who may drive a host (docs/threat-model.md), against real daemons and a real unprivileged user.

  1. Another local user (`nobody`) cannot reach the operator API: the Unix socket refuses it, and
     no TCP port the sidecar listens on serves HostOperator or ArtifactOperator (the public
     `listen` port answers SettlementQuery alone). So it can neither publish the host's files nor
     make the host sign.
  2. The host's owner publishes only from files_root (or a shard's own work folder): the data
     dir, a folder holding the key file, a folder outside files_root, and a link leading out are
     refused; fetch --out may not write into the data dir. What is refused is never published,
     so no member can fetch the key.

Must run as root (to act as `nobody`): it fails, never skips, otherwise.
"""

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

NOBODY_UID = 65534


def say(msg):
    print(f"  [host-access] {msg}", flush=True)


def listening_ports(pid):
    """TCP ports the process `pid` listens on (ss -ltnp, run as root)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ports = set()
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        local = line.split()[3]
        ports.add(int(local.rsplit(":", 1)[1]))
    return sorted(ports)


class HostAccessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise RuntimeError("test_host_access must run as root (it acts as nobody)")
        cls.net = harness.Network(host_weights=(100, 80), keep=bool(os.environ.get("TS_KEEP")))
        cls.net.init()
        cls.net.start_devnet()
        cls.net.add_hosts()
        spec = cls.net.write_spec("access", min_nodes=2, max_nodes=2, escrow=100000,
                                  max_duration=100000, window=1000)
        _, cls.sid = cls.net.propose_and_pass(spec, voters=("host1", "host2"))
        cls.net.wait_shard_status(cls.sid, "SHARD_STATUS_RUNNING", 90)
        for h in cls.net.hosts:
            h.wait_shard_listen()
        # The CLI as another user: a copy anyone may run, in a folder anyone may enter (the
        # build tree may sit under a folder `nobody` cannot traverse).
        cls.bin_dir = tempfile.mkdtemp(prefix="ts-access-bin-")
        os.chmod(cls.bin_dir, 0o755)
        cls.cli_copy = os.path.join(cls.bin_dir, "trainshard")
        shutil.copy(harness.CLI, cls.cli_copy)
        os.chmod(cls.cli_copy, 0o755)

    @classmethod
    def tearDownClass(cls):
        cls.net.cleanup()
        shutil.rmtree(cls.bin_dir, ignore_errors=True)

    def as_nobody(self, *args):
        cmd = ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_UID}", "--clear-groups",
               self.cli_copy, "--json", "--timeout-ms", "3000", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")

    def test_another_user_cannot_drive_the_host(self):
        host = self.net.hosts[0]
        self.assertTrue(host.operator.startswith("unix:/"), host.operator)
        sock = host.operator[len("unix:"):]
        st = os.lstat(sock)
        self.assertTrue(stat.S_ISSOCK(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600, oct(st.st_mode))
        self.assertEqual(stat.S_IMODE(os.stat(host.data_dir).st_mode) & 0o077, 0)

        # The owner is served on the socket.
        self.assertEqual(host.status()["address"], host.address)

        # Another user is refused on the socket, for a read and for every call that changes or
        # reveals something: publishing a root-only folder (/root: the path resolves for anyone,
        # so the request is made), listing, and a settlement signed and submitted by the host.
        attempts = [("host", "status", "--host", host.operator),
                    ("artifact", "publish", "--host", host.operator, "--shard", self.sid,
                     "--dir", "/root"),
                    ("artifact", "list", "--host", host.operator, "--shard", self.sid),
                    ("shard", "settle", "--id", self.sid, "--hosts", host.operator,
                     "--final-root", "ab" * 32, "--work", f"{host.address}=1",
                     "--submit-via", host.operator, "--chain", self.net.chain)]
        for args in attempts:
            r = self.as_nobody(*args)
            say(f"nobody {' '.join(args[:2])}: exit {r.returncode}: "
                f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"[:200])
            self.assertNotEqual(r.returncode, 0, f"{args}: {r.stdout}")
            self.assertNotIn(host.address, r.stdout, f"{args} answered: {r.stdout}")
            # Refused at the socket, not by the CLI's own checks.
            self.assertIn(f"host {host.operator}", r.stderr, f"{args}: {r.stderr}")
        self.assertRegex(self.as_nobody("host", "status", "--host", host.operator).stderr,
                         "(?i)permission denied|cannot reach")

        # Every TCP port the daemon listens on: none serves the operator API to anyone.
        ports = listening_ports(host.process.proc.pid)
        say(f"{host.name} listens on TCP ports {ports}")
        self.assertGreaterEqual(len(ports), 2, "expected the query and peer listeners at least")
        for port in ports:
            for args in [("host", "status", "--host", f"127.0.0.1:{port}"),
                         ("artifact", "list", "--host", f"127.0.0.1:{port}", "--shard", self.sid)]:
                r = self.as_nobody(*args)
                self.assertNotEqual(r.returncode, 0, f"port {port} {args}: {r.stdout}")
                self.assertNotIn(host.address, r.stdout, f"port {port} answered {args}")

        # The public listener answers the settlement query, and nothing else.
        query = harness.read_addr_file(os.path.join(host.data_dir, "query.addr"))
        r = self.as_nobody("host", "settlement", "--host", query, "--id", self.sid)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("signed no settlement", r.stderr)
        r = self.as_nobody("host", "status", "--host", query)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("UNIMPLEMENTED", r.stderr)
        # Nothing was published by any of this.
        listed = self.net.artifact(host, "list", "--shard", self.sid, "--all")
        self.assertEqual(listed.get("artifacts", []), [])

    def refused(self, host, *args, want):
        r = self.net.artifact(host, *args, check=False)
        self.assertNotEqual(r.returncode, 0, f"{args}: {r.stdout}")
        self.assertIn(want, r.stderr, f"{args}")
        say(f"owner {args[0]} refused: {r.stderr.strip().splitlines()[-1]}"[:240])
        return r

    def test_the_owner_publishes_only_from_files_root(self):
        net, host = self.net, self.net.hosts[0]
        shard = ("--shard", self.sid)
        # Allowed: a folder under files_root (the network's root in this harness).
        src = os.path.join(net.root, "src", "ok")
        harness.write_random_files(src, {"a.bin": 4096, "sub/b.bin": 100})
        published = net.artifact(host, "publish", *shard, "--dir", src)
        self.assertTrue(published["done"])

        # Refused: the data dir, its records, a folder holding the key file (even under
        # files_root), a folder outside files_root, and a link that leads into the data dir.
        self.refused(host, "publish", *shard, "--dir", host.data_dir, want="the data dir")
        self.refused(host, "publish", *shard, "--dir", os.path.join(host.data_dir, "state"),
                     want="the data dir")
        self.refused(host, "publish", *shard, "--dir", os.path.dirname(host.key_file),
                     want="the host key file")
        self.refused(host, "publish", *shard, "--dir", net.root, want="holds")
        outside = tempfile.mkdtemp(prefix="ts-outside-")
        try:
            harness.write_random_files(outside, {"x.bin": 10})
            self.refused(host, "publish", *shard, "--dir", outside, want="outside files_root")
        finally:
            shutil.rmtree(outside, ignore_errors=True)
        link = os.path.join(net.root, "src", "to-data")
        os.symlink(host.data_dir, link)
        self.refused(host, "publish", *shard, "--dir", link, want="the data dir")
        # Writing: fetch --out into the data dir is refused before any transfer.
        other = net.hosts[1]
        self.refused(other, "fetch", *shard, "--id", published["artifact_id"], "--out",
                     os.path.join(other.data_dir, "exported"), want="the data dir")

        # Only the allowed artifact exists; its files are the source's, and no key anywhere.
        listed = net.artifact(host, "list", *shard, "--all")["artifacts"]
        self.assertEqual(len(listed), 1, listed)
        dest = os.path.join(net.root, "out", "ok")
        net.artifact(other, "fetch", *shard, "--id", published["artifact_id"], "--out", dest)
        self.assertEqual(harness.tree_sha256(dest), harness.tree_sha256(src))
        with open(host.key_file) as f:
            key_hex = f.read().strip()
        for h in net.hosts:
            for path in h.chunk_files(self.sid):
                with open(path, "rb") as f:
                    self.assertNotIn(key_hex.encode(), f.read(), f"{path} holds a key")


if __name__ == "__main__":
    unittest.main(verbosity=2)
