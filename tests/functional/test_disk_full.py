"""Full disks under a host sidecar, on real filesystems (size-limited tmpfs mounts): a devnet, two
real trainshardd processes (A and B, members of one shard) and the real CLI. Host A's data dir
and its artifacts_dir each sit on a tmpfs of their own, which the test fills with a filler file
and frees again. Must run as root (mount): it fails, never skips, otherwise.

  1. records: with A's data dir full, A's follower stops (its cursor stays while the chain goes
     on), says so at error level in its log and in `host status` (follower and records errors,
     since when); once the filler is removed it catches up with the chain by itself, in the same
     process, every event seen once.
  2. artifacts: a publish larger than what is left of A's artifacts filesystem fails with
     "No space left on device" and leaves no chunk file behind; `verify` counts unreferenced
     chunks (none) and their bytes; the next, smaller publish fits without a gc.
"""

import atexit
import hashlib
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_lifecycle import assert_events_seen_once  # noqa: E402

MIB = 1 << 20
RECORDS_FS_BYTES = 8 * MIB
ARTIFACTS_FS_BYTES = 4 * MIB
# Heights the chain must move past a stalled cursor before the stall counts as one.
STALL_HEIGHTS = 10


def say(msg):
    print(f"  [disk-full] {msg}", flush=True)


class Tmpfs:
    """A tmpfs of `size` bytes mounted on `path` (created), with a filler file to fill it."""

    def __init__(self, path, size):
        self.path = path
        self.size = size
        self.filler = os.path.join(path, "filler")
        self.mounted = False

    def mount(self):
        os.makedirs(self.path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0700", "tmpfs",
                        self.path], check=True)
        self.mounted = True
        return self

    def fill(self):
        """Writes the filler until the kernel refuses (ENOSPC); returns its size."""
        block = b"f" * 65536
        with open(self.filler, "ab", buffering=0) as f:
            while True:
                try:
                    f.write(block)
                except OSError:
                    break
        return os.path.getsize(self.filler)

    def free(self):
        if os.path.exists(self.filler):
            os.unlink(self.filler)

    def free_bytes(self):
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def unmount(self):
        if self.mounted:
            subprocess.run(["umount", "-l", self.path], check=False)
            self.mounted = False


def n(value):
    """A JSON integer (64-bit fields are strings in protobuf JSON), 0 when absent."""
    return int(value or 0)


class DiskFullTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise PermissionError("the disk-full suite must run as root (mount -t tmpfs)")
        cls.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")), voting_period=10,
                                  host_weights=(100, 80))
        net = cls.net
        cls.mounts = []
        atexit.register(cls._teardown)
        try:
            net.init()
            net.start_devnet()
            say(f"devnet on {net.chain}, work dir {net.root}")
            cls.records_fs = Tmpfs(os.path.join(net.root, "A", "data"), RECORDS_FS_BYTES).mount()
            cls.artifacts_fs = Tmpfs(os.path.join(net.root, "A-artifacts"),
                                     ARTIFACTS_FS_BYTES).mount()
            cls.mounts = [cls.records_fs, cls.artifacts_fs]
            cls.a = net.add_host("A", "host1",
                                 extra_config={"artifacts_dir": f'"{cls.artifacts_fs.path}"'})
            cls.b = net.add_host("B", "host2")
            say(f"A's data dir on a {RECORDS_FS_BYTES >> 20} MiB tmpfs, its artifacts_dir on a "
                f"{ARTIFACTS_FS_BYTES >> 20} MiB tmpfs")
            spec = net.write_spec("disk-full", min_nodes=2, max_nodes=2, max_duration=3000,
                                  quota_bytes=64 * MIB, quota_files=1000)
            _, cls.sid = net.propose_and_pass(spec, voters=("host1", "host2"))
            net.wait_shard_status(cls.sid, "SHARD_STATUS_RUNNING", 60)
            harness.wait_for(lambda: any(r["shard_id"] == cls.sid and r["reserved"]
                                         for r in cls.a.shards()["shards"]), 30,
                             "A to record its reservation")
            say(f"shard {cls.sid} RUNNING with A and B")
        except BaseException:
            cls._teardown()
            raise

    @classmethod
    def _teardown(cls):
        try:
            cls.net.cleanup()
        finally:
            for m in cls.mounts:
                m.unmount()
            cls.mounts = []

    @classmethod
    def tearDownClass(cls):
        cls._teardown()

    def log_lines(self, host, since_offset=0):
        with open(host.process.log_path, errors="replace") as f:
            f.seek(since_offset)
            return f.read().splitlines()

    # -- 1 -------------------------------------------------------------------------------------
    def test_1_full_records_disk_stops_the_follower_until_space_is_back(self):
        a, net = self.a, self.net
        pid = a.process.proc.pid
        log_offset = os.path.getsize(a.process.log_path)
        before = a.status()
        self.assertEqual(before.get("follower_error", ""), "", before)
        self.assertEqual(before.get("records_error", ""), "", before)
        filled = self.records_fs.fill()
        filled_at = time.monotonic()
        say(f"filled A's data dir: {filled} bytes of filler, {self.records_fs.free_bytes()} free")
        try:
            def stalled():
                s = a.status()
                return s if n(s["chain_height"]) - n(s["cursor_height"]) >= STALL_HEIGHTS else None
            s = harness.wait_for(stalled, 30, f"A's cursor to fall {STALL_HEIGHTS} heights behind")
            stalled_at = n(s["cursor_height"])
            time.sleep(1.0)
            # What the operator sees while it lasts; asserted below, after the recovery.
            during = a.status()
            human = net.cli("host", "status", "--host", a.operator, json_out=False).stdout
            lines_during = self.log_lines(a, log_offset)
            stall_s = time.monotonic() - filled_at
            say(f"stalled: cursor {n(during['cursor_height'])}, chain "
                f"{n(during['chain_height'])}; follower_error {during.get('follower_error')!r}")
            self.assertEqual(n(during["cursor_height"]), stalled_at, "the cursor moved while full")
        finally:
            self.records_fs.free()
        freed_at_height = net.height()
        say(f"freed the filler at chain height {freed_at_height}")
        t0 = time.monotonic()
        harness.wait_for(lambda: n(a.status()["cursor_height"]) >= freed_at_height, 30,
                         f"A's cursor to catch up to height {freed_at_height} without a restart")
        say(f"caught up in {time.monotonic() - t0:.1f}s")
        self.assertTrue(a.process.alive())
        self.assertEqual(a.process.proc.pid, pid, "A was restarted")

        # While full: the status said why, and since when.
        self.assertIn("No space left on device", during.get("follower_error", ""), during)
        self.assertGreater(n(during.get("follower_error_since_unix_ms")), 0, during)
        self.assertIn("No space left on device", during.get("records_error", ""), during)
        self.assertEqual(during.get("records_path"), os.path.join(a.data_dir, "state"), during)
        self.assertGreater(n(during.get("records_error_since_unix_ms")), 0, during)
        self.assertLessEqual(n(during["records_error_since_unix_ms"]),
                             n(during["follower_error_since_unix_ms"]) + 1000, during)
        self.assertIn("follower:", human)
        self.assertIn("stopped since", human)
        self.assertIn("refusing writes since", human)
        # ...and the log, at error level, what is wrong, where, and that it is not following.
        errors = [line for line in lines_during if "level=error" in line and
                  "not following the chain" in line]
        self.assertTrue(errors, "no error-level line says the host is not following:\n" +
                        "\n".join(lines_during[-20:]))
        self.assertIn(os.path.join(a.data_dir, "state"), errors[0])
        self.assertIn("No space left on device", errors[0])
        # Rate-limited: the first, then at most one per 10 s.
        self.assertLessEqual(len(errors), 2 + int(stall_s / 10), errors)

        # Afterwards: following, records writable, every event seen once.
        after = a.status()
        self.assertEqual(after.get("follower_error", ""), "", after)
        self.assertEqual(n(after.get("follower_error_since_unix_ms")), 0, after)
        self.assertEqual(after.get("records_error", ""), "", after)
        self.assertGreaterEqual(n(after.get("records_recoveries")), 1, after)
        lines_after = self.log_lines(a, log_offset)
        self.assertTrue(any("take writes again" in line for line in lines_after))
        harness.wait_for(lambda: n(a.status()["cursor_height"]) >= net.height() - 2, 10,
                         "A to keep following")
        assert_events_seen_once(self, net, a)
        human_after = net.cli("host", "status", "--host", a.operator, json_out=False).stdout
        self.assertIn("following", human_after)
        self.assertIn("writable", human_after)

    # -- 2 -------------------------------------------------------------------------------------
    def test_2_failed_publish_on_a_full_disk_leaves_nothing_behind(self):
        a, net = self.a, self.net
        store = os.path.join(self.artifacts_fs.path, str(self.sid))
        free = self.artifacts_fs.free_bytes()
        big = os.path.join(net.root, "src", "big")
        harness.write_random_files(big, {f"part-{i}.bin": MIB for i in range(6)})
        r = net.artifact(a, "publish", "--shard", str(self.sid), "--dir", big,
                         "--chunk-size", str(MIB), check=False)
        say(f"publish of 6 MiB with {free} bytes free: exit {r.returncode}: "
            f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"[:400])
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("No space left on device", r.stderr)

        chunks = []
        for dirpath, _, filenames in os.walk(os.path.join(store, "chunks")):
            chunks += [os.path.join(dirpath, f) for f in filenames]
        self.assertEqual(chunks, [], f"the failed publish left {len(chunks)} chunk files")
        self.assertEqual(os.listdir(os.path.join(store, "tmp")), [])
        v = net.artifact(a, "verify", "--shard", str(self.sid))
        self.assertIn("unreferenced_bytes", v, v)
        self.assertEqual(v.get("unreferenced", []), [], v)
        self.assertEqual(n(v["unreferenced_bytes"]), 0, v)
        self.assertGreaterEqual(self.artifacts_fs.free_bytes(), free - 64 * 1024)

        small = os.path.join(net.root, "src", "small")
        files = harness.write_random_files(small, {"weights.bin": 2 * MIB, "meta.json": 100})
        out = net.artifact(a, "publish", "--shard", str(self.sid), "--dir", small,
                           "--chunk-size", str(MIB))
        self.assertTrue(out["done"], out)
        say(f"then a 2 MiB publish fits without a gc: {out['artifact_id'][:16]}..")
        v = net.artifact(a, "verify", "--shard", str(self.sid))
        self.assertEqual(v.get("unreferenced", []), [], v)
        self.assertEqual(n(v["chunks_ok"]), len(harness.chunk_hashes(files, MIB)), v)

        # Unreferenced chunks are counted, with their bytes, and the text says so.
        stray = os.urandom(300 * 1024)
        name = hashlib.sha256(stray).hexdigest()
        os.makedirs(os.path.join(store, "chunks", name[:2]), exist_ok=True)
        with open(os.path.join(store, "chunks", name[:2], name), "wb") as f:
            f.write(stray)
        v = net.artifact(a, "verify", "--shard", str(self.sid))
        self.assertEqual(v["unreferenced"], [name], v)
        self.assertEqual(n(v["unreferenced_bytes"]), len(stray), v)
        text = net.cli("artifact", "verify", "--host", a.operator, "--shard", str(self.sid),
                       json_out=False).stdout
        self.assertIn(f"1 unreferenced chunks holding {len(stray)} bytes", text)
        self.assertNotIn("clean", text)
        gc = net.artifact(a, "gc", "--shard", str(self.sid))
        self.assertEqual(n(gc["chunks_removed"]), 1, gc)


if __name__ == "__main__":
    unittest.main(verbosity=2)
