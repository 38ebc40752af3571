"""A simulated mediasrv fleet on one machine: Linux network namespaces joined by a bridge.

    scripts/cluster up [--balance hash|round-robin] [--log-dir DIR]   # foreground until SIGTERM/^C
    scripts/cluster status                                            # the clusters of this machine
    scripts/cluster down                                              # stop them all

Every host is a network namespace with one veth into a bridge that lives in a namespace of
its own; the root namespace joins the bridge through one more veth, so this process (the
tests' client) reaches every host by address and can send from many client addresses
(``Cluster.client_addresses``). Nothing listens on the machine's own interfaces.

    root   10.213.N.1 (+ .100-.163)  the client(s)
    lb     10.213.N.2:80    nginx over the application hosts (hash $remote_addr consistent,
                            or round robin); retries the next host on connection errors and
                            502 for idempotent requests
    data   10.213.N.10      mongoeco :27017 (MongoDB wire protocol; data in memory, or with
                            durable_mongo in a SQLite file, so it can be stopped and started
                            again: 3-5x slower) and moto's S3 server :9000
    app1   10.213.N.11:80   scripts/serve-behind-nginx --workers 2 (nginx + 2 mediasrv)
    app2   10.213.N.12:80   the same; both share MEDIASRV_JWT_SECRET and the data host

Names start with ``mscl<pid>`` (namespaces ``mscl<pid>-<host>``, the root veth ``mscl<pid>``);
a cluster whose owner process is gone (killed with SIGKILL, machine crash) is removed by name
at the next start, ``status`` or ``down``. A cluster stops on exit, on an exception, and (when
started from the main thread) on SIGTERM, which is turned into KeyboardInterrupt so every
``finally`` runs; its children also get SIGTERM when the owner dies (PR_SET_PDEATHSIG).
Each host's logs are under ``log_dir/<host>/``; ``log_tails()`` gives their last lines.

Needs root, iproute2 (``ip netns``), Debian's nginx, and Python 3.13 for mongoeco (see
tests/backends/servers.py). Stdlib only, plus the venv's moto_server and mediasrv.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mediasrv.cli.sidecar.orphans import children_of
from tests.backends import servers
from tests.cluster import balancer
from tests.cluster.netns import (
    PREFIX,
    bound_to_owner,
    claim,
    clean_stale,
    free_subnet,
    http_status,
    in_netns,
    ip,
    kill_netns,
    remove,
    run_dir,
    spawn,
    tail,
    wait_gone,
)

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = ROOT / "scripts" / "serve-behind-nginx"
VENV_BIN = Path(sys.executable).parent
MONGO_PORT, S3_PORT, HTTP_PORT = 27017, 9000, 80
CLIENT_ADDRESSES = 64
"""Extra source addresses of the root namespace (10.213.N.100 upwards), one per simulated client."""
READY_S = 120.0
"""An application host: 2 mediasrv processes (on 2 shared cores) and nginx, all answering."""
STOP_S = 25.0
"""serve-behind-nginx stops within 20 s (nginx drains 8 s, then the processes); then SIGKILL."""
BALANCING = tuple(balancer.METHODS)
FLEET_DATABASE, FLEET_BUCKET = "fleet", "fleet"


# ---------------------------------------------------------------------------- hosts

@dataclass
class Host:
    name: str
    ns: str
    address: str
    log_dir: Path
    home: Path
    """Its own files (data directory, nginx's temp directory), under the run directory."""

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """A command inside this host's namespace (``ip netns exec``)."""
        return subprocess.run(in_netns(self.ns, argv), capture_output=True, text=True, check=False, **kwargs)


@dataclass
class AppHost(Host):
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.log_dir / "serve.log"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def origin_ports(self) -> list[int]:
        """The mediasrv processes' loopback ports, from the nginx.conf serve-behind-nginx rendered."""
        confs = sorted((self.home / "tmp").glob("mediasrv-nginx-*/nginx.conf"), key=lambda p: p.stat().st_mtime)
        if not confs:
            return []
        return [int(p) for p in re.findall(r"server 127\.0\.0\.1:(\d+) max_fails", confs[-1].read_text())]


# ---------------------------------------------------------------------------- the cluster

class Cluster:
    """The fleet: ``with Cluster() as c: c.lb.url, c.apps[0].url, c.data.address ...``."""

    def __init__(self, *, balance: str = "hash", workers: int = 2, env: dict[str, str] | None = None,
                 log_dir: Path | None = None, durable_mongo: bool = False) -> None:
        if balance not in BALANCING:
            raise ValueError(f"balance must be one of {BALANCING}")
        self.balance, self.workers, self.extra_env = balance, workers, dict(env or {})
        self.durable_mongo = durable_mongo
        """mongoeco keeps its data in a SQLite file (it survives ``stop_mongo``), else in memory."""
        self.pid = os.getpid()
        self.run_dir = run_dir(self.pid)
        self.log_dir = Path(log_dir) if log_dir else self.run_dir / "logs"
        self.net = free_subnet()
        hosts = list(self.net.hosts())
        self.root_address = str(hosts[0])
        self.client_addresses = [str(hosts[99 + i]) for i in range(CLIENT_ADDRESSES)]
        self.link = f"{PREFIX}{self.pid}"
        self.bridge_ns = f"{PREFIX}{self.pid}-net"
        self.jwt_secret = secrets.token_urlsafe(32)

        def host(name: str, last: int, cls: type[Host] = Host) -> Any:
            return cls(name=name, ns=f"{PREFIX}{self.pid}-{name}", address=str(hosts[last - 1]),
                       log_dir=self.log_dir / name, home=self.run_dir / name)

        self.lb: Host = host("lb", 2)
        self.data: Host = host("data", 10)
        self.apps: list[AppHost] = [host(f"app{i + 1}", 11 + i, AppHost) for i in range(2)]
        self.mongo: servers.Proc | None = None
        self.s3: servers.Proc | None = None
        self.lb_proc: subprocess.Popen[bytes] | None = None
        self._namespaces: list[str] = []
        self._old_sigterm: Any = None
        self._lock_fd: int | None = None
        self._data_argv: dict[str, list[str]] = {}

    # --- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _interrupt)
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._lock_fd = claim(self.pid)
        clean_stale()
        for d in (self.run_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.build_network()
        self.start_data()
        for app in self.apps:
            app.env = self.app_env(app)
            self.spawn_app(app)
        for app in self.apps:
            self.wait_app(app)
        self.start_lb()
        self.write_state()

    def stop(self) -> None:
        """Everything down, whatever state it is in: balancer, applications, data, network, files."""
        if self._old_sigterm is not None:  # a second SIGTERM must not cut the teardown short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if self._lock_fd is not None:  # else never claimed (or already stopped): nothing of ours
                self._teardown()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None

    def _teardown(self) -> None:
        assert self._lock_fd is not None
        with contextlib.suppress(Exception):
            self._stop_lb()
        for app in self.apps:  # all of them at once: each drains in parallel
            if app.proc is not None and app.proc.poll() is None:
                app.proc.send_signal(signal.SIGTERM)
        for app in self.apps:
            with contextlib.suppress(Exception):
                self.stop_app(app)
        for proc in (self.mongo, self.s3):
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stop()
        remove(self.pid, self._namespaces)
        self._namespaces = []
        os.close(self._lock_fd)
        self._lock_fd = None

    def build_network(self) -> None:
        """The bridge namespace, one veth per host into it, and the root namespace's veth."""
        self._add_ns(self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        prefix = self.net.prefixlen
        for h in (self.lb, self.data, *self.apps):
            self._add_ns(h.ns)
            port = f"v-{h.name}"
            ip("-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
            ip("-n", self.bridge_ns, "link", "set", port, "master", "br0", "up")
            ip("-n", h.ns, "addr", "add", f"{h.address}/{prefix}", "dev", "eth0")
            ip("-n", h.ns, "link", "set", "eth0", "up")
        ip("link", "add", self.link, "type", "veth", "peer", "name", "v-root", "netns", self.bridge_ns)
        ip("-n", self.bridge_ns, "link", "set", "v-root", "master", "br0", "up")
        ip("addr", "add", f"{self.root_address}/{prefix}", "dev", self.link)
        for address in self.client_addresses:
            ip("addr", "add", f"{address}/{prefix}", "dev", self.link)
        ip("link", "set", self.link, "up")

    def _add_ns(self, ns: str) -> None:
        ip("netns", "add", ns)
        self._namespaces.append(ns)
        ip("-n", ns, "link", "set", "lo", "up")

    def write_state(self) -> None:
        state = {"pid": self.pid, "balance": self.balance, "log_dir": str(self.log_dir),
                 "balancer": self.lb.url, "data": self.data.address, "mongodb_url": self.mongodb_url,
                 "s3_endpoint": self.s3_endpoint, "apps": [a.url for a in self.apps],
                 "namespaces": self._namespaces}
        (self.run_dir / "cluster.json").write_text(json.dumps(state, indent=2) + "\n")

    # --- data host --------------------------------------------------------------------

    @property
    def mongodb_url(self) -> str:
        return f"mongodb://{self.data.address}:{MONGO_PORT}/{FLEET_DATABASE}?directConnection=true"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.data.address}:{S3_PORT}"

    def start_data(self) -> None:
        python = servers.mongoeco_python()
        if python is None:
            raise RuntimeError("mongoeco needs Python 3.13 (pyenv or python3.13); not found")
        self.data.home.mkdir(parents=True, exist_ok=True)
        self.data.log_dir.mkdir(parents=True, exist_ok=True)
        self.mongo = servers.mongoeco_server(python, MONGO_PORT, self.data.address,
                                             self.data.home / "mongo.sqlite" if self.durable_mongo else None)
        self.s3 = servers.moto_server(S3_PORT, self.data.address)
        self._data_argv = {}
        for proc, log in ((self.mongo, "mongo.log"), (self.s3, "s3.log")):
            self._data_argv[log] = in_netns(self.data.ns, proc.argv)
            proc.log_path = self.data.log_dir / log
        self.start_mongo()
        self.s3.argv = bound_to_owner(self._data_argv["s3.log"])
        self.s3.start()

    def start_mongo(self) -> None:
        """mongoeco on its port again (its data in the SQLite file when ``durable_mongo``)."""
        assert self.mongo is not None
        self.mongo.argv = bound_to_owner(self._data_argv["mongo.log"])
        self.mongo.start()

    def stop_mongo(self) -> None:
        """SIGTERM to mongoeco (its data stays in the SQLite file); ``start_mongo`` brings it back."""
        assert self.mongo is not None
        self.mongo.stop()

    def set_link(self, host: Host, up: bool) -> None:
        """Unplug (or plug back) a host's cable: its veth's bridge end goes down, packets are dropped."""
        ip("-n", self.bridge_ns, "link", "set", f"v-{host.name}", "up" if up else "down")

    # --- application hosts ------------------------------------------------------------

    def app_env(self, app: AppHost) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIASRV_", "AWS_"))}
        env.update({
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
            "TMPDIR": str(app.home / "tmp"),
            "MEDIASRV_DATA_DIR": str(app.data_dir),
            "MEDIASRV_PUBLIC_URL": self.lb.url,
            "MEDIASRV_MONGODB_URL": self.mongodb_url,
            "MEDIASRV_S3_BUCKET": FLEET_BUCKET,
            "MEDIASRV_S3_ENDPOINT_URL": self.s3_endpoint,
            "MEDIASRV_JWT_SECRET": self.jwt_secret,
            "MEDIASRV_NGINX_REAL_IP_FROM": self.lb.address,
            "MEDIASRV_NGINX_WORKERS": "1",
            "MEDIASRV_BCRYPT_ROUNDS": "4",
            # a public (non-loopback) URL defaults to invite-only registration; the fleet tests
            # register their own accounts
            "MEDIASRV_REGISTRATION": "open",
            **servers.S3_ENV,
            **self.extra_env,
        })
        return env

    def fleet_env(self) -> dict[str, str]:
        """The environment of a `mediasrv` command run against the fleet's data (users create...)."""
        env = self.app_env(self.apps[0])
        env["MEDIASRV_DATA_DIR"] = str(self.run_dir / "cli")
        return env

    def spawn_app(self, app: AppHost) -> None:
        for d in (app.home / "tmp", app.data_dir):
            d.mkdir(parents=True, exist_ok=True)
        argv = in_netns(app.ns, [str(SIDECAR), "--host", app.address, "--port", str(HTTP_PORT),
                                 "--workers", str(self.workers)])
        app.proc = spawn(argv, app.log, app.env)

    def wait_app(self, app: AppHost, timeout: float = READY_S) -> None:
        deadline = time.monotonic() + timeout
        while http_status(app.url + "/ping", timeout=1.0) != 200:
            if app.proc is None or app.proc.poll() is not None:
                code = None if app.proc is None else app.proc.returncode
                raise RuntimeError(f"{app.name}: serve-behind-nginx exited with {code}:\n{tail(app.log, 30)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{app.name}: not answering /ping after {timeout:.0f} s:\n{tail(app.log, 30)}")
            time.sleep(0.1)

    def start_app(self, app: AppHost) -> None:
        self.spawn_app(app)
        self.wait_app(app)

    def stop_app(self, app: AppHost) -> None:
        """A graceful stop (SIGTERM: nginx drains, then the processes); SIGKILL for what is left."""
        proc, app.proc = app.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if app.ns in self._namespaces:
            kill_netns(app.ns)
            wait_gone(app.ns, 5.0)

    def kill_app(self, app: AppHost) -> int:
        """kill -9 every process of the host (the sidecar, nginx, mediasrv): a power cut. How many."""
        killed = kill_netns(app.ns, signal.SIGKILL)
        wait_gone(app.ns, 5.0)
        if app.proc is not None:
            app.proc.wait()
            app.proc = None
        return killed

    # --- balancer ---------------------------------------------------------------------

    def lb_conf(self) -> str:
        return balancer.render(listen=f"{self.lb.address}:{HTTP_PORT}", balance=self.balance,
                               upstreams=[f"{a.address}:{HTTP_PORT}" for a in self.apps],
                               home=self.lb.home, log_dir=self.lb.log_dir)

    def start_lb(self) -> None:
        home = self.lb.home
        for sub in balancer.TEMP_DIRS:
            (home / sub).mkdir(parents=True, exist_ok=True)
        self.lb.log_dir.mkdir(parents=True, exist_ok=True)
        (home / "nginx.conf").write_text(self.lb_conf())
        nginx = find_nginx()
        self.lb_proc = spawn(in_netns(self.lb.ns, [nginx, "-p", str(home), "-c", str(home / "nginx.conf"),
                                                   "-e", "stderr", "-g", "daemon off;"]),
                             self.lb.log_dir / "nginx.log")
        deadline = time.monotonic() + 20
        while http_status(self.lb.url + "/ping", timeout=1.0) != 200:
            if self.lb_proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"balancer did not start:\n{tail(self.lb.log_dir / 'nginx.log', 20)}")
            time.sleep(0.05)

    def set_balance(self, balance: str) -> None:
        """Switch the balancer between hashing by address and round robin (nginx reload); returns
        once new connections get the new configuration (its X-Fleet-Balance header says which)
        and the old workers are gone. An old worker may still accept a connection after a new one
        has answered, and it closes that keep-alive connection once it shuts down: a client's
        next request on it then fails (httpx ReadError in a burst, CI 2026-11-30)."""
        if balance not in BALANCING:
            raise ValueError(f"balance must be one of {BALANCING}")
        assert self.lb_proc is not None
        self.balance = balance
        (self.lb.home / "nginx.conf").write_text(self.lb_conf())
        old_workers = set(children_of(self.lb_proc.pid))
        self.lb_proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not self._lb_answers_with(balance) or old_workers.intersection(children_of(self.lb_proc.pid)):
            if time.monotonic() > deadline:
                raise RuntimeError("the balancer did not take its new configuration")
            time.sleep(0.05)

    def _lb_answers_with(self, balance: str) -> bool:
        """Whether a new connection to the balancer gets the ``balance`` configuration."""
        req = urllib.request.Request(self.lb.url + "/ping")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with contextlib.suppress(OSError), opener.open(req, timeout=2) as r:
            return bool(r.headers.get("X-Fleet-Balance") == balance)
        return False

    def _stop_lb(self) -> None:
        proc, self.lb_proc = self.lb_proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # --- tools for tests --------------------------------------------------------------

    def heal(self) -> list[str]:
        """Undo what a failed fault test may have left (a dead host, MongoDB stopped, a cable
        out, round robin), so the next test meets the whole fleet; what was mended."""
        mended = []
        for host in (self.data, *self.apps):
            self.set_link(host, True)
        if self.mongo is not None and (self.mongo.proc is None or self.mongo.proc.poll() is not None):
            self.start_mongo()
            mended.append("mongodb")
        for app in self.apps:
            if app.proc is None or app.proc.poll() is not None or http_status(app.url + "/ping", timeout=2.0) != 200:
                self.stop_app(app)
                self.start_app(app)
                mended.append(app.name)
        if self.balance != "hash":
            self.set_balance("hash")
            mended.append("balance")
        return mended


    def mediasrv(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """A `mediasrv` command (users create, reconcile...) on the fleet's data, from the root namespace."""
        (self.run_dir / "cli").mkdir(parents=True, exist_ok=True)
        return subprocess.run([str(VENV_BIN / "mediasrv"), *args], input=stdin, capture_output=True, text=True,
                              env=self.fleet_env(), timeout=120, check=False)

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of every host's logs, for a failing test's report."""
        parts = []
        for path in sorted(self.log_dir.glob("*/*.log")):
            parts.append(f"----- {path.relative_to(self.log_dir)} -----\n{tail(path, lines)}")
        return "\n".join(parts)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def find_nginx() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if not found:
        raise RuntimeError("nginx not found (apt-get install nginx)")
    return found


def unavailable() -> str | None:
    """Why a cluster cannot be built on this machine, or None."""
    if os.geteuid() != 0:
        return "the simulated cluster needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"`ip netns add` does not work here: {done.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    try:
        find_nginx()
    except RuntimeError as exc:
        return str(exc)
    if shutil.which("curl") is None:
        return "curl is not installed (the tests reach mediasrv processes inside their hosts with it)"
    if servers.mongoeco_python() is None:
        return "mongoeco needs Python 3.13 (pyenv or python3.13); not found"
    if not (VENV_BIN / "moto_server").exists() or not (VENV_BIN / "mediasrv").exists():
        return f"moto_server and mediasrv must be installed beside {sys.executable} (pip install -e '.[test]')"
    return None
