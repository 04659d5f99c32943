"""Collective benchmark (issue 4): ts_collective_node processes, one per network namespace on
one bridge, links limited with tbf, real keys and the real handshake. Prints its figures and a
final JSON line; exits non-zero only when it cannot run (a step failed), never because a target
is missed.

  fp32       allreduce (mean) of --size-mib of fp32 on every host, each host's egress limited to
             --rate-mbit: time / the bandwidth-optimal bound 2(k-1)/k * N / R (target <= 1.15);
             also against one raw TCP stream through the same shaped link, same run
  int8       the same with the int8 codec (block 4096): time / the bound for the encoded size
             N/4 + 4 bytes per block (target <= 1.15)
  topk       top-k 64 of 4096 at 2 bits: bytes per contribution on the wire / fp32 size (target:
             >= 100x smaller), and its time
  lossless   the fp32 allreduce with the fp32-zstd codec (fp32's bits, the high bytes entropy-
             coded): time / the fp32 bound, bytes on the wire / fp32's, and the result checked
             bit-identical to the fp32 figure's
  gloo       Gloo's ring allreduce, same hosts, same links, same buffer: our time / Gloo's, for
             fp32 and for fp32-zstd (target <= 1.0)
  unlimited  fp32 and Gloo over unshaped veths (in-kernel, like loopback): our time / Gloo's
             (target <= 1.3)
  loopback   the same with every member in the bench's namespace on 127.0.0.1 (target <= 1.3)
  tls        fp32 in the clear and over TLS 1.3 (each member's certificate pinned, as under a
             host's peer_tls), side by side on the limited links and on loopback: TLS time /
             plaintext time (target <= 1.03 on the limited links), the results bit-identical,
             and the members' extra CPU seconds per GiB sent (each GiB sealed once, opened once)
  death      a member SIGKILLed, then (another run) SIGSTOPped, mid-operation on the limited
             links: the time from the signal to the survivors' failure (max over survivors) /
             the heartbeat interval (target <= 2)

An operation's time runs from the last member's entry to the last member's exit (each member
reports both instants; all run on this machine, so on one clock): the collective cannot start
before every member has entered, and a member that finished the previous operation early waits
in the next one. The first operation starts at one agreed instant. The ratios use the best of
--iterations operations, the median is printed too, and so is the slowest member's own timer. Any failed operation fails the bench (a
mesh's close waits until its last frames are acknowledged, so a member that finishes first and
exits does not cut its neighbour's last operation short). Run as root:

  TS_BUILD_DIR=build /usr/bin/python3 tests/bench/collective_bench.py [--size-mib 64]
      [--rate-mbit 100] [--hosts 4] [--iterations 5] [--heartbeat-ms 500] [--only FIGURE]
"""

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "functional"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import netns  # noqa: E402
from artifact_bench import raw_tcp  # noqa: E402

NODE = os.path.join(harness.BUILD_DIR, "sidecar", "collective", "ts_collective_node")
MIB = 1 << 20
FIGURES = ["fp32", "lossless", "int8", "topk", "gloo", "unlimited", "loopback", "tls", "death"]
GIB = 1 << 30
# Codec settings of the int8 and top-k figures (the codec's defaults).
BLOCK = 4096
TOPK = 64
VALUE_BITS = 2


def say(msg):
    print(msg, flush=True)


