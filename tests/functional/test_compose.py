"""deploy/compose.yaml, checked without a Docker engine (docs/deploy.md, "Compose"):

- it validates against the compose-spec JSON schema (schema/compose-spec.json of the
  compose-spec project, as the npm package dclint ships it: tests/functional/compose_schema/,
  installed with `npm ci` into the build directory), read by python3-jsonschema;
- what the schema cannot see holds: every volume, config and dependency it names is declared,
  the files it mounts exist, each host's config points at the volumes mounted in its service
  and advertises its own service name;
- its first start, as far as it runs without containers: compose/init.sh makes the keys and
  the genesis (and a second run changes nothing), the devnet starts from that genesis, and
  each host's trainshardd, on its compose config, runs with its key and sees its PoC weight.
"""

import filecmp
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import tomllib
import unittest

import jsonschema
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(HERE))
DEPLOY = os.path.join(SOURCE_DIR, "deploy")
COMPOSE_FILE = os.path.join(DEPLOY, "compose.yaml")
SCHEMA_PACKAGE = os.path.join(HERE, "compose_schema")
SCHEMA_IN_PACKAGE = os.path.join("node_modules", "dclint", "schemas", "compose.schema.json")
HOSTS = ("host1", "host2", "host3")
NPM_TIMEOUT_S = 300
START_TIMEOUT_S = 60


def say(msg):
    print(f"[compose] {msg}", flush=True)


def compose_schema():
    """The schema, installed from the committed package-lock.json into the build directory once
    (again when the lock changes)."""
    dest = os.path.join(harness.BUILD_DIR, "compose-schema")
    schema = os.path.join(dest, SCHEMA_IN_PACKAGE)
    lock = os.path.join(SCHEMA_PACKAGE, "package-lock.json")
    installed_lock = os.path.join(dest, "package-lock.json")
    if not (os.path.exists(schema) and os.path.exists(installed_lock)
            and filecmp.cmp(lock, installed_lock, shallow=False)):
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(os.path.join(SCHEMA_PACKAGE, name), dest)
        say(f"npm ci in {dest}")
        p = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=dest,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=NPM_TIMEOUT_S)
        if p.returncode != 0:
            raise AssertionError(f"npm ci exited {p.returncode}:\n{p.stdout[-3000:]}")
    with open(schema) as f:
        return json.load(f)


def load_compose():
    with open(COMPOSE_FILE) as f:
        return yaml.safe_load(f)


def named_volume_mounts(service):
    """{target: (volume name, read_only)} of a service's short-syntax named-volume mounts."""
    out = {}
    for entry in service.get("volumes", []):
        parts = entry.split(":")
        if parts[0].startswith((".", "/")):
            continue
        out[parts[1]] = (parts[0], len(parts) > 2 and "ro" in parts[2].split(","))
    return out


def schema_errors(validator, document):
    return [f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message[:300]}"
            for e in validator.iter_errors(document)]


