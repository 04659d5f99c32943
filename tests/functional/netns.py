"""Linux network namespaces for multi-host tests on one machine (run as root).

A Topology is one bridge in the root namespace plus one namespace per host, each joined to the
bridge by a veth pair:

    root namespace:  bridge tsn<pid>br, 10.<x>.0.1/24         (the devnet listens here)
    host i:          namespace tsn<pid>-<name>, eth0 10.<x>.0.<i+2>/24, lo up
                     (its veth's other end, tsn<pid>v<i>, is on the bridge)

so every host has its own address, reaches every other host and the bridge address, and the root
namespace (where the CLI runs) reaches every host. Names carry the test's pid, so concurrent runs
do not collide, and a run killed before it could clean up is reaped by the next one (`reap_stale`).

Rate limits are token bucket filters on a host's eth0, i.e. on what that host sends (the egress
of a serving host). netem is not available on the test machines; latency and loss would need a
user-space proxy.

Not thread-safe: one Topology is set up and torn down by one thread.
"""

import atexit
import os
import re
import signal
import subprocess
import time

# Namespaces of this module are named tsn<pid>-<host>, links tsn<pid>br and tsn<pid>v<i>
# (interface names must fit in 15 bytes).
_NS_RE = re.compile(r"^tsn(\d+)-")
_LINK_RE = re.compile(r"^tsn(\d+)(br|v\d+)$")

# tbf parameters that let one TCP stream reach the configured rate (measured on the project's
# machines with a Python sender: 32 KiB/50 ms -> 95.7 Mbit/s of goodput at 100mbit, 1 MiB/100 ms
# -> 97.2; the rest of the link rate is Ethernet/IP/TCP headers, 1448 of every 1514 bytes are
# payload at MTU 1500). The burst must hold at least one GSO segment (64 KiB) or tbf drops it.
DEFAULT_BURST = "256kb"
DEFAULT_LATENCY = "100ms"


def _run(args, check=True):
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def require_root():
    """Raises (the suites fail, never skip) unless running as root with ip and tc present."""
    if os.geteuid() != 0:
        raise PermissionError("network namespace tests must run as root (ip netns, tc)")
    for tool in ("ip", "tc"):
        if _run(["which", tool], check=False).returncode != 0:
            raise FileNotFoundError(f"{tool} (iproute2) is not installed")


def list_namespaces():
    r = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def list_links():
    r = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns):
    """SIGKILLs what still runs in namespace `ns` (only processes this module's runs started)."""
    r = _run(["ip", "netns", "pids", ns], check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def reap_stale():
    """Deletes namespaces and links left by runs of this module whose process is gone."""
    reaped = []
    for ns in list_namespaces():
        m = _NS_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace_processes(ns)
            _run(["ip", "netns", "del", ns], check=False)
            reaped.append(ns)
    for link in list_links():
        m = _LINK_RE.match(link)
        if m and not _pid_alive(int(m.group(1))):
            _run(["ip", "link", "del", link], check=False)
            reaped.append(link)
    return reaped


def leftovers(pid=None):
    """Namespaces and links of run `pid` (default: this process) that still exist."""
    pid = os.getpid() if pid is None else pid
    found = [ns for ns in list_namespaces() if ns.startswith(f"tsn{pid}-")]
    found += [link for link in list_links()
              if _LINK_RE.match(link) and _LINK_RE.match(link).group(1) == str(pid)]
    return found


def wait_gone(pid=None, timeout_s=10):
    """Leftovers of run `pid` after destroy(), waiting for the kernel's asynchronous teardown of
    a namespace's interfaces; [] when everything is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = leftovers(pid)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _used_subnets():
    r = _run(["ip", "-o", "-4", "addr", "show"], check=False)
    used = set()
    for m in re.finditer(r"inet 10\.(\d+)\.", r.stdout):
        used.add(int(m.group(1)))
    return used


_SIGNALS_INSTALLED = False


def _install_signal_handlers():
    """SIGTERM/SIGHUP (a timeout, a closed terminal) unwind like Ctrl-C: finally blocks and
    atexit handlers run. KeyboardInterrupt, not SystemExit, because unittest records the latter
    as one test's error and goes on with the next."""
    global _SIGNALS_INSTALLED
    if _SIGNALS_INSTALLED:
        return
    _SIGNALS_INSTALLED = True

    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, handler)


