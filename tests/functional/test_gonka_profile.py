"""The gonka-v0 profile end to end (docs/gonka-v0.md): a devnet running Gonka's trainshards v0
instead of the module, three trainshardd with chain_profile = "gonka-v0", and the CLI.

The hosts opt their ML nodes in by themselves, publishing their shard endpoints and certificate
pins; governance passes Gonka's MsgCreateTrainshardProposal (the run spec pinned by its
base_image digest); the creator's MsgAssembleTrainshard makes the chain pick three of the four
nodes (one stays free for the model) and freeze their PoC weight; the picked hosts learn it from
trainshard_node_reserved, their operators hand over the run spec, and they train to the end over
TLS pinned by what the chain carries: one final root, the loss down, the settlement signed by
every member and kept off chain. An outsider cannot settle the shard; the creator's
MsgSettleTrainshard closes it, and every host records the close. The creator then fetches the
checkpoint whose root members holding more than 2/3 of the weight signed; an outsider cannot.
"""

import base64
import hashlib
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

GONKA = ("--chain-profile", "gonka-v0")
MODEL = "Qwen/Qwen3-4B"
PROFILE = "cpu-small"


def gonka_genesis(net):
    """The devnet genesis `net.init` wrote, turned into the gonka-v0 profile: Gonka's training
    params, one ML node per host and a spare node nobody offers (Gonka leaves one node of every
    model free for inference)."""
    path = os.path.join(net.home, "genesis.json")
    with open(path) as f:
        genesis = json.load(f)
    nodes = [{"participant": net.address(name), "node_id": "node-1", "model_id": MODEL,
              "gpu_profile_id": PROFILE, "poc_weight": str(w)}
             for name, w in (("host1", 100), ("host2", 80), ("host3", 60), ("spare", 40))]
    genesis["gonka_v0"] = {
        "params": {
            "training_enabled": True, "max_nodes_per_shard": 8, "max_active_shards": 4,
            "min_duration_blocks": "10", "max_duration_blocks": "100000",
            "allowed_gpu_profile_ids": [PROFILE], "max_active_shards_per_creator": 2,
            "creator_cooldown_blocks": "0", "max_total_reserved_nodes": 8,
            "max_reserved_share_per_model_bps": 7500, "max_reserved_share_per_profile_bps": 7500,
            "max_expirations_per_block": 8,
            # Gonka ties these to the epoch (1,000,000 blocks on this devnet).
            "settled_shard_retention_blocks": "2000100", "opt_in_ttl_blocks": "1000000",
            "release_buffer_blocks": "10"},
        "ml_nodes": nodes,
    }
    with open(path, "w") as f:
        json.dump(genesis, f)


