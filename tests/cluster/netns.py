"""Network namespaces for the simulated cluster: commands, processes, and who owns a cluster.

A cluster is named after the process that built it (``mscl<pid>``: namespaces
``mscl<pid>-<host>``, the root namespace's veth ``mscl<pid>``, the run directory
``$TMPDIR/mediasrv-cluster-<pid>``). The owner holds a lock on ``owner.lock`` in its run
directory for its whole life, so "is the owner alive" never mistakes a reused pid for it; a
cluster whose owner is gone is stale, and ``clean_stale`` removes it by name.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

PREFIX = "mscl"


def ip(*args: str, check: bool = True) -> str:
    """One ``ip`` command; its output."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def in_netns(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def bound_to_owner(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when its owner dies, even by SIGKILL (util-linux's
    setpriv sets PR_SET_PDEATHSIG, kept across exec). Only from the main thread: the signal
    follows the thread that started the child, and a helper thread's end must not stop it."""
    if threading.current_thread() is not threading.main_thread() or shutil.which("setpriv") is None:
        return argv
    return ["setpriv", "--pdeathsig", "TERM", *argv]


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child bound to its owner, with its output appended to ``log`` (never a pipe nobody reads)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(bound_to_owner(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def netns_pids(ns: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", ns, check=False).split()]


def kill_netns(ns: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to every process of namespace ``ns``; how many there were.

    SIGKILL is a power cut: every process is stopped (SIGSTOP) before any is killed. Killed one
    by one, a parent killed first (the sidecar) sends its children SIGTERM (PR_SET_PDEATHSIG),
    and a child scheduled before its own SIGKILL arrives runs a graceful stop: it gives the
    housekeeping lease up, which a dead host never does (seen once in CI)."""
    if sig != signal.SIGKILL:
        pids = netns_pids(ns)
        _signal_all(pids, sig)
        return len(pids)
    frozen: set[int] = set()
    try:
        while fresh := set(netns_pids(ns)) - frozen:  # a child forked meanwhile is frozen too
            _signal_all(fresh, signal.SIGSTOP)
            frozen |= fresh
    finally:  # never left stopped, even if the listing fails midway
        _signal_all(frozen, signal.SIGKILL)
    return len(frozen)


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_gone(ns: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while netns_pids(ns):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_dir(pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"mediasrv-cluster-{pid}"


def owner_alive(pid: int) -> bool:
    """Whether cluster ``pid``'s owner still runs: it holds a lock on its run directory's
    owner.lock for its whole life (a reused pid holds no such lock)."""
    try:
        fd = os.open(run_dir(pid) / "owner.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def claim(pid: int) -> int:
    """Make cluster ``pid``'s run directory, owned: its owner.lock created and locked before
    the directory appears under its name (so no one ever sees it unlocked). A stale cluster
    under the same name (a reused pid) is removed first. The descriptor stays open until the
    cluster stops; RuntimeError when this process already runs a cluster."""
    if owner_alive(pid):
        raise RuntimeError("this process already runs a cluster (one at a time)")
    remove(pid, owners().get(pid, []))
    fresh = Path(tempfile.mkdtemp(prefix=".mediasrv-cluster-new-"))
    fd = os.open(fresh / "owner.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(fresh, run_dir(pid))
    return fd


def owners() -> dict[int, list[str]]:
    """Owner pid -> its namespaces, for every cluster of this machine."""
    found: dict[int, list[str]] = {}
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if match:
            found.setdefault(int(match.group(1)), []).append(name)
    for line in ip("-o", "link", "show", check=False).splitlines():
        match = re.match(rf"\d+: {PREFIX}(\d+)[@:]", line)
        if match:
            found.setdefault(int(match.group(1)), [])
    for path in Path(tempfile.gettempdir()).glob("mediasrv-cluster-*"):
        suffix = path.name.rsplit("-", 1)[-1]
        if suffix.isdigit():
            found.setdefault(int(suffix), [])
    return found


def remove(pid: int, namespaces: list[str]) -> None:
    """Kill every process in the namespaces of cluster ``pid``, delete them, its root veth and run dir."""
    for ns in namespaces:
        kill_netns(ns)
    for ns in namespaces:
        wait_gone(ns, 5.0)
        ip("netns", "del", ns, check=False)
    ip("link", "del", f"{PREFIX}{pid}", check=False)  # gone with its peer, unless that is still pending
    shutil.rmtree(run_dir(pid), ignore_errors=True)


def clean_stale() -> list[int]:
    """Remove every cluster whose owner process is gone; their pids."""
    stale = [pid for pid in owners() if pid != os.getpid() and not owner_alive(pid)]
    found = owners()
    for pid in stale:
        remove(pid, found[pid])
    return stale


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.N.0/24 that no address or route of the root namespace touches."""
    used = []
    for line in ip("-4", "-o", "addr", "show", check=False).splitlines():
        words = line.split()
        if "inet" in words:
            used.append(ipaddress.ip_network(words[words.index("inet") + 1], strict=False))
    for line in ip("-4", "route", check=False).splitlines():
        word = line.split()[0] if line.split() else "default"
        if word != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
    start = os.getpid() % 200
    for n in range(200):
        net = ipaddress.ip_network(f"10.213.{(start + n) % 200 + 20}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.213.N.0/24 for the cluster")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """GET url's status (None: no answer), with no proxy from the environment."""
    handler = urllib.request.ProxyHandler({})
    opener = urllib.request.build_opener(handler)
    try:
        with opener.open(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def tail(path: Path, lines: int) -> str:
    try:
        text = path.read_bytes()[-200_000:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
