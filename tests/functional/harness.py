"""Multi-process test harness: a devnet node, host sidecars and the CLI, started for real.

Every process is a real binary from the build directory, on 127.0.0.1 with ephemeral ports
(each process writes its bound address to a file); every key is a real secp256k1 key made by
`trainshard keys new`. Used by the functional, crash, determinism and artifact suites, the demo
and the artifact benchmark.

A host may run inside a network namespace (netns.Topology): its trainshardd is started through
`ip netns exec`, every listener binds the namespace's own address, and the devnet listens on the
bridge address (Network(listen_ip=...)), so the CLI in the root namespace reaches everything.
"""

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time

BUILD_DIR = os.environ.get(
    "TS_BUILD_DIR",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build"))
CLI = os.path.join(BUILD_DIR, "sidecar", "cli", "trainshard")
DAEMON = os.path.join(BUILD_DIR, "sidecar", "host", "trainshardd")


class CommandError(Exception):
    def __init__(self, args, code, stdout, stderr):
        super().__init__(f"{' '.join(args)} exited {code}: {stderr.strip()[:2000]}")
        self.code = code
        self.stdout = stdout
        self.stderr = stderr


def wait_for(predicate, timeout_s, what, interval_s=0.1):
    """Polls predicate() until it returns a truthy value; raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (CommandError, OSError, ValueError, KeyError) as e:
            last_error = e
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}; last error: {last_error}")


def free_port():
    """A port the kernel just handed out; reused for restarts so peers keep their address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def b64_to_hex(b64):
    """A protobuf-JSON bytes field (base64) as hex."""
    return base64.b64decode(b64).hex()


def tree_sha256(root):
    """{relative name: (size, SHA-256 hex)} of every regular file under root, hashed here with
    hashlib (independently of the project's code). Anything but directories and regular files
    (links, FIFOs, devices, sockets) raises ValueError."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path}: not a regular file (mode {oct(st.st_mode)})")
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while True:
                    block = f.read(1 << 20)
                    if not block:
                        break
                    h.update(block)
            out[os.path.relpath(path, root)] = (st.st_size, h.hexdigest())
    return out


def write_random_files(root, sizes):
    """Writes {relative name: size} files of random bytes under root; returns {name: bytes}."""
    files = {}
    for name, size in sizes.items():
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = os.urandom(size)
        with open(path, "wb") as f:
            f.write(data)
        files[name] = data
    return files


def chunk_hashes(files, chunk_size):
    """Distinct SHA-256 hex of the fixed-size chunks of {name: bytes} (the store's file names)."""
    out = set()
    for data in files.values():
        for off in range(0, len(data), chunk_size):
            out.add(hashlib.sha256(data[off:off + chunk_size]).hexdigest())
    return out


def read_addr_file(path):
    with open(path) as f:
        addr = f.read().strip()
    if not addr:
        raise ValueError(f"{path} is empty")
    return addr


class Process:
    """A child process with its log file; killed with real signals."""

    def __init__(self, name, args, log_path):
        self.name = name
        self.args = args
        self.log_path = log_path
        self.proc = None

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, n=40):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


class Host:
    """One host: a key, a trainshardd with its data dir, and its operator address."""

    def __init__(self, net, name, address, key_file, profile="cpu-small", auto_reserve=True,
                 ip="127.0.0.1", exec_prefix=(), extra_config=None, shard_listen=False):
        """ip: the address every listener of this host binds (its namespace's address when
        exec_prefix enters one). extra_config: top-level config lines, {key: TOML value}.
        shard_listen: write shard_listen = shard_endpoint (else the daemon's default, every
        address on the endpoint's port)."""
        self.net = net
        self.name = name
        self.address = address
        self.key_file = key_file
        self.dir = os.path.join(net.root, name)
        self.data_dir = os.path.join(self.dir, "data")
        self.config = os.path.join(self.dir, "trainshardd.toml")
        self.profile = profile
        self.auto_reserve = auto_reserve
        self.process = None
        self.operator = None
        self.ip = ip
        self.exec_prefix = list(exec_prefix)
        self.extra_config = dict(extra_config or {})
        # Chosen once, so a restarted host keeps the endpoint its reservations advertise.
        self.shard_port = free_port()
        self.shard_endpoint = f"{ip}:{self.shard_port}"
        if shard_listen:
            self.extra_config.setdefault("shard_listen", f'"{self.shard_endpoint}"')

    def write_config(self):
        os.makedirs(self.dir, exist_ok=True)
        with open(self.config, "w") as f:
            f.write(f'chain_endpoint = "{self.net.chain}"\n'
                    f'chain_rpc_endpoint = "{self.net.rpc_endpoint}"\n'
                    f'listen = "{self.ip}:0"\n'
                    f'key_file = "{self.key_file}"\n'
                    f'data_dir = "{self.data_dir}"\n'
                    f'shard_endpoint = "{self.shard_endpoint}"\n'
                    f'poll_interval_ms = 100\n')
            # The operator API publishes from and writes to folders under the network's root
            # (never the data dirs or key files in it).
            self.extra_config.setdefault("files_root", f'"{self.net.root}"')
            self.extra_config.setdefault("stats_listen", f'"{self.ip}:0"')
            for key, value in self.extra_config.items():
                f.write(f'{key} = {value}\n')
            f.write(f'[policy]\n'
                    f'auto_reserve = {"true" if self.auto_reserve else "false"}\n'
                    f'hardware_profiles = ["{self.profile}"]\n'
                    f'max_shards = 100\n'
                    f'min_escrow_per_node = "0"\n')

    def start(self):
        self.write_config()
        addr_file = os.path.join(self.data_dir, "operator.addr")
        for stale in (addr_file, self.shard_addr_file(), self.stats_addr_file()):
            if os.path.exists(stale):
                os.unlink(stale)
        self.process = Process(self.name,
                               self.exec_prefix + [DAEMON, "--config", self.config],
                               os.path.join(self.dir, "trainshardd.log"))
        self.process.start()
        self.operator = wait_for(lambda: self._addr(addr_file), 30, f"{self.name} to listen")

    def _addr(self, addr_file):
        if not self.process.alive():
            raise RuntimeError(f"{self.name} exited:\n{self.process.log_tail()}")
        return read_addr_file(addr_file) if os.path.exists(addr_file) else None

    def shard_addr_file(self):
        return os.path.join(self.data_dir, "shard.addr")

    def stats_addr_file(self):
        return os.path.join(self.data_dir, "stats.addr")

    def stats_url(self, timeout_s=30):
        """http://host:port of the stats page, /metrics and /api/v1/overview."""
        path = self.stats_addr_file()
        addr = wait_for(lambda: self._addr(path), timeout_s, f"{self.name} to serve its stats")
        return f"http://{addr}"

    def wait_shard_listen(self, timeout_s=30):
        """The bound peer-facing (shard_listen) address, once the daemon has written it."""
        path = self.shard_addr_file()
        return wait_for(lambda: self._addr(path), timeout_s, f"{self.name} to serve peers")

    def store_dir(self, shard_id):
        """The host's artifact store of a shard (default artifacts_dir)."""
        return os.path.join(self.data_dir, "artifacts", str(shard_id))

    def chunk_files(self, shard_id):
        """Paths of the chunk files in the shard's store (chunks/<2 hex>/<64 hex>)."""
        root = os.path.join(self.store_dir(shard_id), "chunks")
        found = []
        try:
            subdirs = os.listdir(root)
        except FileNotFoundError:
            return found
        for sub in subdirs:
            path = os.path.join(root, sub)
            # A planted symlink is not descended into: it is not part of the store.
            if os.path.islink(path) or not os.path.isdir(path):
                continue
            try:
                found += [os.path.join(path, n) for n in os.listdir(path)]
            except FileNotFoundError:
                pass
        return found

    def status(self):
        return self.net.cli("host", "status", "--host", self.operator)

    def events(self):
        return self.net.cli("host", "events", "--host", self.operator, "--from", "1")["events"]

    def shards(self):
        return self.net.cli("host", "shards", "--host", self.operator)


class Network:
    """A devnet chain plus hosts under one temporary directory."""

    def __init__(self, root=None, chain_id="trainshard-devnet-1", block_interval_ms=200,
                 voting_period=20, host_weights=(100, 80, 60), keep=False,
                 listen_ip="127.0.0.1", min_gas_price="0"):
        self.root = root or tempfile.mkdtemp(prefix="ts-net-")
        self.keep = keep
        self.chain_id = chain_id
        self.block_interval_ms = block_interval_ms
        self.voting_period = voting_period
        self.min_gas_price = min_gas_price
        self.home = os.path.join(self.root, "devnet")
        self.chain = None
        self.devnet = None
        self.hosts = []
        self.host_weights = host_weights
        self.keys = {}
        self.listen_ip = listen_ip
        self.devnet_port = free_port()
        self.rpc_port = free_port()
        # The node's CometBFT JSON-RPC; the hosts read the chain's events through it.
        self.rpc_endpoint = f"{self.listen_ip}:{self.rpc_port}"
        # While nodes are being killed, a CLI call that cannot reach them (exit 3) is retried
        # for this long.
        self.retry_unreachable_s = 0

    # -- CLI -----------------------------------------------------------------------------------
    def cli(self, *args, key=None, check=True, json_out=True, timeout=60):
        cmd = [CLI]
        if self.chain:
            cmd += ["--chain", self.chain]
        if key:
            cmd += ["--key", self.keys[key]["file"] if key in self.keys else key]
        if json_out:
            cmd += ["--json"]
        cmd += list(args)
        deadline = time.monotonic() + self.retry_unreachable_s
        while True:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if r.returncode != 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if check and r.returncode != 0:
            raise CommandError(cmd, r.returncode, r.stdout, r.stderr)
        if not json_out:
            return r
        if not check:
            return r
        return json.loads(r.stdout) if r.stdout.strip() else {}

    def artifact(self, host, command, *args, check=True, timeout=120):
        """`trainshard artifact <command> --host <host's operator> args` with --json."""
        return self.cli("artifact", command, "--host", host.operator, *args, check=check,
                        timeout=timeout)

    def artifact_popen(self, host, command, *args):
        """The same, started in the background (stdout and stderr to pipes)."""
        cmd = [CLI, "--chain", self.chain, "--json", "artifact", command, "--host",
               host.operator, *args]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)

    def new_key(self, name):
        path = os.path.join(self.root, "keys", f"{name}.key")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out = self.cli("keys", "new", "--out", path)
        self.keys[name] = {"file": path, "address": out["address"]}
        return self.keys[name]

    def address(self, name):
        return self.keys[name]["address"]

    # -- set-up --------------------------------------------------------------------------------
    def init(self, extra_accounts=()):
        for name in ["creator", "authority", "outsider"] + [f"host{i}" for i in
                                                            range(1, len(self.host_weights) + 1)]:
            self.new_key(name)
        for name in extra_accounts:
            self.new_key(name)
        args = ["devnet", "init", "--home", self.home, "--chain-id", self.chain_id,
                "--poc-authority", self.address("authority"),
                "--voting-period", str(self.voting_period), "--epoch-length", "1000000",
                "--min-deposit", "1000", "--min-gas-price", self.min_gas_price]
        for name in self.keys:
            args += ["--account", f"{self.address(name)}=1000000000"]
        for i, w in enumerate(self.host_weights, start=1):
            args += ["--weight", f"{self.address(f'host{i}')}={w}"]
        self.cli(*args)

    def start_devnet(self):
        addr_file = os.path.join(self.home, "node.addr")
        for stale in (addr_file, os.path.join(self.home, "rpc.addr")):
            if os.path.exists(stale):
                os.unlink(stale)
        self.devnet = Process("devnet", [CLI, "devnet", "start", "--home", self.home,
                                         "--listen", f"{self.listen_ip}:{self.devnet_port}",
                                         "--rpc-listen", f"{self.listen_ip}:{self.rpc_port}",
                                         "--block-interval-ms", str(self.block_interval_ms)],
                              os.path.join(self.root, "devnet.log"))
        self.devnet.start()

        def ready():
            if not self.devnet.alive():
                raise RuntimeError(f"devnet exited:\n{self.devnet.log_tail()}")
            rpc_file = os.path.join(self.home, "rpc.addr")
            if not (os.path.exists(addr_file) and os.path.exists(rpc_file)):
                return None
            return read_addr_file(addr_file)
        self.chain = wait_for(ready, 30, "devnet to listen")
        return self.chain

    def add_hosts(self, **kwargs):
        for i in range(1, len(self.host_weights) + 1):
            host = Host(self, f"host{i}", self.address(f"host{i}"), self.keys[f"host{i}"]["file"],
                        **kwargs)
            self.hosts.append(host)
            host.start()
        return self.hosts

    def add_host(self, name, key_name=None, start=True, **kwargs):
        """One host named `name` with key `key_name` (default `name`); kwargs go to Host."""
        key_name = key_name or name
        host = Host(self, name, self.address(key_name), self.keys[key_name]["file"], **kwargs)
        self.hosts.append(host)
        if start:
            host.start()
        return host

    def replay(self):
        """Re-executes the stored blocks from genesis (the node must be stopped)."""
        return self.cli("devnet", "replay", "--home", self.home, check=False)

    def stop(self):
        for h in self.hosts:
            if h.process:
                h.process.stop()
        if self.devnet:
            self.devnet.stop()

    def cleanup(self):
        self.stop()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- chain helpers -------------------------------------------------------------------------
    def height(self):
        return int(self.cli("chain", "status")["latest_height"])

    def wait_height(self, h, timeout_s=60):
        return wait_for(lambda: self.height() >= h, timeout_s, f"height {h}")

    def shard(self, shard_id):
        return self.cli("shard", "status", "--id", str(shard_id))

    def wait_shard_status(self, shard_id, status, timeout_s=60):
        return wait_for(lambda: self.shard(shard_id)["status"] == status, timeout_s,
                        f"shard {shard_id} to be {status}")

    def balance(self, address):
        return int(self.cli("bank", "balance", "--address", address)["amount"])

    def chain_events(self, from_h, to_h):
        return self.cli("chain", "events", "--from", str(from_h), "--to", str(to_h))["events"]

    def write_run_spec(self, name, **overrides):
        """A run spec document (docs/training.md) for a small GPT on a few fortune files;
        `overrides` replace top-level fields. Returns its path."""
        spec = {
            "version": 1,
            "model": {"kind": "gpt", "seed": "7",
                      "config": {"layers": 2, "dModel": 64, "heads": 4, "context": 32,
                                 "vocab": 384, "mlpRatio": 4}},
            "data": {"corpus": "fortunes", "files": 6, "vocab": 384, "shardTokens": 16384,
                     "evalEvery": 20},
            "rounds": 6, "innerSteps": 12, "batchSize": 8,
            "inner": {"lr": 0.004, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                      "weightDecay": 0.01, "gradClipNorm": 1.0},
            "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True},
            "codec": "fp32", "aggregation": "mean", "evalEvery": 3, "evalBatchSize": 16,
            "evalWindowsMax": "64", "seed": "11", "joinWindowMs": 1500,
            "plannerTimeoutMs": 2500, "exchangeTimeoutMs": 30000,
        }
        spec.update(overrides)
        path = os.path.join(self.root, f"{name}.run.json")
        with open(path, "w") as f:
            json.dump(spec, f, indent=1)
        return path

    def write_spec(self, name, *, min_nodes=2, max_nodes=3, escrow=300000, min_host_weight=10,
                   max_duration=400, window=100, profile="cpu-small", bps=5000,
                   quota_bytes=1 << 30, quota_files=10000, run_spec=None):
        """The shard spec; with `run_spec` (a path), its run_spec_hash pins that document."""
        if run_spec is not None:
            with open(run_spec, "rb") as f:
                run_hash = hashlib.sha256(f.read()).digest()
        else:
            run_hash = hashlib.sha256(name.encode()).digest()
        spec = {
            "run_spec_hash": base64.b64encode(run_hash).decode(),
            "hardware_profile": profile,
            "min_nodes": min_nodes,
            "max_nodes": max_nodes,
            "min_host_weight": str(min_host_weight),
            "max_duration_blocks": str(max_duration),
            "escrow": {"denom": "ngonka", "amount": str(escrow)},
            "artifact_quota": {"bytes_max": str(quota_bytes), "files_max": str(quota_files)},
            "reward_policy": {"kind": "KIND_VERIFIED_WORK", "max_host_share_bps": bps},
            "reservation_window_blocks": str(window),
        }
        path = os.path.join(self.root, f"{name}.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def start_run(self, host, shard_id, run_spec):
        return self.cli("shard", "run", "--id", shard_id, "--run-spec", run_spec, "--host",
                        host.operator)

    def train_status(self, host, shard_id, check=True):
        """The host's run status (JSON); with check=False, {} when the host does not answer."""
        r = self.cli("shard", "train-status", "--id", shard_id, "--host", host.operator,
                     check=check)
        if check:
            return r
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}

    def propose_and_pass(self, spec_path, voters=("host1", "host2", "host3"), run_spec=None):
        """Submits a shard proposal from `creator`, votes yes, returns (proposal_id, shard_id).
        With `run_spec` (a path), the proposal carries that document on chain and the hosts
        start the run by themselves once the shard is RUNNING."""
        extra = ("--run-spec", run_spec) if run_spec is not None else ()
        out = self.cli("proposal", "submit", "--spec", spec_path, "--deposit", "1000",
                       "--title", "shard", "--wait", *extra, key="creator")
        pid, sid = out["proposal_id"], out["shard_id"]
        for v in voters:
            self.cli("proposal", "vote", "--id", pid, "--option", "yes", "--wait", key=v)
        return pid, sid