class GonkaProfileTest(unittest.TestCase):
    def setUp(self):
        # A chain that asks a fee: the hosts and the CLI price their txs from the node's Config.
        self.net = harness.Network(keep=bool(os.environ.get("TS_KEEP")), min_gas_price="0.002")
        self.net.init(extra_accounts=("spare",))
        gonka_genesis(self.net)
        self.net.start_devnet()
        gonka = {"chain_profile": '"gonka-v0"',
                 "gonka_v0": '{ node_ids = ["node-1"], refresh_every_blocks = 40 }',
                 "worker_memory_bytes_max": 2 << 30}
        for i in range(1, 4):
            self.net.add_host(f"host{i}", extra_config=dict(gonka))
        for h in self.net.hosts:
            h.wait_shard_listen()

    def tearDown(self):
        self.net.cleanup()

    def gonka(self, *args, key=None, check=True):
        return self.net.cli(*GONKA, "gonka", *args, key=key, check=check)

    def test_opt_in_assemble_train_settle(self):
        net = self.net
        run_spec = net.write_run_spec("gonka", rounds=3, innerSteps=20)

        # Governance passes Gonka's proposal; the run spec rides in its base image's digest.
        out = self.gonka("propose", "--gpu-profile", PROFILE, "--max-nodes", "3",
                         "--duration-blocks", "6000", "--run-spec", run_spec, "--deposit", "1000",
                         "--wait", key="creator")
        self.assertEqual(out["code"], 0, out)
        self.assertTrue(out["base_image"].startswith("trainshard-run@sha256:"), out)
        for v in ("host1", "host2", "host3"):
            net.cli("proposal", "vote", "--id", out["proposal_id"], "--option", "yes", "--wait",
                    key=v)
        def passed():
            r = self.gonka("proposal", "--id", "1", check=False)
            return json.loads(r.stdout) if r.returncode == 0 else None
        proposal = harness.wait_for(passed, 60, "Gonka's proposal")
        self.assertEqual(proposal["base_image"], out["base_image"])

        # The hosts opted in by themselves; the chain picks the nodes once they have.
        def assembled():
            r = self.gonka("assemble", "--proposal", "1", "--wait", key="creator", check=False)
            if r.returncode == 0:
                return json.loads(r.stdout)
            self.assertIn("1203", r.stdout + r.stderr)  # not enough opted-in nodes yet
            return None
        sid = harness.wait_for(assembled, 60, "the assembly", interval_s=1)["trainshard_id"]
        shard = self.gonka("shard", "--id", sid)
        picked = {n["participant"] for n in shard["nodes"]}
        self.assertEqual(picked, {h.address for h in net.hosts},
                         "the three offering hosts, never the spare node nobody opted in")
        for n in shard["nodes"]:
            self.assertRegex(n["endpoint"], r"^https://127\.0\.0\.1:[0-9]+/tls-sha256/[0-9a-f]{64}$")

        # Through the client's translation the shard is RUNNING with its frozen weights.
        view = net.cli(*GONKA, "shard", "status", "--id", sid)
        self.assertEqual(view["status"], "SHARD_STATUS_RUNNING", view)
        for h in net.hosts:
            harness.wait_for(lambda h=h: any(s["shard_id"] == sid and s.get("reserved")
                                             for s in h.shards().get("shards", [])),
                             60, f"{h.name} to record that it was picked")

        # No run spec on chain in v0: the operators hand it over, pinned by the base image.
        for h in net.hosts:
            harness.wait_for(lambda h=h: net.cli("shard", "run", "--id", sid, "--run-spec",
                                                 run_spec, "--host", h.operator, check=False,
                                                 json_out=False).returncode == 0,
                             60, f"{h.name} to take the run")
        harness.wait_for(
            lambda: all("kept off chain" in " ".join(net.train_status(h, sid, check=False)
                                                     .get("transitions", []))
                        for h in net.hosts), 600, "the settlement signed off chain", interval_s=1)
        statuses = [net.train_status(h, sid) for h in net.hosts]
        self.assertEqual(len({s["root"] for s in statuses}), 1, "one final root")
        for s in statuses:
            self.assertEqual(int(s["certified_round"]), 3)
        initial = int(statuses[0]["initial_eval_loss_micro"])
        final = int(statuses[0]["rounds"][-1]["eval_loss_micro"])
        self.assertLess(final, initial, "the eval loss went down")
        drafts = {json.dumps(s["settlement"], sort_keys=True) for s in statuses}
        self.assertEqual(len(drafts), 1, "every member drafted the same settlement")

        # Only the creator settles: an outsider is refused in Gonka's codespace.
        refused = self.gonka("settle", "--id", sid, "--wait", key="outsider", check=False)
        self.assertEqual(refused.returncode, 1, refused.stdout)
        self.assertIn("1205", refused.stdout + refused.stderr)
        self.gonka("settle", "--id", sid, "--wait", key="creator")
        self.assertEqual(self.gonka("shard", "--id", sid)["status"], "TRAINSHARD_STATUS_SETTLED")
        for h in net.hosts:
            harness.wait_for(lambda h=h: any(s["shard_id"] == sid and
                                             s["status"] == "SHARD_STATUS_SETTLED"
                                             for s in h.shards().get("shards", [])),
                             60, f"{h.name} to record the settle")
            harness.wait_for(lambda h=h: net.train_status(h, sid, check=False).get("state")
                             == "done", 60, f"{h.name}'s run done")

        # The result in the payer's hands without a settlement on chain: the creator takes the
        # root the members signed (more than 2/3 of the frozen weight) and fetches that
        # checkpoint from them; an outsider is refused by every member.
        root = statuses[0]["root"]
        fetched = net.cli(*GONKA, "model", "fetch", "--shard", sid, "--out",
                          os.path.join(net.root, "v0-model"), key="creator", timeout=120)
        self.assertEqual(fetched["root"], base64.b64decode(root).hex())
        with open(fetched["checkpoint"], "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), fetched["root"])
        outsider = net.cli(*GONKA, "model", "fetch", "--shard", sid, "--out",
                           os.path.join(net.root, "stolen"), key="outsider", check=False,
                           timeout=120)
        self.assertNotEqual(outsider.returncode, 0, outsider.stdout)
        self.assertIn("neither a member nor a reader", outsider.stderr)
        self.assertFalse(os.path.exists(os.path.join(net.root, "stolen")))


if __name__ == "__main__":
    unittest.main()
