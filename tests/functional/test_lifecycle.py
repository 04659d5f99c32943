"""Acceptance 1: devnet + 3 trainshardd + CLI, multi-process on loopback.

proposal -> votes -> open -> 3 reservations -> settlement signed by hosts holding > 2/3 of the
weight -> hosts paid as settled, remainder refunded, total supply unchanged, every event seen once
by every sidecar. Also: a settlement signed by <= 2/3 of the weight is refused over the wire and
changes nothing.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def event_key(e):
    return (int(e["height"]), int(e["index"]), e["type"], tuple(sorted(e["attributes"].items())))


def assert_events_seen_once(test, net, host):
    """The host's followed events equal the chain's, one for one, up to the host's cursor."""
    cursor = int(host.status()["cursor_height"])
    test.assertGreater(cursor, 0)
    chain = [event_key(e) for e in net.chain_events(1, cursor)]
    seen = [event_key(e) for e in host.events() if int(e["height"]) <= cursor]
    test.assertEqual(len(seen), len(set(seen)), f"{host.name} saw an event twice")
    test.assertEqual(seen, chain, f"{host.name} events differ from the chain's")
    return cursor


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")))
        self.net.init()
        self.net.start_devnet()
        self.net.add_hosts()

    def tearDown(self):
        self.net.cleanup()

    def test_open_reserve_settle(self):
        net = self.net
        supply = int(net.cli("chain", "status")["total_supply"])
        creator = net.address("creator")
        hosts = {h.name: h.address for h in net.hosts}
        before = {name: net.balance(a) for name, a in hosts.items()}
        creator_before = net.balance(creator)

        spec = net.write_spec("lifecycle", min_nodes=2, max_nodes=3, escrow=300000, bps=5000)
        pid, sid = net.propose_and_pass(spec)
        # The sidecars reserve within a block or two of the opening, so OPEN may be brief.
        harness.wait_for(lambda: net.shard(sid)["status"] in ("SHARD_STATUS_OPEN",
                                                              "SHARD_STATUS_RUNNING"), 60,
                         f"shard {sid} to open")
        net.wait_shard_status(sid, "SHARD_STATUS_RUNNING", 30)
        shard = net.shard(sid)
        members = {r["host"]: int(r["frozen_weight"]) for r in shard["reservations"]}
        self.assertEqual(members, {hosts["host1"]: 100, hosts["host2"]: 80, hosts["host3"]: 60})
        self.assertEqual(int(shard["total_weight"]), 240)
        self.assertEqual(int(shard["escrow_held"]), 300000)
        # A host's follower may be a block or two behind the chain on a loaded machine.
        for h in net.hosts:
            def recorded(h=h):
                recs = {r["shard_id"]: r for r in h.shards()["shards"]}
                return sid in recs and recs[sid]["reserved"]
            harness.wait_for(recorded, 30, f"{h.name} to record its reservation")

        root = "ab" * 32
        payouts = ["--payout", f"{hosts['host1']}=100000", "--payout", f"{hosts['host2']}=80000",
                   "--payout", f"{hosts['host3']}=60000"]
        # Hosts 2 and 3 hold 140 of 240: not more than 2/3, refused, nothing changes.
        weak = net.cli("shard", "settle", "--id", sid, "--hosts",
                       f"{net.hosts[1].operator},{net.hosts[2].operator}", "--final-root", root,
                       *payouts, "--eval-metric", "eval_loss", "--eval-value-micro", "2500000",
                       "--submit-via", net.hosts[1].operator, check=False)
        self.assertNotEqual(weak.returncode, 0, weak.stdout)
        self.assertIn("2/3", weak.stdout + weak.stderr)
        self.assertEqual(net.shard(sid)["status"], "SHARD_STATUS_RUNNING")
        self.assertEqual(net.balance(hosts["host1"]), before["host1"])

        # All three sign (> 2/3): the settlement lands.
        out = net.cli("shard", "settle", "--id", sid, "--hosts",
                      ",".join(h.operator for h in net.hosts), "--final-root", root, *payouts,
                      "--eval-metric", "eval_loss", "--eval-value-micro", "2500000",
                      "--submit-via", net.hosts[0].operator)
        self.assertEqual(int(out["code"]), 0, out)
        self.assertEqual(int(out["signatures"]), 3)
        shard = net.wait_shard_status(sid, "SHARD_STATUS_SETTLED", 30)
        record = net.cli("shard", "settlement", "--id", sid)
        self.assertEqual(int(record["signed_weight"]), 240)

        self.assertEqual(net.balance(hosts["host1"]), before["host1"] + 100000)
        self.assertEqual(net.balance(hosts["host2"]), before["host2"] + 80000)
        self.assertEqual(net.balance(hosts["host3"]), before["host3"] + 60000)
        # Creator paid the 300000 escrow and got 60000 back; the deposit was refunded on passing.
        self.assertEqual(net.balance(creator), creator_before - 300000 + 60000)
        self.assertEqual(int(net.cli("chain", "status")["total_supply"]), supply)
        total = sum(net.balance(net.address(k)) for k in net.keys)
        params = net.cli("chain", "params")
        for module in ("gov_address", "escrow_address"):
            total += net.balance(params[module])
        self.assertEqual(total, supply, "balances do not add up to the total supply")

        # Every sidecar saw every event exactly once, up to the same height.
        end = net.height()
        for h in net.hosts:
            harness.wait_for(lambda: int(h.status()["cursor_height"]) >= end, 30,
                             f"{h.name} to follow to {end}")
            assert_events_seen_once(self, net, h)
        # And each acted once: one reservation decision for the shard.
        for h in net.hosts:
            reserves = [e for e in h.events() if e["action"] == "reserve"]
            self.assertEqual(len(reserves), 1, f"{h.name}: {reserves}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
