"""Issue 3 acceptance 1, 2, 3, 5 and the CLI-level part of 4: checkpoint artifacts between hosts
in separate network namespaces, with real trainshardd processes, the real CLI and real signals.

Hosts A, B, C (members of the shard) and D (not a member) each run in their own namespace with
their own address; the devnet is on the bridge. Every file comparison uses SHA-256 computed here
with hashlib, independently of the project's code. Must run as root (namespaces, tc): it fails,
never skips, otherwise.

  1. publish a tree of random files on A, fetch on B with --out: byte-identical.
  2. fetch through a tbf-limited link, SIGKILL B's trainshardd mid-fetch, restart: the
     interrupted fetch is listed only with --all, resumes with exactly the chunks that were not
     stored, ends byte-identical.
  3. A's chunk files tampered with: C fetches from A and B, A is reported corrupt, nothing corrupt
     is stored, the output is byte-identical.
  4. attacks through the CLI (links, devices, FIFOs, sockets, bad names, quota, a non-member, a
     symlinked --out, symlinks planted in the store): refused with a clear error, nothing written
     outside the stores, links never followed.
  5. restarts: artifacts still listed and verifiable; an interrupted fetch is never complete and
     `gc --drop-incomplete` removes it.
"""

import atexit
import hashlib
import json
import os
import shutil
import socket
import stat
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import netns  # noqa: E402

MIB = 1 << 20
KIB = 1 << 10
SMALL_CHUNK = 256 * KIB
SHAPED_MBIT = 40


def say(msg):
    print(f"  [artifacts] {msg}", flush=True)


