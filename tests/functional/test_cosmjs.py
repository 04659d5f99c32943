"""An independent Cosmos client against a running devnet: CosmJS from the npm registry
(tests/functional/cosmjs/, `npm ci` there on first use) over the node's CometBFT JSON-RPC and
WebSocket, as wallets, explorers and indexers meet a Cosmos node.

The chain asks a fee (min_gas_price 0.002). cosmjs_check.mjs connects (StargateClient, the
version auto-detection), simulates and sends with "auto" gas and pays the fee, finds the transfer
by the SDK's event keys (searchTx), has a fee above the balance refused with the SDK's code 5,
votes with hosts' keys on a proposal that opens a shard, follows new blocks over the
WebSocket, and lists and calls the node's gRPC services through server reflection (grpc-js). The test then checks on its own side (the CLI over gRPC) what the client did: the
shard opened, the supply is unchanged and the fees are in the fee collector.
"""
import json
import os
import subprocess
import sys
import unittest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
COSMJS = os.path.join(HERE, "cosmjs")
GAS_PRICE = "0.002"


def ensure_cosmjs():
    """CosmJS and grpc-js from the lock file, once (node_modules is not committed)."""
    modules = os.path.join(COSMJS, "node_modules")
    if not all(os.path.isdir(os.path.join(modules, *p.split("/")))
               for p in ("@cosmjs/stargate", "@grpc/grpc-js", "grpc-js-reflection-client")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=COSMJS, check=True,
                       stdout=subprocess.DEVNULL)


class CosmjsTest(unittest.TestCase):
    def setUp(self):
        ensure_cosmjs()
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")),
                                   min_gas_price=GAS_PRICE)
        self.net.init(extra_accounts=("alice", "amino", "bob"))
        self.net.start_devnet()

    def tearDown(self):
        self.net.cleanup()

    def key_hex(self, name):
        with open(self.net.keys[name]["file"]) as f:
            return f.read().strip()

    def run_check(self, steps, **extra):
        config = {"rpc": f"http://{self.net.listen_ip}:{self.net.rpc_port}",
                  "chain_id": self.net.chain_id, "denom": "ngonka", "prefix": "gonka",
                  "gas_price": f"{GAS_PRICE}ngonka",
                  "sender_key_hex": self.key_hex("alice"), "amino_key_hex": self.key_hex("amino"),
                  "recipient": self.net.address("bob"), "poor_key_hex": self.key_hex("outsider"),
                  "grpc": self.net.chain,
                  "voters": [], "steps": steps, "expect_comet_client": "Comet38Client",
                  "poll_interval_ms": 300}
        config.update(extra)
        path = os.path.join(self.net.root, f"cosmjs-{len(steps)}.json")
        with open(path, "w") as f:
            json.dump(config, f)
        p = subprocess.run(["node", os.path.join(COSMJS, "cosmjs_check.mjs"), path], cwd=COSMJS,
                           capture_output=True, text=True, timeout=600)
        results = {}
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                results[record["step"]] = record
        for step in steps:
            self.assertIn(step, results, f"{step} reported nothing; stderr:\n{p.stderr[-3000:]}")
            self.assertTrue(results[step]["ok"],
                            f"{step}: {json.dumps(results[step])[:2000]}\n{p.stderr[-2000:]}")
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        for step in steps:
            print(f"  {step}: {json.dumps(results[step])[:400]}", flush=True)
        return results

    def test_cosmjs_sends_searches_votes_and_subscribes(self):
        net = self.net
        harness.wait_for(lambda: net.height() >= 2, 30, "block 2")
        supply = int(net.cli("chain", "status")["total_supply"])
        # A proposal that opens a shard; the hosts vote on it through CosmJS.
        spec = net.write_spec("cosmjs", min_nodes=2, max_nodes=3, escrow=300000)
        out = net.cli("proposal", "submit", "--spec", spec, "--deposit", "1000", "--title",
                      "shard", "--wait", key="creator")
        pid, sid = out["proposal_id"], out["shard_id"]
        voters = [{"key_hex": self.key_hex(f"host{i}"), "proposal_id": str(pid)}
                  for i in (1, 2, 3)]
        results = self.run_check(["connect", "send_auto", "search", "amino_send",
                                  "fee_above_balance", "vote", "websocket", "grpc_reflection"],
                                 voters=voters)
        # The refusal was the SDK's insufficient funds, in its codespace.
        refused = results["fee_above_balance"]
        self.assertEqual(refused.get("code"), 5, refused)
        self.assertEqual(refused.get("codespace"), "sdk", refused)
        # What the client did, seen over gRPC: the transfers landed, the shard opened.
        net.wait_shard_status(sid, "SHARD_STATUS_OPEN", 60)
        self.assertEqual(net.balance(net.address("bob")), 1000000000 + 2000)
        params = net.cli("chain", "params")
        collected = net.balance(params["fee_collector_address"])
        self.assertGreater(collected, 0)
        self.assertEqual(int(net.cli("chain", "status")["total_supply"]), supply)
        total = sum(net.balance(net.address(k)) for k in net.keys)
        for module in ("gov_address", "escrow_address", "fee_collector_address"):
            total += net.balance(params[module])
        self.assertEqual(total, supply, "balances do not add up to the total supply")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[1:], verbosity=2)