class ComposeFileTest(unittest.TestCase):
    def test_validates_against_the_compose_schema(self):
        schema = compose_schema()
        jsonschema.Draft7Validator.check_schema(schema)
        validator = jsonschema.Draft7Validator(schema)
        document = load_compose()
        self.assertEqual(schema_errors(validator, document), [])
        # The validation is not vacuous: a misspelt key, a wrong type and an unknown dependency
        # condition are each refused.
        for path, key, value in ((("services", "host1"), "restrat", "always"),
                                 (("services", "devnet"), "ports", "26657"),
                                 (("services", "host1", "depends_on", "devnet"), "condition",
                                  "service_ready")):
            broken = load_compose()
            node = broken
            for p in path:
                node = node[p]
            node[key] = value
            self.assertNotEqual(schema_errors(validator, broken), [], f"{path} {key}={value}")

    def test_names_only_what_it_declares(self):
        document = load_compose()
        services = document["services"]
        volumes = set(document.get("volumes", {}))
        configs = document.get("configs", {})
        for name, config in configs.items():
            path = os.path.join(DEPLOY, config["file"])
            self.assertTrue(os.path.isfile(path), f"configs.{name}: {path} missing")
        for name, service in services.items():
            for volume, _ in named_volume_mounts(service).values():
                self.assertIn(volume, volumes, f"services.{name}: volume {volume} not declared")
            for entry in service.get("configs", []):
                self.assertIn(entry["source"], configs, f"services.{name}: config {entry}")
            for dependency in service.get("depends_on", {}):
                self.assertIn(dependency, services, f"services.{name} depends on {dependency}")
                condition = service["depends_on"][dependency].get("condition")
                if condition == "service_healthy":
                    self.assertIn("healthcheck", services[dependency], dependency)
            if "build" in service:
                build = service["build"]
                context = os.path.normpath(os.path.join(DEPLOY, build["context"]))
                self.assertEqual(context, SOURCE_DIR)
                self.assertTrue(os.path.isfile(os.path.join(context, build["dockerfile"])))
        self.assertTrue(os.path.isfile(os.path.join(DEPLOY, "Dockerfile.dockerignore")))
        # Nothing in it is interpolated: a "$" would be taken from the environment.
        with open(COMPOSE_FILE) as f:
            self.assertNotIn("$", f.read())

    def test_host_configs_match_their_services(self):
        document = load_compose()
        services = document["services"]
        devnet_command = services["devnet"]["command"]
        devnet_port = devnet_command[devnet_command.index("--listen") + 1].rsplit(":", 1)[1]
        rpc_port = devnet_command[devnet_command.index("--rpc-listen") + 1].rsplit(":", 1)[1]
        config_files = {name: c["file"] for name, c in document["configs"].items()}
        keys_seen = set()
        for host in HOSTS:
            service = services[host]
            (entry,) = service["configs"]
            with open(os.path.join(DEPLOY, config_files[entry["source"]]), "rb") as f:
                config = tomllib.load(f)
            self.assertIn("--config", service["command"])
            self.assertEqual(service["command"][service["command"].index("--config") + 1],
                             entry["target"])
            mounts = named_volume_mounts(service)
            key_dir = os.path.dirname(config["key_file"])
            self.assertIn(key_dir, mounts, f"{host}: key_file {config['key_file']} not mounted")
            key_volume, read_only = mounts[key_dir]
            self.assertTrue(read_only, f"{host}: its key volume is writable")
            self.assertNotIn(key_volume, keys_seen, f"{host} shares a key volume")
            keys_seen.add(key_volume)
            self.assertIn(config["data_dir"], mounts, f"{host}: data_dir is not a volume")
            self.assertFalse(mounts[config["data_dir"]][1], f"{host}: data_dir read-only")
            self.assertEqual(config["shard_endpoint"].rsplit(":", 1)[0], host)
            self.assertEqual(service.get("hostname"), host)
            self.assertEqual(config["chain_endpoint"], f"devnet:{devnet_port}")
            self.assertEqual(config["chain_rpc_endpoint"], f"devnet:{rpc_port}")
            # The init service writes this very volume, at the path init.sh uses for it.
            init_mounts = named_volume_mounts(services["init"])
            self.assertEqual(init_mounts.get(f"/var/lib/trainshard-keys/{host}"),
                             (key_volume, False))


def cli(*args, chain=None):
    full = [harness.CLI] + (["--chain", chain] if chain else []) + list(args)
    p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    if p.returncode != 0:
        raise harness.CommandError(full, p.returncode, p.stdout, p.stderr)
    return p.stdout