class Topology:
    """A bridge and one namespace per host name; destroy() (also run at exit) removes them."""

    def __init__(self, names):
        require_root()
        reap_stale()
        if len(names) > 200:
            raise ValueError(f"names: {len(names)} hosts do not fit one /24")
        self.pid = os.getpid()
        self.prefix = f"tsn{self.pid}"
        if len(self.prefix) + 4 > 15:
            raise ValueError(f"pid {self.pid} too long for interface names")
        self.names = list(names)
        used = _used_subnets()
        x = next((c for c in [100 + (self.pid + i) % 150 for i in range(150)] if c not in used),
                 None)
        if x is None:
            raise RuntimeError("no free 10.<x>.0.0/24 subnet")
        self.subnet = x
        self.bridge = f"{self.prefix}br"
        self.bridge_ip = f"10.{x}.0.1"
        self.ns = {n: f"{self.prefix}-{n}" for n in self.names}
        self.ip = {n: f"10.{x}.0.{i + 2}" for i, n in enumerate(self.names)}
        self.veth = {n: f"{self.prefix}v{i}" for i, n in enumerate(self.names)}
        self.shaped = {}
        self._created = False
        _install_signal_handlers()
        atexit.register(self.destroy)

    def create(self):
        self._created = True
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            for n in self.names:
                ns = self.ns[n]
                _run(["ip", "netns", "add", ns])
                _run(["ip", "link", "add", self.veth[n], "type", "veth", "peer", "name", "eth0",
                      "netns", ns])
                _run(["ip", "link", "set", self.veth[n], "master", self.bridge, "up"])
                _run(["ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.ip[n]}/24", "dev",
                      "eth0"])
                _run(["ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up"])
                _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        except Exception:
            self.destroy()
            raise
        return self

    def prefix_args(self, name):
        """Command prefix that runs a program inside host `name`'s namespace (exec, no shell:
        the pid stays the program's, so signals reach it directly)."""
        return ["ip", "netns", "exec", self.ns[name]]

    def shape(self, name, rate_mbit, burst=DEFAULT_BURST, latency=DEFAULT_LATENCY):
        """Limits what host `name` sends to rate_mbit (10^6 bit/s) with a tbf on its eth0."""
        _run(self.prefix_args(name) + ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                                       "rate", f"{rate_mbit}mbit", "burst", burst, "latency",
                                       latency])
        self.shaped[name] = rate_mbit

    def unshape(self, name):
        _run(self.prefix_args(name) + ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        self.shaped.pop(name, None)

    def qdisc(self, name):
        return _run(self.prefix_args(name) + ["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout

    def rx_bytes(self, name):
        """Bytes (Ethernet frames) host `name` has received: its veth's root end transmits them."""
        with open(f"/sys/class/net/{self.veth[name]}/statistics/tx_bytes") as f:
            return int(f.read())

    def tx_bytes(self, name):
        with open(f"/sys/class/net/{self.veth[name]}/statistics/rx_bytes") as f:
            return int(f.read())

    def destroy(self):
        """Idempotent. Kills what still runs in the namespaces, deletes them and the bridge."""
        if not self._created or os.getpid() != self.pid:
            return
        for n in self.names:
            ns = self.ns[n]
            if ns in list_namespaces():
                _kill_namespace_processes(ns)
                _run(["ip", "netns", "del", ns], check=False)
        links = list_links()
        for n in self.names:
            if self.veth[n] in links:
                _run(["ip", "link", "del", self.veth[n]], check=False)
        if self.bridge in links:
            _run(["ip", "link", "del", self.bridge], check=False)
        self._created = False
