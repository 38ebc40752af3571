"""Nothing the sidecar started outlives it in a way that holds the port: orphaned nginx workers,
or its whole tree when the sidecar itself is killed.

nginx's workers do not die with their master: killed (kill -9, the OOM killer), the master
leaves its workers running with the listening socket, answering with the old configuration,
and a new nginx cannot bind the port. The sidecar makes itself the *child subreaper* of what
it starts (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``), so those workers become its own children
when their master dies; it then kills and reaps every child it did not start, and waits until
the port can be bound before it starts nginx again.

The other way round, the sidecar killed (kill -9, the OOM killer) would leave nginx and the
mediasrv processes running without their supervisor, holding the port against the sidecar a
supervisor starts again. Each child asks the kernel for SIGTERM when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, ``die_with_parent``): nginx's master then stops its workers, and
each mediasrv process drains and exits.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
PORT_POLL_S = 0.1


def become_subreaper() -> bool:
    """Orphaned descendants (an nginx master's workers) are reparented to this process, not to
    init: True when the kernel agreed (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when this process dies
    (Linux; None elsewhere). prctl is looked up here, in the parent, so the forked child only
    makes the call. The child checks its parent after the call, in case the sidecar died
    between the fork and it. The signal is tied to the thread that starts the child: the
    sidecar starts every child from its main thread."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def children_of(parent: int, proc: Path = Path("/proc")) -> list[int]:
    """The pids whose parent is ``parent`` (from /proc/<pid>/stat)."""
    found = []
    # Listed by name, each read on its own: Path.glob stats every match, and a process that
    # exits in between makes that stat raise ProcessLookupError (ESRCH) out of the glob itself
    # (a sidecar's SIGTERM then exited 1 instead of 0, in CI).
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            fields = (proc / name / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited between the listing and the read
        if int(fields[1]) == parent:  # the field after the state
            found.append(int(name))
    return found


def kill_orphans(known: Iterable[int]) -> list[int]:
    """SIGKILL and reap every child of this process that is not one of ``known`` (those the
    sidecar started and still watches): orphans handed to it as subreaper. The pids killed."""
    keep = set(known)
    killed = [pid for pid in children_of(os.getpid()) if pid not in keep]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in killed:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # gone, its sockets closed
    return killed


def port_is_free(host: str, port: int) -> bool:
    """Whether nginx could bind host:port now (as nginx does, with SO_REUSEADDR: connections in
    TIME_WAIT do not count, a listening socket does)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:  # another error (EACCES below 1024): nginx will say it
            return exc.errno != errno.EADDRINUSE
    return True


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    """Poll until host:port can be bound; False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(PORT_POLL_S)
    return True