def read_reports(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(MIB)
            if not block:
                return h.hexdigest()
            h.update(block)


def encoded_size(codec, elements, block=BLOCK, topk=TOPK, value_bits=VALUE_BITS):
    """Bytes of one contribution of `elements` fp32 values under `codec` (codec.h layouts)."""
    if codec == "fp32":
        return 4 * elements
    if codec in ("fp16", "bf16"):
        return 2 * elements
    blocks = [block] * (elements // block) + ([elements % block] if elements % block else [])
    if codec == "int8":
        return sum(4 + b for b in blocks)
    if codec == "topk":
        index_bits = max(1, (block - 1).bit_length())
        total = 0
        for b in blocks:
            k = min(topk, b)
            total += 4 + (k * index_bits + 7) // 8 + (k * value_bits + 7) // 8
        return total
    raise ValueError(f"codec {codec}")


class Run:
    """One group operation: every member's report lines, its log and output paths."""

    def __init__(self, name, reports, logs, outputs, procs, start_ms):
        self.name = name
        self.reports = reports
        self.logs = logs
        self.outputs = outputs
        self.procs = procs
        self.start_ms = start_ms

    def lines(self, i):
        return read_reports(self.reports[i])

    def log_tail(self, i, n=20):
        try:
            with open(self.logs[i], errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


class Bench:
    def __init__(self, args):
        self.args = args
        self.n = args.hosts
        self.elements = args.size_mib * MIB // 4
        self.size = self.elements * 4
        self.rate = args.rate_mbit * 1e6 / 8  # bytes/s of the tbf
        self.results = {}
        self.runs = 0
        self.port = 21000
        self.topo = None
        self.root = None
        self.loopback = False  # members in this namespace on 127.0.0.1 (the loopback figure)

    # -- set-up --------------------------------------------------------------------------------
    def setup(self):
        self.names = [f"h{i}" for i in range(self.n)]
        self.topo = netns.Topology(self.names).create()
        self.root = tempfile.mkdtemp(prefix="ts-collective-bench-")
        net = harness.Network(root=self.root)
        self.keys = [net.new_key(f"member{i}") for i in range(self.n)]
        # Each member's TLS identity (what a host makes at its first start) and its fingerprint.
        self.tls_dirs, self.tls_sha256 = [], []
        for i in range(self.n):
            d = os.path.join(self.root, f"tls-{i}")
            os.makedirs(d)
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                            os.path.join(d, "tls.key"), "-out", os.path.join(d, "tls.crt"),
                            "-days", "30", "-subj", f"/CN=member{i}"],
                           check=True, capture_output=True)
            der = subprocess.run(["openssl", "x509", "-in", os.path.join(d, "tls.crt"),
                                  "-outform", "DER"], check=True, capture_output=True).stdout
            self.tls_dirs.append(d)
            self.tls_sha256.append(hashlib.sha256(der).hexdigest())
        say(f"hosts {', '.join(f'{n} {self.topo.ip[n]}' for n in self.names)} on bridge "
            f"{self.topo.bridge}; work dir {self.root}")

    def shape_all(self):
        for name in self.names:
            self.topo.shape(name, self.args.rate_mbit, self.args.burst, self.args.latency)

    def unshape_all(self):
        for name in self.names:
            self.topo.unshape(name)

    def bound(self, contribution_bytes):
        """Seconds of the bandwidth-optimal ring: 2(k-1)/k of a contribution through R."""
        return 2 * (self.n - 1) / self.n * contribution_bytes / self.rate

    # -- running a group -----------------------------------------------------------------------
    def start_group(self, name, engine, extra, iterations, output=False, members=None,
                    tls=False):
        """Starts every member (over TLS with `tls`); returns a Run (wait with finish())."""
        members = list(range(self.n)) if members is None else members
        self.runs += 1
        tag = f"{self.runs:02d}-{name}"
        work = os.path.join(self.root, tag)
        os.makedirs(work)
        self.port += 1  # fresh listeners each run: no TIME_WAIT or stale peers in the way
        if self.loopback:
            self.port += len(members)
            endpoints = {i: f"127.0.0.1:{self.port - pos}" for pos, i in enumerate(members)}
        else:
            endpoints = {i: f"{self.topo.ip[self.names[i]]}:{self.port}" for i in members}
        group = os.path.join(work, "group.txt")
        with open(group, "w") as f:
            for i in members:
                pin = f" {self.tls_sha256[i]}" if tls else ""
                f.write(f"{self.keys[i]['address']} {endpoints[i]}{pin}\n")
        deadline_ms = int(max(60, 6 * self.bound(self.size)) * 1000)
        # Connecting takes well under a second; every member starts its first operation at this
        # instant, so each member's own timer measures the same operation.
        start_ms = int(time.time() * 1000) + 3000
        reports, logs, outputs, procs = [], [], [], []
        for pos, i in enumerate(members):
            rep = os.path.join(work, f"report-{i}.jsonl")
            log = os.path.join(work, f"log-{i}.txt")
            out = os.path.join(work, f"out-{i}.f32") if output else None
            cmd = [NODE, "--engine", engine, "--index", str(pos), "--elements",
                   str(self.elements), "--seed", "7", "--reduce", "mean", "--iterations",
                   str(iterations), "--deadline-ms", str(deadline_ms), "--start-at-unix-ms",
                   str(start_ms), "--report", rep]
            if engine == "ts":
                cmd += ["--group", group, "--key-file", self.keys[i]["file"], "--listen",
                        endpoints[i], "--heartbeat-ms", str(self.args.heartbeat_ms)]
                if self.args.chunk_elements:
                    cmd += ["--chunk-elements", str(self.args.chunk_elements)]
                if tls:
                    cmd += ["--tls-dir", self.tls_dirs[i]]
            else:
                cmd += ["--size", str(len(members)), "--store-dir", os.path.join(work, "store"),
                        "--bind-ip", endpoints[i].rsplit(":", 1)[0]]
            if out:
                cmd += ["--output", out]
            cmd += extra
            with open(log, "w") as logf:
                prefix = [] if self.loopback else self.topo.prefix_args(self.names[i])
                procs.append(subprocess.Popen(prefix + cmd,
                                              stdout=logf, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))
            reports.append(rep)
            logs.append(log)
            outputs.append(out)
        return Run(tag, reports, logs, outputs, procs, start_ms)

    def finish(self, run, timeout_s, expect_ok=True):
        """Waits for every member; returns their exit codes."""
        deadline = time.monotonic() + timeout_s
        codes = []
        try:
            for p in run.procs:
                codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
        finally:
            for p in run.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if expect_ok:
            for i, code in enumerate(codes):
                if code != 0:
                    raise RuntimeError(f"{run.name}: member {i} exited {code}: "
                                       f"{run.lines(i)[-1:]} {run.log_tail(i)}")
        return codes

    def timed(self, name, engine, extra=(), output=False, tls=False):
        """Runs --iterations operations; returns (best, median, per-operation times, run)."""
        ops = self.args.iterations
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall0 = time.monotonic()
        run = self.start_group(name, engine, list(extra), ops, output=output, tls=tls)
        per_op = self.bound(self.size) if self.topo.shaped and not self.loopback else 10
        codes = self.finish(run, 60 + 4 * per_op * ops, expect_ok=False)
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # CPU of the whole processes (key, input, connect and output included), all members.
        run.cpu_s = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
        run.wall_s = time.monotonic() - wall0
        members = range(len(run.reports))
        ok = {(i, r["iteration"]): r for i in members for r in run.lines(i)
              if r.get("ok") and "iteration" in r}
        times, own = [], []
        for it in range(ops):
            bad = [i for i in members if (i, it) not in ok]
            if bad:
                raise RuntimeError(f"{run.name}: member {bad[0]} operation {it} failed (exit "
                                   f"{codes[bad[0]]}): {run.lines(bad[0])[-1:]} "
                                   f"{run.log_tail(bad[0])}")
            # From the last member's entry to the last member's exit: members finish an
            # operation at different instants and the early ones wait in the next, so a member's
            # own timer counts that wait too (the agreed start removes it from the first only).
            # All members run on this machine, so their wall clocks are one clock.
            rows = [ok[(i, it)] for i in members]
            times.append((max(r["ended_unix_ms"] for r in rows) -
                          max(r["started_unix_ms"] for r in rows)) / 1000)
            own.append(max(float(r["seconds"]) for r in rows))
        for i in members:
            if codes[i] != 0:
                raise RuntimeError(f"{run.name}: member {i} exited {codes[i]} {run.log_tail(i)}")
        run.ops = ops
        say(f"  {run.name}: {ops} operations, last entry to last exit "
            f"{', '.join(f'{t:.3f}' for t in times)}s (the slowest member's own timer "
            f"{', '.join(f'{t:.3f}' for t in own)}s); the members' processes used "
            f"{run.cpu_s:.1f} CPU-s in {run.wall_s:.1f}s ({os.cpu_count()} cores; load "
            f"{os.getloadavg()[0]:.1f})")
        run.ok_members = [i for i in members if codes[i] == 0]
        run.last_ok = {i: max((r for (j, _), r in ok.items() if j == i),
                              key=lambda r: r["iteration"]) for i in members}
        self.last_run = run
        return min(times), statistics.median(times), times, run

    def check_identical(self, run):
        """Every member that completed the last operation wrote the same result."""
        paths = [run.outputs[i] for i in run.ok_members]
        digests = {file_sha256(p) for p in paths}
        if len(digests) > 1:
            raise RuntimeError(f"{run.name}: {len(paths)} results, {len(digests)} digests")
        return len(paths)

    # -- figures -------------------------------------------------------------------------------
    def raw_tcp_figure(self):
        mib = max(16, min(64, self.args.size_mib // 2))
        tcp = raw_tcp(self.topo, self.names[0], self.names[1], mib)
        self.tcp = tcp
        say(f"raw TCP, one stream {self.names[0]} -> {self.names[1]} through the tbf: "
            f"{tcp * 8 / 1e6:.1f} Mbit/s = {tcp / self.rate:.3f} of the link ({mib} MiB)")
        self.results.update(raw_tcp_mbit_s=round(tcp * 8 / 1e6, 2),
                            raw_tcp_ratio_link=round(tcp / self.rate, 4))

    def fp32(self):
        best, median, times, run = self.timed("fp32", "ts", ["--codec", "fp32"], output=True)
        same = self.check_identical(run)
        self.ts_limited = best
        bound = self.bound(self.size)
        tcp_bound = bound * self.rate / self.tcp
        stats = run.last_ok[0]
        say(f"fp32 allreduce (mean), {self.args.size_mib} MiB, {self.n} hosts, tbf "
            f"{self.args.rate_mbit} Mbit/s: best {best:.2f}s, median {median:.2f}s of "
            f"{len(times)}; bound {bound:.2f}s; ratio {best / bound:.3f} (best; median "
            f"{median / bound:.3f}; target <= 1.15); {best / tcp_bound:.3f} of the bound at the "
            f"raw TCP rate; member 0 sent {stats['wire_bytes_sent']} bytes "
            f"({stats['wire_bytes_sent'] / (bound * self.rate):.4f} of the optimal amount); "
            f"results bit-identical on {same} of {self.n} members")
        self.fp32_wire_bytes = stats["wire_bytes_sent"]
        self.results.update(fp32_seconds=round(best, 3), fp32_median_seconds=round(median, 3),
                            fp32_bound_seconds=round(bound, 3),
                            fp32_ratio=round(best / bound, 4),
                            fp32_ratio_median=round(median / bound, 4),
                            fp32_ratio_tcp_bound=round(best / tcp_bound, 4))

    def lossless(self):
        """fp32-zstd: the same result as fp32, bit for bit, in fewer bytes."""
        best, median, times, run = self.timed("fp32-zstd", "ts", ["--codec", "fp32-zstd"],
                                              output=True)
        same = self.check_identical(run)
        fp32_out = getattr(self, "fp32_output", None)
        if fp32_out and file_sha256(fp32_out) != file_sha256(run.outputs[run.ok_members[0]]):
            raise RuntimeError("fp32-zstd: the result differs from the fp32 figure's")
        self.ts_lossless = best
        bound = self.bound(self.size)
        sent = run.last_ok[0]["wire_bytes_sent"]
        fp32_sent = self.fp32_wire_bytes
        say(f"fp32-zstd allreduce (mean): best {best:.2f}s, median {median:.2f}s; "
            f"{best / bound:.3f} of the fp32 bound (median {median / bound:.3f}); member 0 sent "
            f"{sent} bytes = {sent / fp32_sent:.4f} of fp32's {fp32_sent}; results bit-identical "
            f"on {same} of {self.n} members and to the fp32 figure's")
        self.results.update(lossless_seconds=round(best, 3),
                            lossless_median_seconds=round(median, 3),
                            lossless_ratio=round(best / bound, 4),
                            lossless_bytes_over_fp32=round(sent / fp32_sent, 4))

    def int8(self):
        best, median, times, run = self.timed("int8", "ts", ["--codec", "int8", "--block",
                                                             str(BLOCK)])
        encoded = encoded_size("int8", self.elements)
        bound = self.bound(encoded)
        stats = run.last_ok[0]
        say(f"int8 allreduce (block {BLOCK}): encoded {encoded} bytes ({self.size / encoded:.2f}x "
            f"smaller); best {best:.2f}s, median {median:.2f}s; bound for the encoded size "
            f"{bound:.2f}s; ratio {best / bound:.3f} (best; median {median / bound:.3f}; target "
            f"<= 1.15); member 0 sent {stats['payload_bytes_sent']} payload bytes "
            f"({stats['payload_bytes_sent'] / (bound * self.rate):.4f} of 2(k-1)/k x encoded)")
        self.results.update(int8_seconds=round(best, 3), int8_median_seconds=round(median, 3),
                            int8_bound_seconds=round(bound, 3),
                            int8_ratio=round(best / bound, 4),
                            int8_ratio_median=round(median / bound, 4))

    def topk(self):
        tx0 = {n: self.topo.tx_bytes(n) for n in self.names}
        best, median, times, run = self.timed(
            "topk", "ts", ["--codec", "topk", "--block", str(BLOCK), "--topk", str(TOPK),
                           "--value-bits", str(VALUE_BITS)])
        eth = max(self.topo.tx_bytes(n) - tx0[n] for n in self.names) / run.ops
        encoded = encoded_size("topk", self.elements)
        stats = [run.last_ok[i] for i in range(self.n)]
        wire = max(s["wire_bytes_sent"] for s in stats)
        # Top-k contributions are all-gathered: each member sends k-1 of them.
        per_contribution = wire / (self.n - 1)
        ratio = self.size / per_contribution
        fp32_wire = 2 * (self.n - 1) / self.n * self.size
        say(f"top-k {TOPK}/{BLOCK} at {VALUE_BITS} bits: encoded {encoded} bytes per "
            f"contribution ({self.size / encoded:.1f}x smaller than fp32); a member sent "
            f"{wire} bytes in frames = {per_contribution:.0f} per contribution: "
            f"{ratio:.1f}x smaller than fp32 (target >= 100x); {fp32_wire / wire:.1f}x less "
            f"than a member sends in the fp32 ring; Ethernet bytes per member and operation "
            f"{eth:.0f} ({fp32_wire / eth:.1f}x less than the fp32 ring's payload); time best "
            f"{best:.3f}s, median {median:.3f}s ({(self.n - 1) * encoded / self.rate:.3f}s to "
            f"send k-1 contributions at the link rate)")
        self.results.update(topk_encoded_bytes=encoded, topk_wire_bytes_per_member=wire,
                            topk_ratio=round(ratio, 1),
                            topk_ratio_vs_fp32_ring=round(fp32_wire / wire, 1),
                            topk_seconds=round(best, 3), topk_median_seconds=round(median, 3))

    def gloo(self, label, ours):
        best, median, times, run = self.timed(f"gloo-{label}", "gloo", output=True)
        if label == "limited":
            self.compare_gloo(run)
        target = 1.0 if label == "limited" else 1.3  # unlimited veths and loopback
        say(f"Gloo ring allreduce, {label} links: best {best:.2f}s, median {median:.2f}s; ours "
            f"(fp32) {ours:.2f}s; ours / Gloo {ours / best:.3f} (best of each; target <= "
            f"{target})")
        self.results.update({f"gloo_{label}_seconds": round(best, 3),
                             f"gloo_{label}_median_seconds": round(median, 3),
                             f"ours_over_gloo_{label}": round(ours / best, 4)})
        lossless = getattr(self, "ts_lossless", None)
        if label == "limited" and lossless:
            say(f"  ours with fp32-zstd (the same bits) {lossless:.2f}s; ours / Gloo "
                f"{lossless / best:.3f} (target <= {target})")
            self.results["ours_lossless_over_gloo_limited"] = round(lossless / best, 4)

    def compare_gloo(self, gloo_run):
        """Gloo's mean and ours (the fp32 run's member 0) agree to float rounding."""
        ts_out = getattr(self, "fp32_output", None)
        if not ts_out:
            return
        try:
            import numpy as np
        except ImportError:
            return
        ours = np.fromfile(ts_out, dtype="<f4")
        theirs = np.fromfile(gloo_run.outputs[gloo_run.ok_members[0]], dtype="<f4")
        diff = float(np.max(np.abs(ours - theirs)))
        say(f"  results: ours and Gloo's differ by at most {diff:.3g} (summation order)")
        if diff > 1e-5:
            raise RuntimeError(f"ours and Gloo's means differ by {diff}")

    def fast_links(self, label, where):
        """fp32 and Gloo where the links are not limited; our time / Gloo's."""
        best, median, _, _ = self.timed(f"fp32-{label}", "ts", ["--codec", "fp32"])
        say(f"fp32 allreduce, {where}: best {best:.2f}s, median {median:.2f}s "
            f"({self.size / best / 1e6:.0f} MB/s of buffer); load {os.getloadavg()[0]:.1f}")
        self.results.update({f"{label}_seconds": round(best, 3),
                             f"{label}_median_seconds": round(median, 3)})
        self.gloo(label, best)

    def unlimited(self):
        self.fast_links("unlimited", "unlimited veths")

    def on_loopback(self):
        """Every member in this namespace on 127.0.0.1 (no veth, no bridge)."""
        self.loopback = True
        try:
            self.fast_links("loopback", "loopback")
        finally:
            self.loopback = False

    def tls_pair(self, label, where):
        """fp32 in the clear, then over TLS, on the same links: (ratio, extra CPU-s per GiB)."""
        plain = self.timed(f"fp32-plain-{label}", "ts", ["--codec", "fp32"], output=True)
        tls = self.timed(f"fp32-tls-{label}", "ts", ["--codec", "fp32"], output=True, tls=True)
        same = file_sha256(plain[3].outputs[0]) == file_sha256(tls[3].outputs[0])
        if not same:
            raise RuntimeError(f"{label}: the TLS result differs from the plaintext one")
        self.check_identical(tls[3])
        # Frame bytes every member sent in all operations (each sealed by its sender, opened by
        # its receiver under TLS).
        run = plain[3]
        gib = sum(run.last_ok[i]["wire_bytes_sent"] for i in run.ok_members) * run.ops / GIB
        extra_cpu = (tls[3].cpu_s - plain[3].cpu_s) / gib
        ratio = tls[0] / plain[0]
        say(f"TLS, {where}: fp32 in the clear best {plain[0]:.3f}s (median {plain[1]:.3f}s), "
            f"over TLS best {tls[0]:.3f}s (median {tls[1]:.3f}s): ratio {ratio:.3f} (median "
            f"{tls[1] / plain[1]:.3f}); the members' CPU {plain[3].cpu_s:.1f} -> "
            f"{tls[3].cpu_s:.1f} s for {gib:.2f} GiB sent: {extra_cpu:.2f} CPU-s per GiB more "
            f"(sealed once, opened once; the records add 22 bytes per 16 KiB, 0.13 %); "
            f"results bit-identical")
        self.results.update({f"tls_{label}_plain_seconds": round(plain[0], 3),
                             f"tls_{label}_seconds": round(tls[0], 3),
                             f"tls_{label}_ratio": round(ratio, 4),
                             f"tls_{label}_ratio_median": round(tls[1] / plain[1], 4),
                             f"tls_{label}_cpu_s_per_gib": round(extra_cpu, 3)})

    def tls_limited(self):
        self.tls_pair("limited", f"{self.args.rate_mbit} Mbit/s links (target <= 1.03)")

    def tls_loopback(self):
        self.loopback = True
        try:
            self.tls_pair("loopback", "loopback")
        finally:
            self.loopback = False

    def death(self, sig):
        """One operation on the limited links; member n-1 gets `sig` a third of the way in."""
        hb = self.args.heartbeat_ms
        victim = self.n - 1
        run = self.start_group(f"death-{signal.Signals(sig).name}", "ts", ["--codec", "fp32"], 1)
        kill_at = run.start_ms / 1000 + self.bound(self.size) / 3
        while time.time() < kill_at:
            if any(p.poll() is not None for p in run.procs):
                raise RuntimeError(f"{run.name}: a member ended before the signal: "
                                   f"{[run.lines(i) for i in range(self.n)]}")
            time.sleep(0.005)
        sent_ms = time.time() * 1000
        run.procs[victim].send_signal(sig)
        survivors = [i for i in range(self.n) if i != victim]
        try:
            for i in survivors:
                run.procs[i].wait(timeout=60)
        finally:
            if sig == signal.SIGSTOP:
                run.procs[victim].send_signal(signal.SIGCONT)
            run.procs[victim].kill()
        codes = self.finish(run, 30, expect_ok=False)
        index_of = {k["address"]: i for i, k in enumerate(self.keys)}
        detect, blamed, errors = [], [], []
        for i in survivors:
            lines = run.lines(i)
            if codes[i] == 0 or not lines or lines[-1].get("ok"):
                raise RuntimeError(f"{run.name}: survivor {i} did not fail: {lines} "
                                   f"{run.log_tail(i)}")
            detect.append(float(lines[-1]["failed_at_unix_ms"]) - sent_ms)
            blamed.append(index_of.get(lines[-1].get("failed_peer"), "nobody"))
            errors.append(lines[-1].get("error", ""))
        worst = max(detect)
        name = signal.Signals(sig).name
        say(f"{name} of member {victim} {sent_ms - run.start_ms:.0f} ms into the operation: "
            f"survivors {survivors} failed after {', '.join(f'{d:.0f}' for d in detect)} ms; "
            f"max {worst:.0f} ms = {worst / hb:.2f}x the heartbeat interval ({hb} ms; target "
            f"<= 2); members they blamed: {blamed}")
        for i, b, e in zip(survivors, blamed, errors):
            if b != victim:
                say(f"  survivor {i} blamed member {b}, not {victim}: {e}")
        key = name.lower()
        self.results.update({f"{key}_detect_ms": round(worst, 1),
                             f"{key}_ratio_heartbeat": round(worst / hb, 3),
                             f"{key}_blamed_victim": all(b == victim for b in blamed)})

    def run(self):
        a = self.args
        only = a.only
        want = FIGURES if only == "all" else [only]
        say(f"collective_bench: {a.size_mib} MiB fp32, {self.n} hosts, {a.rate_mbit} Mbit/s "
            f"(burst {a.burst}, latency {a.latency}), {a.iterations} iterations, heartbeat "
            f"{a.heartbeat_ms} ms; {platform.node()}, {os.cpu_count()} cores, "
            f"{platform.platform()}; load {os.getloadavg()[0]:.1f}")
        done = False
        try:
            self.setup()
            limited = [f for f in want if f not in ("unlimited", "loopback")]
            if limited:
                self.shape_all()
                self.raw_tcp_figure()
            if "fp32" in want or "gloo" in want or "lossless" in want:
                self.fp32()
                self.fp32_output = self.last_run.outputs[self.last_run.ok_members[0]]
            if "lossless" in want or "gloo" in want:
                self.lossless()
            if "int8" in want:
                self.int8()
            if "topk" in want:
                self.topk()
            if "gloo" in want:
                self.gloo("limited", self.ts_limited)
            if "tls" in want:
                self.tls_limited()
            if "death" in want:
                self.death(signal.SIGKILL)
                self.death(signal.SIGSTOP)
            if "unlimited" in want:
                self.unshape_all()
                self.unlimited()
            if "loopback" in want:
                self.on_loopback()
            if "tls" in want:
                self.tls_loopback()
            done = True
        finally:
            if self.topo:
                self.topo.destroy()
                left = netns.wait_gone()
                if left:
                    say(f"left behind: {left}")
            if self.root and (a.keep or not done):
                say(f"work dir (reports, logs) kept: {self.root}")
            elif self.root:
                shutil.rmtree(self.root, ignore_errors=True)
        self.results.update(size_mib=a.size_mib,
                            hosts=self.n, rate_mbit=a.rate_mbit, iterations=a.iterations,
                            heartbeat_ms=a.heartbeat_ms, date=time.strftime("%Y-%m-%d"))
        print(json.dumps({"bench": "collective", **self.results}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=64)
    p.add_argument("--rate-mbit", type=int, default=100)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--iterations", type=int, default=5,
                   help="operations per figure (ratios use the best; the median is printed)")
    p.add_argument("--heartbeat-ms", type=int, default=500)
    p.add_argument("--chunk-elements", type=int, default=0,
                   help="elements per data frame of our runs (default: the node's, 256Ki)")
    p.add_argument("--burst", default=netns.DEFAULT_BURST)
    p.add_argument("--latency", default=netns.DEFAULT_LATENCY)
    p.add_argument("--only", choices=["all"] + FIGURES, default="all",
                   help="one figure (gloo also runs fp32, its reference)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    if args.hosts < 2:
        p.error(f"--hosts: {args.hosts} is below 2")
    if args.iterations < 1:
        p.error(f"--iterations: {args.iterations} is below 1")
    if args.size_mib < 1:
        p.error(f"--size-mib: {args.size_mib} is below 1")
    if args.heartbeat_ms < 10:
        p.error(f"--heartbeat-ms: {args.heartbeat_ms} is below 10")
    netns.require_root()
    if not os.path.exists(NODE):
        raise FileNotFoundError(f"{NODE} is not built")
    Bench(args).run()


if __name__ == "__main__":
    main()