def snapshot(root):
    """Everything under root as lstat sees it, contents hashed: a tree that must not change."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [""] + dirnames + filenames:
            path = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    content = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(path)
            else:
                content = None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size,
                        st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else None, content,
                        st.st_nlink if not stat.S_ISDIR(st.st_mode) else None)
    return out


def n(value):
    """A JSON integer (uint64 fields are strings in protobuf JSON), 0 when absent."""
    return int(value or 0)


class ArtifactsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        netns.require_root()
        cls.topo = netns.Topology(["A", "B", "C", "D"]).create()
        topo = cls.topo
        say(f"namespaces {sorted(topo.ns.values())}, bridge {topo.bridge} {topo.bridge_ip}")
        cls.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")), voting_period=10,
                                  host_weights=(100, 80, 60, 40), listen_ip=topo.bridge_ip)
        net = cls.net
        # Also on an interrupted run (after the topology's own handler: atexit runs LIFO).
        atexit.register(net.cleanup)
        try:
            net.init()
            net.start_devnet()
            say(f"devnet on {net.chain}, work dir {net.root}")
            cls.hosts = {}
            for i, name in enumerate(["A", "B", "C", "D"], start=1):
                cls.hosts[name] = net.add_host(name, f"host{i}", ip=topo.ip[name],
                                               exec_prefix=topo.prefix_args(name),
                                               auto_reserve=name != "D", shard_listen=True)
            for name, h in cls.hosts.items():
                say(f"host {name} ({h.address}) in {topo.ns[name]}: operator {h.operator}, "
                    f"peers {h.wait_shard_listen()}")
            cls.addr = {name: h.address for name, h in cls.hosts.items()}

            # Long enough (10 minutes of 200 ms blocks) that the shards outlive the suite.
            big = net.write_spec("artifacts", min_nodes=3, max_nodes=3, escrow=300000,
                                 max_duration=3000)
            small = net.write_spec("artifacts-small", min_nodes=3, max_nodes=3, escrow=300000,
                                   quota_bytes=MIB, quota_files=8, max_duration=3000)
            _, cls.sid = net.propose_and_pass(big, voters=("host1", "host2", "host3"))
            _, cls.small_sid = net.propose_and_pass(small, voters=("host1", "host2", "host3"))
            for sid in (cls.sid, cls.small_sid):
                net.wait_shard_status(sid, "SHARD_STATUS_RUNNING", 60)
                shard = net.shard(sid)
                endpoints = {r["host"]: r.get("endpoint") for r in shard["reservations"]}
                members = set(endpoints)
                want = {cls.addr[x] for x in "ABC"}
                if members != want:
                    raise AssertionError(f"shard {sid} members {members}, want {want}")
                for name in "ABC":
                    if endpoints[cls.addr[name]] != cls.hosts[name].shard_endpoint:
                        raise AssertionError(f"shard {sid}: {name} advertises "
                                             f"{endpoints[cls.addr[name]]}")
                say(f"shard {sid} RUNNING with A, B, C; reservations {endpoints}")
            for name in "ABC":
                h = cls.hosts[name]
                harness.wait_for(lambda: all(r["reserved"] for r in h.shards()["shards"]
                                             if r["shard_id"] in (cls.sid, cls.small_sid)) and
                                 len(h.shards()["shards"]) >= 2, 30,
                                 f"{name} to record its reservations")
            cls.sentinel = os.path.join(net.root, "sentinel")
            os.makedirs(os.path.join(cls.sentinel, "empty-target"))
            harness.write_random_files(cls.sentinel, {"secret.txt": 4096,
                                                      "nested/keep.bin": 1000})
            cls.sentinel_before = snapshot(cls.sentinel)
            cls.art = {}
        except BaseException:
            cls._teardown()
            raise

    @classmethod
    def _teardown(cls):
        try:
            cls.net.cleanup()
        finally:
            cls.topo.destroy()
            left = netns.wait_gone()
            if left:
                raise AssertionError(f"namespaces or links left behind: {left}")
            say("namespaces, links and processes removed")

    @classmethod
    def tearDownClass(cls):
        cls._teardown()

    # -- helpers -------------------------------------------------------------------------------
    def a(self, host, command, *args, **kw):
        shard = str(kw.pop("shard", self.sid))
        return self.net.artifact(self.hosts[host], command, "--shard", shard, *args, **kw)

    def refused(self, host, command, *args, want=(), codes=(1, 2), **kw):
        """Runs a command that must fail with one of `codes`; stderr must contain each of
        `want` (a tuple: one of its strings). Returns stderr."""
        r = self.a(host, command, *args, check=False, **kw)
        err = r.stderr.strip()
        self.assertIn(r.returncode, codes, f"{command} {args}: exit {r.returncode}, stdout "
                                           f"{r.stdout[:500]!r}, stderr {err[:1000]!r}")
        for w in want:
            alternatives = w if isinstance(w, tuple) else (w,)
            self.assertTrue(any(x in err for x in alternatives),
                            f"{command} {args}: error does not say {w!r}: {err!r}")
        say(f"    refused (exit {r.returncode}): {err.splitlines()[-1] if err else ''}"[:300])
        return err

    def assert_sentinel(self):
        self.assertEqual(snapshot(self.sentinel), self.sentinel_before,
                         "the sentinel directory outside the stores changed")

    def publish(self, host, src, *args, shard=None):
        out = self.a(host, "publish", "--dir", src, *args,
                     **({"shard": shard} if shard else {}))
        self.assertTrue(out["done"], out)
        self.assertRegex(out["artifact_id"], r"^[0-9a-f]{64}$")
        return out

    def listed(self, host, all_=False, shard=None):
        args = ["--all"] if all_ else []
        out = self.a(host, "list", *args, **({"shard": shard} if shard else {}))
        return {x["artifact_id"]: x for x in out.get("artifacts", [])}

    def verify(self, host, shard=None, damaged=False):
        """The VerifyArtifactsResponse; `verify` exits 1 when chunks are modified or missing."""
        r = self.a(host, "verify", check=False, **({"shard": shard} if shard else {}))
        self.assertEqual(r.returncode, 1 if damaged else 0,
                         f"{host} verify exited {r.returncode}: {r.stderr.strip()} {r.stdout}")
        if damaged:
            self.assertIn("damaged", r.stderr)
        return json.loads(r.stdout)

    def assert_clean(self, host, shard=None):
        v = self.verify(host, shard)
        for key in ("modified", "missing", "incomplete"):
            self.assertEqual(v.get(key, []), [], f"{host} verify: {key}: {v}")
        return v

    def assert_chunks_hash_to_names(self, host, shard=None):
        """Every chunk file in the host's store is a regular file whose SHA-256 is its name."""
        files = self.hosts[host].chunk_files(shard or self.sid)
        for path in files:
            st = os.lstat(path)
            self.assertTrue(stat.S_ISREG(st.st_mode), f"{path} is not a regular file")
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            self.assertEqual(digest, os.path.basename(path), f"{host}: {path} is corrupt")
        return len(files)

    def stored(self, host, hashes, shard=None):
        names = {os.path.basename(p) for p in self.hosts[host].chunk_files(shard or self.sid)}
        return names & hashes

    def make_artifact(self, label, sizes):
        src = os.path.join(self.net.root, "src", label)
        files = harness.write_random_files(src, sizes)
        return src, files

    def out_dir(self, label):
        return os.path.join(self.net.root, "out", label)

    def kill_mid_fetch(self, host, art, peers, low=0.2, high=0.7):
        """Starts a fetch of `art` on `host` from `peers` and SIGKILLs the host's trainshardd
        once its store holds between low and high of the artifact's chunks. Returns the number
        of the artifact's chunks stored when it died."""
        total = len(art["chunks"])
        target = (low + high) / 2
        peer_args = [x for p in peers for x in ("--peer", self.addr[p])]
        proc = self.net.artifact_popen(self.hosts[host], "fetch", "--shard", str(self.sid),
                                       "--id", art["id"], *peer_args)
        start = time.monotonic()
        try:
            while True:
                have = len(self.stored(host, art["chunks"]))
                if have >= target * total:
                    break
                if proc.poll() is not None:
                    self.fail(f"fetch on {host} ended before the kill ({have}/{total} chunks): "
                              f"{proc.stderr.read()[:1000]}")
                if time.monotonic() - start > 60:
                    self.fail(f"fetch on {host} stuck at {have}/{total} chunks")
                time.sleep(0.01)
            self.hosts[host].process.kill()
            elapsed = time.monotonic() - start
        finally:
            try:
                proc.communicate(timeout=30)
            except harness.subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        stored = len(self.stored(host, art["chunks"]))
        say(f"SIGKILL {host}'s trainshardd {elapsed:.1f}s into the fetch: {stored}/{total} chunks "
            f"stored; its CLI exited {proc.returncode}")
        self.assertNotEqual(proc.returncode, 0, "the interrupted fetch reported success")
        self.assertGreaterEqual(stored, low * total, "killed too early")
        self.assertLessEqual(stored, high * total, "killed too late (link not slow enough?)")
        return stored

    def restart(self, host):
        h = self.hosts[host]
        h.process.stop()
        h.start()
        h.wait_shard_listen()

    # -- 1 -------------------------------------------------------------------------------------
    def test_1_publish_fetch_byte_identical(self):
        say("1. publish on A, fetch on B across namespaces, byte-identical")
        sizes = {
            "empty": 0,
            "one-byte": 1,
            "meta.json": 517,
            "model/weights.bin": 16 * MIB + 123,
            "model/optimizer/state-00.bin": 4 * MIB,
            "data/shard-0001.bin": 3 * MIB + 7,
            "data/deep/a/b/c/d/e/f/tiny.txt": 100,
            "x_y.z+=@,-": 10,
        }
        src, files = self.make_artifact("one", sizes)
        os.makedirs(os.path.join(src, "empty-dir"))
        chunks = harness.chunk_hashes(files, MIB)
        out = self.publish("A", src, "--round", "1", "--kind", "checkpoint",
                           "--chunk-size", str(MIB))
        art = {"id": out["artifact_id"], "src": src, "files": files, "chunks": chunks,
               "size": sum(sizes.values())}
        self.art["one"] = art
        say(f"published {art['id'][:16]}.. on A: {len(files)} files, {art['size']} bytes, "
            f"{len(chunks)} chunks")
        self.assertEqual(n(out["bytes_total"]), art["size"])
        self.assertEqual(self.stored("A", chunks), chunks, "A does not store every chunk")
        summary = self.listed("A")[art["id"]]
        self.assertTrue(summary["complete"])
        self.assertEqual(n(summary["total_bytes"]), art["size"])
        self.assertEqual(summary["publisher"], self.addr["A"])

        dest = self.out_dir("one-B")
        t0 = time.monotonic()
        res = self.a("B", "fetch", "--id", art["id"], "--peer", self.addr["A"], "--out", dest)
        say(f"fetched on B in {time.monotonic() - t0:.2f}s: chunks_fetched "
            f"{res['chunks_fetched']}, present {res['chunks_present']}, bytes_by_peer "
            f"{res.get('bytes_by_peer')}")
        self.assertTrue(res["done"])
        self.assertEqual(res["artifact_id"], art["id"])
        self.assertEqual(n(res["chunks_fetched"]), len(chunks))
        self.assertEqual(n(res["chunks_present"]), 0)
        self.assertGreaterEqual(n(res["bytes_by_peer"][self.addr["A"]]), art["size"])
        self.assertEqual(res.get("peer_faults", []), [])
        self.assertEqual(harness.tree_sha256(dest), harness.tree_sha256(src))
        expected = {name: (len(d), hashlib.sha256(d).hexdigest())
                    for name, d in files.items()}
        self.assertEqual(harness.tree_sha256(dest), expected)
        say(f"B's --out tree equals A's source, file by file (SHA-256 here): {len(expected)} files")
        self.assertEqual(self.stored("B", chunks), chunks)
        self.assertTrue(self.listed("B")[art["id"]]["complete"])
        self.assert_clean("A")
        self.assert_clean("B")
        self.assert_chunks_hash_to_names("B")
        # Fetching what is held transfers nothing.
        again = self.a("B", "fetch", "--id", art["id"], "--peer", self.addr["A"])
        self.assertEqual(n(again["chunks_fetched"]), 0)
        self.assertEqual(n(again["chunks_present"]), len(chunks))
        say("a second fetch on B transfers nothing; A and B verify clean")

    # -- 2 -------------------------------------------------------------------------------------
    def test_2_sigkill_mid_fetch_resumes(self):
        say(f"2. fetch across a {SHAPED_MBIT} Mbit/s tbf link, SIGKILL the fetching sidecar, "
            "restart, resume")
        sizes = {f"part-{i:02d}.bin": 3 * MIB + 1000 * i for i in range(10)}
        sizes["tail.bin"] = 200 * KIB
        src, files = self.make_artifact("two", sizes)
        chunks = harness.chunk_hashes(files, SMALL_CHUNK)
        parent = ["--parent", self.art["one"]["id"]] if "one" in self.art else []
        out = self.publish("A", src, "--round", "2", "--chunk-size", str(SMALL_CHUNK), *parent)
        art = {"id": out["artifact_id"], "src": src, "files": files, "chunks": chunks,
               "size": sum(sizes.values())}
        self.art["two"] = art
        total = len(chunks)
        say(f"published {art['id'][:16]}.. on A: {art['size']} bytes in {total} chunks of "
            f"{SMALL_CHUNK}")
        self.topo.shape("A", SHAPED_MBIT)
        try:
            present = self.kill_mid_fetch("B", art, ["A"])
            # Nothing but whole, verified chunks is in B's store.
            self.assert_chunks_hash_to_names("B")
            self.restart("B")
            say("B restarted")
            # Acceptance 5: an interrupted fetch is never listed as complete.
            self.assertNotIn(art["id"], self.listed("B"))
            row = self.listed("B", all_=True)[art["id"]]
            self.assertFalse(row["complete"], row)
            self.assertIn(art["id"], self.verify("B").get("incomplete", []))
            say("the interrupted fetch is listed only with --all, complete = false; verify "
                "names it incomplete")
            self.assertEqual(len(self.stored("B", chunks)), present,
                             "restarting B changed its stored chunks")
            dest = self.out_dir("two-B")
            t0 = time.monotonic()
            res = self.a("B", "fetch", "--id", art["id"], "--peer", self.addr["A"], "--out",
                         dest)
            say(f"resumed in {time.monotonic() - t0:.1f}s: chunks_present "
                f"{res['chunks_present']} (stored before the kill: {present}), chunks_fetched "
                f"{res['chunks_fetched']} of {res['chunks_total']}")
        finally:
            self.topo.unshape("A")
        self.assertEqual(n(res["chunks_total"]), total)
        self.assertEqual(n(res["chunks_present"]), present)
        self.assertEqual(n(res["chunks_fetched"]), total - present)
        self.assertEqual(harness.tree_sha256(dest), harness.tree_sha256(src))
        self.assertTrue(self.listed("B")[art["id"]]["complete"])
        self.assert_clean("B")
        say("only the chunks not stored before the kill were fetched again; output "
            "byte-identical; B verifies clean")

    # -- 3 -------------------------------------------------------------------------------------
    def test_3_corrupt_peer_reported(self):
        say("3. A's chunks tampered with: C fetches from A and B")
        # Artifact two: 130 chunks, more than the streams of both peers claim at once, so A is
        # certainly asked for some.
        art = self.art["two"]
        backup = os.path.join(self.net.root, "backup-A")
        os.makedirs(backup)
        tampered = set()
        for path in self.hosts["A"].chunk_files(self.sid):
            name = os.path.basename(path)
            if name not in art["chunks"]:
                continue
            shutil.copy2(path, os.path.join(backup, name))
            size = os.path.getsize(path)
            with open(path, "r+b") as f:
                f.seek(size // 2)
                b = f.read(1)
                f.seek(size // 2)
                f.write(bytes([b[0] ^ 0xFF]))
            self.assertEqual(os.path.getsize(path), size)
            tampered.add(name)
        self.assertEqual(tampered, art["chunks"])
        say(f"flipped one byte in each of A's {len(tampered)} chunk files of "
            f"{art['id'][:16]}.. (sizes unchanged)")
        try:
            va = self.verify("A", damaged=True)
            self.assertEqual(set(va.get("modified", [])), tampered, va)
            say("A's own verify reports every tampered chunk as modified")
            dest = self.out_dir("two-C")
            res = self.a("C", "fetch", "--id", art["id"], "--peer", self.addr["A"], "--peer",
                         self.addr["B"], "--out", dest)
            faults = res.get("peer_faults", [])
            say(f"C's fetch succeeded; peer_faults {faults}; bytes_by_peer "
                f"{res.get('bytes_by_peer')}")
            bad = [f for f in faults if f["peer"] == self.addr["A"]]
            self.assertTrue(bad and all(f["corrupt"] for f in bad), faults)
            self.assertNotIn(self.addr["B"], [f["peer"] for f in faults])
            self.assertEqual(harness.tree_sha256(dest), harness.tree_sha256(art["src"]))
            self.assert_clean("C")
            self.assert_chunks_hash_to_names("C")
            self.assertEqual(self.stored("C", art["chunks"]), art["chunks"])
            say("A reported corrupt, C's output byte-identical, C verifies clean, every chunk "
                "file on C hashes to its name")
        finally:
            for name in tampered:
                shutil.copy2(os.path.join(backup, name),
                             os.path.join(self.hosts["A"].store_dir(self.sid), "chunks", name[:2],
                                          name))
        self.assert_clean("A")
        say("A's chunks restored, A verifies clean")
        gc = self.a("C", "gc", "--drop", art["id"])
        self.assertEqual((n(gc["artifacts_dropped"]), n(gc["chunks_removed"])),
                         (1, len(art["chunks"])), gc)
        self.assertEqual(self.stored("C", art["chunks"]), set())
        self.assertNotIn(art["id"], self.listed("C", all_=True))
        say(f"gc --drop on C: {gc}; its chunks are gone")

    # -- 4 -------------------------------------------------------------------------------------
    def test_4_attacks_refused(self):
        say("4. attacks through the CLI")
        root = os.path.join(self.net.root, "attacks")
        a_files_before = len(self.hosts["A"].chunk_files(self.sid))
        listed_before = set(self.listed("A", all_=True))
        secret = os.path.join(self.sentinel, "secret.txt")

        def bad_dir(label, make, want):
            d = os.path.join(root, label)
            os.makedirs(d)
            harness.write_random_files(d, {"ok.bin": 3000})
            make(d)
            say(f"  publish of a directory with {label}")
            err = self.refused("A", "publish", "--dir", d, want=want, timeout=30)
            self.assertEqual(set(self.listed("A", all_=True)), listed_before)
            self.assertEqual(len(self.hosts["A"].chunk_files(self.sid)), a_files_before,
                             "a refused publish wrote chunks")
            self.assert_sentinel()
            return err

        bad_dir("a symlink to a file outside", lambda d: os.symlink(secret, f"{d}/link"),
                ["link"])
        bad_dir("a symlink to a directory outside",
                lambda d: os.symlink(self.sentinel, f"{d}/linkdir"), ["linkdir"])
        # A hard link to a file outside (not in the sentinel: it would change its link count).
        outside = os.path.join(root, "outside.txt")
        os.makedirs(root, exist_ok=True)
        with open(outside, "wb") as f:
            f.write(b"outside the published directory\n")
        bad_dir("a hardlink to a file outside", lambda d: os.link(outside, f"{d}/hard"), ["hard"])
        bad_dir("two names for one file", lambda d: os.link(f"{d}/ok.bin", f"{d}/twin"),
                [("twin", "ok.bin")])
        bad_dir("a FIFO", lambda d: os.mkfifo(f"{d}/pipe"), ["pipe"])
        bad_dir("a character device",
                lambda d: os.mknod(f"{d}/null", 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
                ["null"])
        bad_dir("a block device",
                lambda d: os.mknod(f"{d}/blk", 0o600 | stat.S_IFBLK, os.makedev(7, 0)),
                ["blk"])

        def make_socket(d):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(f"{d}/sock")
            s.close()
        bad_dir("a socket", make_socket, ["sock"])
        for label, name, piece in [("a backslash name", "back\\slash", "slash"),
                                   ("an encoded separator", "enc%2Fsep", "enc"),
                                   ("encoded dots", "%2e%2e", "2e"),
                                   ("a space", "sp ace", "ace"),
                                   ("a newline", "new\nline", "line"),
                                   ("non-ASCII", "caf\u00e9", "caf"),
                                   # A filesystem has no component named ".."; these are the
                                   # '..' pieces it does allow.
                                   ("'..' with backslashes", "up/..\\..\\escape", "escape"),
                                   ("'..' encoded", "up/..%2F..%2Fescape", "escape")]:
            def make(d, name=name):
                path = os.path.join(d, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(b"x")
            bad_dir(label, make, [piece])
        self.refused("A", "publish", "--dir", "relative/dir")

        # --out attacks on B (which holds artifact one).
        art = self.art["one"]
        link_out = os.path.join(root, "out-link")
        os.symlink(os.path.join(self.sentinel, "empty-target"), link_out)
        say("  fetch --out through a symlink to a directory outside")
        self.refused("B", "fetch", "--id", art["id"], "--peer", self.addr["A"], "--out",
                     link_out)
        self.assert_sentinel()
        say("  fetch --out into a non-empty directory")
        self.refused("B", "fetch", "--id", art["id"], "--peer", self.addr["A"], "--out",
                     self.sentinel)
        self.assert_sentinel()

        # Quota: the small shard allows 1 MiB and 8 chunk files.
        q = self.small_sid
        big_src, _ = self.make_artifact("quota-bytes", {"big.bin": 2 * MIB})
        say("  publish over the byte quota")
        self.refused("A", "publish", "--dir", big_src, shard=q, want=["quota"])
        self.assertEqual(self.hosts["A"].chunk_files(q), [])
        many_src, _ = self.make_artifact("quota-files", {f"f{i}": 100 for i in range(10)})
        say("  publish over the file quota")
        self.refused("A", "publish", "--dir", many_src, "--chunk-size", str(4 * KIB), shard=q,
                     want=["quota"])
        self.assertEqual(self.hosts["A"].chunk_files(q), [])
        qa_src, _ = self.make_artifact("quota-a", {"a.bin": 600 * KIB})
        qa = self.publish("A", qa_src, shard=q)["artifact_id"]
        qb_src, _ = self.make_artifact("quota-b", {"b.bin": 600 * KIB})
        self.publish("B", qb_src, shard=q)
        b_files = sorted(self.hosts["B"].chunk_files(q))
        say("  fetch over the byte quota (B holds 600 KiB of 1 MiB, A's artifact is 600 KiB)")
        self.refused("B", "fetch", "--id", qa, "--peer", self.addr["A"], shard=q,
                     want=["quota"])
        self.assertEqual(sorted(self.hosts["B"].chunk_files(q)), b_files)
        self.assertNotIn(qa, self.listed("B", all_=True, shard=q))
        self.assert_sentinel()

        # A host that is not a member of the shard.
        say("  fetch by D, not a member of the shard")
        self.refused("D", "fetch", "--id", art["id"], "--peer", self.addr["A"],
                     want=["member"])
        self.assertEqual(self.hosts["D"].chunk_files(self.sid), [])
        say("  publish by D")
        d_src, _ = self.make_artifact("by-d", {"d.bin": 1000})
        self.refused("D", "publish", "--dir", d_src, want=["member"])
        say("  B asks D (not a member) for an artifact")
        self.refused("B", "fetch", "--id", "ab" * 32, "--peer", self.addr["D"],
                     codes=(1, 2, 3))
        self.assert_sentinel()

        self._planted_chunk_symlink(art)
        three = self._publish_three()
        self._planted_export_symlink(three)
        self._planted_dir_symlink_read(self.art["two"])
        self._planted_dir_symlink_write(three)
        self.assert_sentinel()

    def _plant_chunk_link(self, host, chunk, label):
        """Moves a chunk file out of the host's store and puts a symlink to it in its place (the
        target holds the chunk's exact bytes, so following the link would go unnoticed by
        hashing). Returns (chunk path, outside path)."""
        path = os.path.join(self.hosts[host].store_dir(self.sid), "chunks", chunk[:2], chunk)
        outside = os.path.join(self.net.root, "planted", label, chunk)
        os.makedirs(os.path.dirname(outside))
        os.rename(path, outside)
        os.symlink(outside, path)
        return path, outside

    def _unplant_chunk_link(self, path, outside):
        if os.path.islink(path):
            os.unlink(path)
        if not os.path.exists(path):
            os.rename(outside, path)

    def _planted_chunk_symlink(self, art):
        say("  a chunk file on A replaced by a symlink to a copy outside the store")
        victim = sorted(art["chunks"])[0]
        path, outside = self._plant_chunk_link("A", victim, "chunk-link")
        before = snapshot(os.path.dirname(outside))
        try:
            v = self.verify("A", damaged=True)
            reported = set(v.get("modified", [])) | set(v.get("missing", []))
            self.assertIn(victim, reported, v)
            say(f"    A's verify reports it: modified {v.get('modified')}, missing "
                f"{v.get('missing')}")
            # C fetches the artifact from A alone: A must not serve the link's target.
            self.assertEqual(self.stored("C", art["chunks"]), set())
            err = self.refused("C", "fetch", "--id", art["id"], "--peer", self.addr["A"],
                               codes=(1, 3))
            self.assertIn(self.addr["A"], err)
            self.assertNotIn(victim, self.stored("C", art["chunks"]))
            say(f"    C's fetch from A alone fails without that chunk "
                f"({len(self.stored('C', art['chunks']))}/{len(art['chunks'])} others stored)")
            res = self.a("C", "fetch", "--id", art["id"], "--peer", self.addr["A"], "--peer",
                         self.addr["B"], "--out", self.out_dir("one-C-again"))
            self.assertEqual(harness.tree_sha256(self.out_dir("one-C-again")),
                             harness.tree_sha256(art["src"]))
            say(f"    with B as well C completes (present {res['chunks_present']}, fetched "
                f"{res['chunks_fetched']}), byte-identical")
            # A fetching its own artifact may repair it from the other members: the link is
            # then replaced by a verified chunk file, never written through.
            dest = self.out_dir("A-export")
            r = self.a("A", "fetch", "--id", art["id"], "--out", dest, check=False)
            if r.returncode == 0:
                res = json.loads(r.stdout)
                self.assertEqual(n(res["chunks_fetched"]), 1, res)
                self.assertEqual(n(res["chunks_present"]), len(art["chunks"]) - 1, res)
                st = os.lstat(path)
                self.assertTrue(stat.S_ISREG(st.st_mode), "the planted link is still there")
                self.assertEqual(harness.tree_sha256(dest), harness.tree_sha256(art["src"]))
                say("    A's fetch --out re-fetched that one chunk from a peer, replacing the "
                    "link with a verified file; export byte-identical")
            else:
                say(f"    A's fetch --out refused (exit {r.returncode}): {r.stderr.strip()}")
                self.assertIn(r.returncode, (1, 3))
            self.assertEqual(snapshot(os.path.dirname(outside)), before,
                             "the symlink's target outside the store changed")
        finally:
            self._unplant_chunk_link(path, outside)
        self.assert_clean("A")

    def _publish_three(self):
        src, files = self.make_artifact("three", {"three.bin": 4 * SMALL_CHUNK + 5})
        out = self.publish("A", src, "--chunk-size", str(SMALL_CHUNK))
        art = {"id": out["artifact_id"], "src": src, "files": files,
               "chunks": harness.chunk_hashes(files, SMALL_CHUNK)}
        self.art["three"] = art
        return art

    def _planted_export_symlink(self, art):
        say("  export on A through a planted chunk symlink, no other host holding the artifact")
        victim = sorted(art["chunks"])[0]
        path, outside = self._plant_chunk_link("A", victim, "export-link")
        before = snapshot(os.path.dirname(outside))
        dest = self.out_dir("A-export-three")
        try:
            self.refused("A", "fetch", "--id", art["id"], "--out", dest, codes=(1, 3))
            say("    refused: the link was not followed (its target has the right bytes)")
            if os.path.exists(dest):
                self.assertEqual(harness.tree_sha256(dest), {},
                                 f"a refused export left files in {dest}")
            self.assertEqual(snapshot(os.path.dirname(outside)), before)
            self.assertTrue(os.path.islink(path))
            # The failed fetch leaves A's row incomplete (a chunk is not in the store), so A
            # no longer lists or serves it as complete.
            self.assertFalse(self.listed("A", all_=True)[art["id"]]["complete"])
            self.assertNotIn(art["id"], self.listed("A"))
            say("    A now lists the artifact as incomplete (only with --all)")
        finally:
            self._unplant_chunk_link(path, outside)
        self._recomplete("A", art)

    def _recomplete(self, host, art):
        """After a failed fetch demoted the host's row: with the chunks back in place, a fetch
        completes it without transferring anything."""
        res = self.a(host, "fetch", "--id", art["id"], "--peer", self.addr["C"])
        self.assertEqual((n(res["chunks_present"]), n(res["chunks_fetched"])),
                         (len(art["chunks"]), 0), res)
        self.assertTrue(self.listed(host)[art["id"]]["complete"])
        say(f"    with the chunks back, a fetch on {host} completes it without transferring")
        self.assert_clean(host)

    def _planted_dir_symlink_read(self, art):
        say("  a chunks/<xx> directory on B replaced by a symlink to a directory outside")
        victim = sorted(art["chunks"])[-1]
        store = self.hosts["B"].store_dir(self.sid)
        sub = os.path.join(store, "chunks", victim[:2])
        outside = os.path.join(self.net.root, "planted", "dir-copy")
        os.rename(sub, outside)  # the outside directory holds the exact chunks
        os.symlink(outside, sub)
        before = snapshot(outside)
        try:
            v = self.verify("B", damaged=True)
            reported = set(v.get("modified", [])) | set(v.get("missing", []))
            self.assertIn(victim, reported, v)
            say(f"    B's verify reports {victim[:12]}..: modified {v.get('modified')}, "
                f"missing {v.get('missing')}")
            # C does not hold this artifact, so B cannot repair it: the export must fail.
            self.refused("B", "fetch", "--id", art["id"], "--peer", self.addr["C"], "--out",
                         self.out_dir("B-export"), codes=(1, 3))
            say("    B's export through it is refused")
            self.assertEqual(snapshot(outside), before)
            self.assertNotIn(art["id"], self.listed("B"))
        finally:
            if os.path.islink(sub):
                os.unlink(sub)
            if os.path.exists(sub):
                shutil.rmtree(sub)
            os.rename(outside, sub)
        self._recomplete("B", art)

    def _planted_dir_symlink_write(self, art):
        say("  a fetch on B whose chunk lands in a chunks/<xx> symlinked outside")
        target = sorted(art["chunks"])[0]
        store = self.hosts["B"].store_dir(self.sid)
        sub = os.path.join(store, "chunks", target[:2])
        outside = os.path.join(self.net.root, "planted", "write-target")
        moved = os.path.isdir(sub)
        if moved:
            os.rename(sub, outside)
        else:
            os.makedirs(outside)
        os.symlink(outside, sub)
        before = snapshot(outside)
        try:
            r = self.a("B", "fetch", "--id", art["id"], "--peer", self.addr["A"], check=False)
            say(f"    B's fetch exited {r.returncode}: {r.stderr.strip()[-300:]}")
            self.assertEqual(snapshot(outside), before,
                             "a chunk was written through a symlink planted in the store")
            if r.returncode == 0:
                st = os.lstat(sub)
                self.assertTrue(stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode))
        finally:
            if os.path.islink(sub):
                os.unlink(sub)
                if moved:
                    os.rename(outside, sub)
            elif moved:
                # The store replaced the link by a directory: put the moved chunks back in it.
                for name in os.listdir(outside):
                    os.rename(os.path.join(outside, name), os.path.join(sub, name))
        say("    nothing was written through it")
        res = self.a("B", "fetch", "--id", art["id"], "--peer", self.addr["A"])
        self.assertTrue(res["done"])
        self.assertEqual(self.stored("B", art["chunks"]), art["chunks"])
        self.assert_clean("B")

    # -- 5 -------------------------------------------------------------------------------------
    def test_5_restart_durable_state(self):
        say("5. restarts")
        before = {h: self.listed(h) for h in ("A", "B")}
        for h in ("A", "B"):
            self.restart(h)
        say("A and B restarted (SIGTERM, start)")
        for h in ("A", "B"):
            after = self.listed(h)
            self.assertEqual(after, before[h], f"{h}'s artifacts changed across the restart")
            for key in ("one", "two"):
                self.assertTrue(after[self.art[key]["id"]]["complete"])
            v = self.assert_clean(h)
            say(f"{h} lists {len(after)} complete artifacts as before; verify clean "
                f"({v.get('chunks_ok')} chunks ok)")
        self.assert_chunks_hash_to_names("A")
        self.assert_chunks_hash_to_names("B")

        art = self.art["two"]
        self.topo.shape("A", SHAPED_MBIT)
        try:
            present = self.kill_mid_fetch("C", art, ["A"], low=0.1, high=0.7)
        finally:
            self.topo.unshape("A")
        self.restart("C")
        self.assertNotIn(art["id"], self.listed("C"))
        self.assertFalse(self.listed("C", all_=True)[art["id"]]["complete"])
        say("C's interrupted fetch: listed only with --all, incomplete")
        gc = self.a("C", "gc", "--drop-incomplete")
        say(f"gc --drop-incomplete on C: {gc}")
        self.assertEqual(n(gc["artifacts_dropped"]), 1)
        self.assertEqual(n(gc["chunks_removed"]), present)
        self.assertNotIn(art["id"], self.listed("C", all_=True))
        self.assertEqual(self.stored("C", art["chunks"]), set())
        self.assertTrue(self.listed("C")[self.art["one"]["id"]]["complete"])
        self.assert_clean("C")
        say("dropped with its chunks; C's other artifacts untouched and clean")
        self.assert_sentinel()


if __name__ == "__main__":
    unittest.main(verbosity=2)