class ComposeFirstStartTest(unittest.TestCase):
    """compose/init.sh and the services' commands, run here as the containers would run them,
    with every path under a folder of the test's own (TS_INIT_ROOT)."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="ts-compose-")
        self.processes = []

    def tearDown(self):
        for p in self.processes:
            p.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def run_init(self):
        env = dict(os.environ, TS_INIT_ROOT=self.root,
                   PATH=os.path.dirname(harness.CLI) + os.pathsep + os.environ["PATH"])
        p = subprocess.run(["/bin/sh", os.path.join(DEPLOY, "compose", "init.sh")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, f"init.sh exited {p.returncode}:\n{p.stdout}")
        return p.stdout

    def start(self, name, args):
        process = harness.Process(name, args, os.path.join(self.root, f"{name}.log"))
        process.start()
        self.processes.append(process)
        return process

    def test_init_then_devnet_then_hosts(self):
        document = load_compose()
        out = self.run_init()
        say(out.strip())
        keys = os.path.join(self.root, "var", "lib", "trainshard-keys")
        key_files = {host: os.path.join(keys, host, "host.key") for host in HOSTS}
        key_files["proposer"] = os.path.join(keys, "proposer", "proposer.key")
        for path in key_files.values():
            mode = stat.S_IMODE(os.stat(path).st_mode)
            self.assertEqual(mode & 0o077, 0, f"{path} has mode {oct(mode)}")
        home = os.path.join(self.root, "var", "lib", "trainshard-devnet")
        made = harness.tree_sha256(os.path.join(self.root, "var"))
        self.assertIn(os.path.join("lib", "trainshard-devnet", "genesis.json"), made)

        # A second run (a restarted project) changes nothing.
        self.run_init()
        self.assertEqual(harness.tree_sha256(os.path.join(self.root, "var")), made)

        # The devnet service's command, on free loopback ports instead of 0.0.0.0:9090 and
        # 0.0.0.0:26657.
        command = list(document["services"]["devnet"]["command"])
        self.assertEqual(command[:3], ["trainshard", "devnet", "start"])
        command[0] = harness.CLI
        command[command.index("--home") + 1] = home
        command[command.index("--listen") + 1] = "127.0.0.1:0"
        command[command.index("--rpc-listen") + 1] = "127.0.0.1:0"
        devnet = self.start("devnet", command)
        addr_file = os.path.join(home, "node.addr")

        def devnet_ready():
            if not devnet.alive():
                raise RuntimeError(f"devnet exited:\n{devnet.log_tail()}")
            rpc_file = os.path.join(home, "rpc.addr")
            return (os.path.exists(addr_file) and os.path.exists(rpc_file) and
                    harness.read_addr_file(addr_file))
        chain = harness.wait_for(devnet_ready, START_TIMEOUT_S, "the devnet to listen")
        rpc = harness.read_addr_file(os.path.join(home, "rpc.addr"))
        # The healthcheck the hosts wait for.
        health = list(document["services"]["devnet"]["healthcheck"]["test"][1:])
        health[0] = harness.CLI
        health[health.index("--chain") + 1] = chain
        subprocess.run(health, check=True, stdout=subprocess.DEVNULL, timeout=60)

        addresses = {who: json.loads(cli("--json", "keys", "show", "--key", path))["address"]
                     for who, path in key_files.items()}
        weights = json.loads(cli("--json", "weights", "show", chain=chain))
        by_host = {w["host"]: int(w["weight"]) for w in weights["weights"]}
        self.assertEqual(by_host, {addresses[h]: 100 for h in HOSTS})
        params = json.loads(cli("--json", "chain", "params", chain=chain))
        self.assertEqual(params["params"]["poc_authority"], addresses["proposer"])
        for who, address in addresses.items():
            balance = json.loads(cli("--json", "bank", "balance", "--address", address,
                                     chain=chain))
            self.assertGreater(int(balance["amount"]), 0, who)

        # Each host on its own compose config: only what names the containers' network changes
        # (the chain's and the shard endpoint's hosts) and the folders, moved under the root.
        configs = document["configs"]
        hosts = {}
        for host in HOSTS:
            (entry,) = document["services"][host]["configs"]
            with open(os.path.join(DEPLOY, configs[entry["source"]]["file"])) as f:
                text = f.read()
            text = re.sub(r'(?m)^chain_endpoint = ".*"$', f'chain_endpoint = "{chain}"', text)
            text = re.sub(r'(?m)^chain_rpc_endpoint = ".*"$', f'chain_rpc_endpoint = "{rpc}"',
                          text)
            text = re.sub(r'(?m)^shard_endpoint = ".*"$',
                          f'shard_endpoint = "127.0.0.1:{harness.free_port()}"', text)
            text = text.replace('"/var/lib/trainshard-key/', f'"{keys}/{host}/')
            data_dir = os.path.join(self.root, "var", "lib", "trainshard-hosts", host)
            text = text.replace('data_dir = "/var/lib/trainshardd"', f'data_dir = "{data_dir}"')
            self.assertNotIn('"/var/lib/', text, f"{host}: a path left unmoved")
            config = os.path.join(self.root, f"{host}.toml")
            with open(config, "w") as f:
                f.write(text)
            command = list(document["services"][host]["command"])
            command[0] = harness.DAEMON
            command[command.index("--config") + 1] = config
            hosts[host] = (self.start(host, command), data_dir)

        for host, (process, data_dir) in hosts.items():
            def status():
                if not process.alive():
                    raise RuntimeError(f"{host} exited:\n{process.log_tail()}")
                if not os.path.exists(os.path.join(data_dir, "operator.addr")):
                    return None
                s = json.loads(cli("--json", "host", "status", "--host", data_dir))
                return s if int(s.get("current_weight", "0")) > 0 else None
            s = harness.wait_for(status, START_TIMEOUT_S, f"{host} to follow the chain")
            self.assertEqual(s["address"], addresses[host])
            self.assertEqual(int(s["current_weight"]), 100)
            say(f"{host}: {s['address']} follows {s['chain_id']}, weight {s['current_weight']}")

        for process, _ in hosts.values():
            process.proc.send_signal(signal.SIGTERM)
            self.assertEqual(process.proc.wait(timeout=30), 0, process.log_tail())
        devnet.proc.send_signal(signal.SIGTERM)
        self.assertEqual(devnet.proc.wait(timeout=30), 0, devnet.log_tail())


if __name__ == "__main__":
    unittest.main(verbosity=2)
