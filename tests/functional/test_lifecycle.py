"""Acceptance 1: devnet + 3 trainshardd + CLI, multi-process on loopback.

proposal -> votes -> open -> 3 reservations -> RUNNING -> a settlement drafted by hand is refused
by every host (a host signs only the settlement its own certified training records imply, and
these hosts trained nothing) and changes nothing -> the shard expires at its deadline -> the
escrow is refunded to the creator, total supply unchanged, every event seen once by every
sidecar, each of which recorded the expiry. A settlement that hosts sign after training is
test_training's; one signed by <= 2/3 of the weight is refused on chain in cli_e2e_test.

A run too long for its shard's deadline: the hosts stop while the settlement still fits and
settle the rounds they certified; the chain pays that part of the escrow and refunds the rest.
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
    # The first test runs on a chain that asks a fee (every tx the sidecars and the CLI send
    # simulates, then pays); the others on one that asks none, so balances move by payouts only.
    MIN_GAS_PRICE = {"test_open_reserve_refuse_and_expire": "0.002"}

    def setUp(self):
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")),
                                   min_gas_price=self.MIN_GAS_PRICE.get(self._testMethodName, "0"))
        self.net.init()
        self.net.start_devnet()
        self.net.add_hosts()

    def tearDown(self):
        self.net.cleanup()

    def test_open_reserve_refuse_and_expire(self):
        net = self.net
        supply = int(net.cli("chain", "status")["total_supply"])
        creator = net.address("creator")
        hosts = {h.name: h.address for h in net.hosts}
        before = {name: net.balance(a) for name, a in hosts.items()}
        creator_before = net.balance(creator)

        # Opened at height h, the shard expires at h + 60 (about 12 s at 200 ms a block).
        spec = net.write_spec("lifecycle", min_nodes=2, max_nodes=3, escrow=300000, bps=5000,
                              max_duration=60, window=30)
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
        payouts = ["--work", f"{hosts['host1']}=5", "--work", f"{hosts['host2']}=4",
                   "--work", f"{hosts['host3']}=3"]
        # Every host refuses to sign a draft its own records do not imply: none trained.
        out = net.cli("shard", "settle", "--id", sid, "--hosts",
                      ",".join(h.operator for h in net.hosts), "--final-root", root, *payouts,
                      "--eval-metric", "eval_loss", "--eval-value-micro", "2500000",
                      "--submit-via", net.hosts[0].operator, check=False)
        self.assertNotEqual(out.returncode, 0, out.stdout)
        for h in net.hosts:
            self.assertIn(f"host {h.operator} did not sign", out.stderr)
        self.assertIn("no training records", out.stderr)
        self.assertEqual(net.shard(sid)["status"], "SHARD_STATUS_RUNNING")
        # Each host paid the fees of its vote and its reservation, and nothing else moved.
        paid_fees = {name: before[name] - net.balance(address) for name, address in hosts.items()}
        for name, fee in paid_fees.items():
            self.assertGreater(fee, 0, f"{name} paid no fee for its reservation")
        for h in net.hosts:
            r = net.cli("host", "settlement", "--host", h.operator, "--id", sid, check=False)
            self.assertNotEqual(r.returncode, 0, f"{h.name} stored a signature: {r.stdout}")

        # Nobody settles: the shard expires at its deadline and the creator gets the escrow back.
        net.wait_shard_status(sid, "SHARD_STATUS_EXPIRED", 120)
        for name, address in hosts.items():
            self.assertEqual(net.balance(address), before[name] - paid_fees[name])
        # The deposit was refunded on passing; the escrow on expiry; the creator paid the fees
        # of its proposal and its vote; every fee is in the fee collector.
        params = net.cli("chain", "params")
        self.assertEqual(params["params"]["min_gas_price"], "0.002")
        creator_fees = creator_before - net.balance(creator)
        self.assertGreater(creator_fees, 0)
        collected = net.balance(params["fee_collector_address"])
        self.assertGreaterEqual(collected, creator_fees + sum(paid_fees.values()))
        self.assertEqual(int(net.cli("chain", "status")["total_supply"]), supply)
        total = sum(net.balance(net.address(k)) for k in net.keys)
        for module in ("gov_address", "escrow_address", "fee_collector_address"):
            total += net.balance(params[module])
        self.assertEqual(total, supply, "balances do not add up to the total supply")
        for h in net.hosts:
            def expired(h=h):
                recs = {r["shard_id"]: r for r in h.shards()["shards"]}
                return recs.get(sid, {}).get("status") == "SHARD_STATUS_EXPIRED"
            harness.wait_for(expired, 30, f"{h.name} to record the expiry")

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

    def test_a_run_that_reaches_its_deadline_settles_the_rounds_it_certified(self):
        net = self.net
        creator = net.address("creator")
        before = {h.address: net.balance(h.address) for h in net.hosts}
        creator_before = net.balance(creator)
        # 200 rounds that cannot fit: opened at height h, the deadline is h + 300, about 60 s
        # at 200 ms a block. The members train while a round and the settlement still fit
        # before it, then settle what they certified, on their own.
        planned = 200
        run_spec = net.write_run_spec("deadline", rounds=planned, innerSteps=6)
        spec = net.write_spec("deadline", run_spec=run_spec, min_nodes=3, max_nodes=3,
                              escrow=300000, bps=5000, max_duration=300, window=30)
        _, sid = net.propose_and_pass(spec, run_spec=run_spec)
        net.wait_shard_status(sid, "SHARD_STATUS_SETTLED", 120)
        shard = net.shard(sid)
        self.assertLess(int(shard["closed_height"]), int(shard["deadline_height"]))
        settlement = net.cli("shard", "settlement", "--id", sid)["settlement"]
        completed = int(settlement["rounds_completed"])
        self.assertEqual(int(settlement["rounds_planned"]), planned)
        self.assertGreaterEqual(completed, 1)
        self.assertLess(completed, planned)
        # Paid: at most the certified rounds' part of the escrow, to every host that trained;
        # the rest back to the creator.
        paid = {p["host"]: int(p["amount"]) for p in settlement["payouts"]}
        self.assertLessEqual(sum(paid.values()), 300000 * completed // planned)
        self.assertEqual(int(settlement["refund"]), 300000 - sum(paid.values()))
        # The creator locked the escrow when the proposal passed (its deposit came back).
        self.assertEqual(net.balance(creator) - creator_before,
                         int(settlement["refund"]) - 300000)
        for h in net.hosts:
            self.assertGreater(paid.get(h.address, 0), 0, f"{h.name} was not paid")
            self.assertEqual(net.balance(h.address) - before[h.address], paid[h.address])
        # Each host's run ends by itself and says why it stopped: the deadline too near, or
        # (a host a round behind when the others settled) the shard closed under it; it ends on
        # the settled root or behind it.
        harness.wait_for(lambda: all(net.train_status(h, sid, check=False).get("state") == "done"
                                     for h in net.hosts), 60, "every run done")
        for h in net.hosts:
            status = net.train_status(h, sid)
            self.assertTrue(any("too near for another round" in t or "shard is SHARD_STATUS" in t
                                for t in status.get("transitions", [])),
                            f"{h.name}: {status.get('transitions')}")
            self.assertLessEqual(int(status["certified_round"]), completed)


if __name__ == "__main__":
    unittest.main(verbosity=2)
