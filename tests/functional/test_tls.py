"""TLS between hosts (docs/threat-model.md, "TLS between hosts"), multi-process on loopback: a
devnet and three trainshardd with `peer_tls = true` (the default, named here all the same).

- The three hosts train a shard to settlement with their round service (announces, plans,
  certificates) and their collective links (the pseudo-gradient exchange) over TLS, each pinning
  the certificate the others' reservations name. A passive capture of every TCP byte on
  loopback but the chain's, through the whole run, holds at least half of what the round
  certificates say was exchanged and not one collective frame header in the clear (each
  starts "TSCF" and the version byte).
- An artifact one host publishes is fetched by another over its TLS chunk stream; a passive
  capture of the publisher's peer port and chunk stream port (tcpdump on loopback) holds none
  of 32 samples of the artifact's bytes and no plaintext HTTP/2 preface.
- A host whose certificate is not the one its reservation pins (its TLS identity replaced) is
  refused by the others before any request: the fetch from it fails and the fetching host's log
  names both fingerprints.

"""

import base64
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_training  # noqa: E402

TCPDUMP = "/usr/bin/tcpdump"


class Capture:
    """tcpdump of `interface` (TCP port `port`, or the filter `expression`) into a file, until
    stopped."""

    def __init__(self, path, port=None, expression=None, interface="lo"):
        self.path = path
        self.process = subprocess.Popen(
            [TCPDUMP, "-i", interface, "-U", "-s", "0", "-B", "32768", "-w", path,
             expression or f"tcp port {port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # tcpdump says "listening on lo" once the capture runs.
        deadline = time.monotonic() + 10
        line = b""
        while time.monotonic() < deadline and b"listening" not in line:
            line = self.process.stderr.readline()
        if b"listening" not in line:
            raise RuntimeError(f"tcpdump did not start: {line!r}")

    def stop(self):
        time.sleep(0.5)
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=10)
        self.process.stderr.close()
        with open(self.path, "rb") as f:
            return f.read()


def port_of(endpoint):
    return int(endpoint.rsplit(":", 1)[1])


def chunk_stream_port(host):
    with open(host.process.log_path, errors="replace") as f:
        ports = re.findall(r'chunk_stream_port="?(\d+)', f.read())
    if not ports or ports[-1] == "0":
        raise AssertionError(f"{host.name} logged no chunk stream port")
    return int(ports[-1])


class TlsTest(unittest.TestCase):
    def setUp(self):
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")))
        self.net.init()
        self.net.start_devnet()
        for i in range(1, 4):
            self.net.add_host(f"host{i}", extra_config={"worker_threads": 1, "peer_tls": "true",
                                                        "worker_memory_bytes_max": 2 << 30})
        for h in self.net.hosts:
            h.wait_shard_listen()

    def tearDown(self):
        self.net.cleanup()

    def fetch(self, host, sid, art, peer, check=True):
        return self.net.artifact(host, "fetch", "--shard", str(sid), "--id", art, "--peer",
                                 peer.address, check=check)

    def publish(self, host, sid, name, size):
        src = os.path.join(self.net.root, "src", name)
        harness.write_random_files(src, {"data.bin": size})
        with open(os.path.join(src, "data.bin"), "rb") as f:
            content = f.read()
        out = self.net.artifact(host, "publish", "--shard", str(sid), "--dir", src, "--kind",
                                "data")
        return out["artifact_id"], content

    def test_training_fetching_and_an_impostor(self):
        net = self.net
        run_spec = net.write_run_spec("tls", rounds=4, innerSteps=30)
        # Every TCP byte on loopback but the chain's (plaintext gRPC to the devnet), from before
        # the shard opens until it settles: the round service and the collective links.
        run_capture = Capture(os.path.join(net.root, "run.pcap"),
                              expression=f"tcp and not port {port_of(net.chain)}")
        sid = test_training.open_shard(net, "tls", run_spec, on_chain=True, min_nodes=3,
                                       max_nodes=3)
        a, b, c = net.hosts

        # An artifact over TLS (the chunk stream, sealed), captured on the publisher's peer port
        # and its chunk stream port.
        art, content = self.publish(a, sid, "secret", 2 << 20)
        stream_port = chunk_stream_port(a)
        capture = Capture(os.path.join(net.root, "tls.pcap"),
                          expression=f"tcp port {port_of(a.shard_endpoint)} or "
                                     f"tcp port {stream_port}")
        fetched = self.fetch(b, sid, art, a)
        wire = capture.stop()
        self.assertEqual(int(fetched["bytes_fetched"]), 2 << 20, fetched)
        self.assertEqual(fetched.get("stream_fallbacks", []), [], fetched)
        # Most of the 2 MiB (tcpdump may drop some packets under load), all of it ciphertext.
        self.assertGreater(len(wire), 1 << 20, "the capture saw no transfer")
        for offset in range(0, len(content) - 64, len(content) // 32):
            self.assertNotIn(content[offset:offset + 64], wire, f"plaintext at {offset}")
        self.assertNotIn(b"PRI * HTTP/2.0", wire, "a plaintext HTTP/2 preface on the wire")

        test_training.wait_settled(net, sid, timeout_s=600)
        run_wire = run_capture.stop()
        statuses = [net.train_status(h, sid) for h in net.hosts]
        self.assertEqual({s["root"] for s in statuses}, {statuses[0]["root"]})
        for s in statuses:
            self.assertEqual(int(s["certified_round"]), 4, s.get("transitions"))
        # Some round carried all three members' signatures: every pair talked over TLS.
        self.assertTrue(any(len(r["members"]) == 3 for r in statuses[0]["rounds"]))
        # The pseudo-gradients crossed the capture, and not one collective frame in the clear.
        exchanged = sum(int(r.get("bytes_exchanged", 0)) for r in statuses[0]["rounds"])
        self.assertGreater(exchanged, 0, statuses[0]["rounds"][0])
        self.assertGreater(len(run_wire), exchanged // 2,
                           f"the capture holds {len(run_wire)} bytes of {exchanged} exchanged")
        # (assertFalse: a failure must not print the whole capture)
        self.assertFalse(b"TSCF\x01" in run_wire, "a collective frame header in the clear "
                         f"at byte {run_wire.find(b'TSCF')} of the capture")

        # c's TLS identity replaced: its reservation still pins the old certificate.
        c.process.stop()
        for name in ("tls.key", "tls.crt"):
            os.unlink(os.path.join(c.data_dir, name))
        c.start()
        c.wait_shard_listen()
        with open(os.path.join(c.data_dir, "tls.crt")) as f:
            new_pem = f.read()
        art2, _ = self.publish(c, sid, "impostor", 1 << 20)
        refused = self.fetch(a, sid, art2, c, check=False)
        self.assertNotEqual(refused.returncode, 0, refused.stdout)
        with open(os.path.join(a.dir, "trainshardd.log")) as f:
            log = f.read()
        self.assertIn("peer certificate refused", log)
        body = "".join(line for line in new_pem.splitlines() if "-----" not in line)
        presented = hashlib.sha256(base64.b64decode(body)).hexdigest()
        self.assertIn(f"presented_sha256={presented}", log)


if __name__ == "__main__":
    unittest.main()
