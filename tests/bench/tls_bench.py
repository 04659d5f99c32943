"""What TLS between hosts costs an artifact transfer (docs/threat-model.md, "TLS between
hosts"): two real trainshardd in network namespaces, A publishing and B fetching the same size
of artifact in plaintext and over TLS (`peer_tls`, A's certificate pinned from its reservation)
over the chunk stream (the default fetch path; `--transport grpc`: over gRPC), side by side in
one run, on a tbf-limited link (100 Mbit/s by default), on the unlimited veth link, and with
both hosts on loopback (a second devnet and pair of hosts in this namespace), alternating the two
modes so the machine's drift falls on both. The hosts are restarted between modes with the
other setting; the artifact is fetched fresh each time (dropped on B in between).

Prints, per link: each fetch's throughput, the TLS / plaintext throughput ratio (target on the
limited link: TLS at least 1/1.03 of plaintext, i.e. plaintext / TLS <= 1.03), and the CPU
seconds per GiB of each daemon in both modes; the difference is what TLS costs per GiB. The last
line is one JSON document. Run as root:

  TS_BUILD_DIR=build /usr/bin/python3 tests/bench/tls_bench.py [--size-mib 256] [--rounds 2]
      [--transport stream|grpc]
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "functional"))
import harness  # noqa: E402
import netns  # noqa: E402
from artifact_bench import MIB, cpu_seconds  # noqa: E402

GIB = 1 << 30


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class TlsBench:
    def __init__(self, args):
        self.args = args
        self.size = args.size_mib * MIB

    def setup(self, loopback=False):
        """Two hosts in namespaces on a bridge, or (loopback) both in this one on 127.0.0.1."""
        self.topo = None if loopback else netns.Topology(["A", "B"]).create()
        self.net = harness.Network(voting_period=10, host_weights=(100, 80),
                                   listen_ip="127.0.0.1" if loopback else self.topo.bridge_ip)
        net = self.net
        net.init()
        net.start_devnet()
        self.hosts = {}
        for i, name in enumerate("AB", start=1):
            where = {} if loopback else dict(ip=self.topo.ip[name],
                                             exec_prefix=self.topo.prefix_args(name),
                                             shard_listen=True)
            self.hosts[name] = net.add_host(name, f"host{i}", **where)
            self.hosts[name].wait_shard_listen()
        spec = net.write_spec("tls-bench", min_nodes=2, max_nodes=2, escrow=200000,
                              max_duration=100000, quota_bytes=4 * self.size + 64 * MIB,
                              quota_files=100000)
        _, self.sid = net.propose_and_pass(spec, voters=("host1", "host2"))
        net.wait_shard_status(self.sid, "SHARD_STATUS_RUNNING", 60)
        src = os.path.join(net.root, "artifact")
        harness.write_random_files(src, {f"part-{i}.bin": 64 * MIB
                                         for i in range(max(1, self.args.size_mib // 64))})
        out = net.artifact(self.hosts["A"], "publish", "--shard", self.sid, "--dir", src,
                           timeout=600)
        self.id = out["artifact_id"]
        say(f"shard {self.sid}; {self.args.size_mib} MiB artifact {self.id[:16]}.. on A")

    def set_mode(self, tls):
        for h in self.hosts.values():
            h.process.stop()
            h.extra_config["peer_tls"] = "true" if tls else "false"
            # --transport stream: the chunk stream in both modes (sendfile in the clear, read and
            # sealed under TLS); grpc: both over gRPC (HTTP/2, TLS from gRPC).
            h.extra_config["chunk_stream"] = "true" if self.args.transport == "stream" else "false"
            h.start()
            h.wait_shard_listen()

    def fetch(self):
        a, b = self.hosts["A"], self.hosts["B"]
        cpu0 = {n: cpu_seconds(h.process.proc.pid) for n, h in self.hosts.items()}
        t0 = time.monotonic()
        res = self.net.artifact(b, "fetch", "--shard", self.sid, "--id", self.id, "--peer",
                                a.address, timeout=3600)
        seconds = time.monotonic() - t0
        cpu = {n: cpu_seconds(h.process.proc.pid) - cpu0[n] for n, h in self.hosts.items()}
        if int(res.get("bytes_fetched", 0)) != self.size:
            raise RuntimeError(f"fetch did not move the artifact: {res}")
        gc = self.net.artifact(b, "gc", "--shard", self.sid, "--drop", self.id)
        if int(gc.get("artifacts_dropped", 0)) != 1:
            raise RuntimeError(f"gc on B dropped nothing: {gc}")
        return self.size / seconds, {n: c / (self.size / GIB) for n, c in cpu.items()}

    def run(self):
        results = {"size_mib": self.args.size_mib, "rate_mbit": self.args.rate_mbit}
        for links, loopback in ((("limited", "unlimited"), False), (("loopback",), True)):
            self.setup(loopback)
            self.measure(links, results)
        print(json.dumps({"transport": self.args.transport, **results}))

    def measure(self, links, results):
        try:
            for link in links:
                if link == "limited":
                    self.topo.shape("A", self.args.rate_mbit)
                elif link == "unlimited":
                    self.topo.unshape("A")
                runs = {"plain": [], "tls": []}
                for _ in range(self.args.rounds):
                    for mode in ("plain", "tls"):
                        self.set_mode(mode == "tls")
                        thr, cpu = self.fetch()
                        runs[mode].append((thr, cpu))
                        say(f"{link}, {mode}: {thr * 8 / 1e6:.1f} Mbit/s; CPU s/GiB A "
                            f"{cpu['A']:.2f}, B {cpu['B']:.2f}")
                plain = statistics.mean(t for t, _ in runs["plain"])
                tls = statistics.mean(t for t, _ in runs["tls"])
                cpu = {m: {n: statistics.mean(c[n] for _, c in runs[m]) for n in "AB"}
                       for m in runs}
                say(f"{link}: plaintext / TLS throughput {plain / tls:.3f}"
                    f"{' (target <= 1.03)' if link == 'limited' else ''}; TLS costs A "
                    f"{cpu['tls']['A'] - cpu['plain']['A']:+.2f} and B "
                    f"{cpu['tls']['B'] - cpu['plain']['B']:+.2f} CPU s per GiB")
                results[link] = {
                    "plain_mbit_s": [round(t * 8 / 1e6, 1) for t, _ in runs["plain"]],
                    "tls_mbit_s": [round(t * 8 / 1e6, 1) for t, _ in runs["tls"]],
                    "plain_over_tls": round(plain / tls, 4),
                    "cpu_s_per_gib": {m: {n: round(v, 3) for n, v in c.items()}
                                      for m, c in cpu.items()}}
        finally:
            self.net.cleanup()
            if self.topo:
                self.topo.destroy()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--rate-mbit", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--transport", choices=["stream", "grpc"], default="stream",
                   help="the chunk stream in both modes (the default fetch path), or gRPC only")
    args = p.parse_args()
    netns.require_root()
    TlsBench(args).run()


if __name__ == "__main__":
    main()
