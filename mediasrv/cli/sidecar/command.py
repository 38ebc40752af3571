"""``mediasrv sidecar`` and ``mediasrv supervisord-conf``: the deployment of the installed program.

    mediasrv sidecar [--host H] [--port P] [--workers N]
    mediasrv supervisord-conf [-o PATH]

The sidecar runs nginx in front of N ``mediasrv serve`` processes (``mediasrv.cli.sidecar``'s
docstring says what it does); ``supervisord-conf`` prints the packaged ``supervisord.conf``
(the one at the top of the checkout is the same file), which runs the sidecar under Debian's
supervisord with its paths taken from the environment.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from mediasrv.base.settings import SettingsError
from mediasrv.cli.sidecar import logs, processes
from mediasrv.cli.sidecar.arguments import add_parsers as add_parsers  # re-exported
from mediasrv.cli.sidecar.nginx_conf import deploy_file
from mediasrv.web.metrics_fanin import FanIn, socket_paths

WANTED_DESCRIPTORS = 65536
"""Asked for at start (nginx and the processes inherit it); less where the machine allows less."""


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "supervisord-conf":
        return write_supervisord_conf(args.output)
    logs.configure(os.environ.get("MEDIASRV_LOG_FORMAT", "").strip().lower())
    return sidecar(args, parser)


def write_supervisord_conf(output: Path | None) -> int:
    text = deploy_file("supervisord.conf")
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        print(f"wrote {output}", file=sys.stderr)
    return 0


def sidecar(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    host = args.host or os.environ.get("MEDIASRV_HOST") or "127.0.0.1"
    port = args.port or _env_port(parser)
    workers = args.workers or _env_int("MEDIASRV_WORKERS", parser) or os.cpu_count() or 1
    if workers < 1:
        parser.error("--workers / MEDIASRV_WORKERS must be at least 1")
    if host in ("0.0.0.0", "::") and not os.environ.get("MEDIASRV_PUBLIC_URL"):
        parser.error(f"--host {host} listens on every interface: set MEDIASRV_PUBLIC_URL to the "
                     "address clients use (it goes into every public_url and e-mail link)")
    ask_descriptors(WANTED_DESCRIPTORS)
    nginx = find_nginx()
    remove_stale_dirs(Path(tempfile.gettempdir()))
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
    try:
        metrics = bind_metrics(workers, tmp, parser)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        running = processes.Sidecar(host, port, workers, nginx, mediasrv_command(), tmp, metrics=metrics)
    except SettingsError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        parser.error(str(exc))
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    try:
        running.start(lambda: bool(stopping))
        code = running.watch(lambda: bool(stopping))
    finally:
        running.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    logs.log.info("stopped (exit status %d)", code)
    return code


TMP_PREFIX = "mediasrv-nginx-"
"""The sidecar's private directory (nginx.conf, its temp files, the /m cache, metrics sockets):
``mediasrv-nginx-<sidecar pid>-<random>`` in the temp directory."""


def remove_stale_dirs(root: Path) -> int:
    """Remove the private directories of sidecars that are gone: one killed with SIGKILL (the OOM
    killer) leaves its directory, /m cache included, and nothing else would ever remove it. Only
    a directory whose name holds a pid no process has now; how many were removed."""
    removed = 0
    for path in root.glob(f"{TMP_PREFIX}*-*"):
        pid = path.name[len(TMP_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or not path.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or another user's process by that pid): not ours to judge
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def bind_metrics(workers: int, tmp: Path, parser: argparse.ArgumentParser) -> FanIn | None:
    """MEDIASRV_METRICS_PORT: one listener on MEDIASRV_METRICS_HOST (127.0.0.1) for all the
    processes, which serve theirs on Unix sockets in the sidecar's private directory; bound
    before any process starts (a port in use stops the start). None when unset."""
    port = _env_int("MEDIASRV_METRICS_PORT", parser)
    if port is None:
        return None
    if not 1 <= port <= 65535:
        parser.error(f"MEDIASRV_METRICS_PORT must be from 1 to 65535, not {port}")
    host = (os.environ.get("MEDIASRV_METRICS_HOST") or "").strip() or "127.0.0.1"
    try:
        return FanIn(host, port, socket_paths(workers, tmp))
    except OSError as exc:
        logs.fail(f"cannot listen on {host}:{port} (MEDIASRV_METRICS_PORT): {exc.strerror or exc}")


def _env_int(name: str, parser: argparse.ArgumentParser) -> int | None:
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()):
        parser.error(f"{name} must be a whole number, not {raw!r}")
    return int(raw)


def _env_port(parser: argparse.ArgumentParser) -> int:
    port = _env_int("MEDIASRV_PORT", parser) or 8080
    if not 1 <= port <= 65535:
        parser.error(f"MEDIASRV_PORT must be from 1 to 65535, not {port}")
    return port


def ask_descriptors(wanted: int) -> int:
    """Raise this process's descriptor limit (nginx and the processes inherit it) to ``wanted``,
    or to what the machine allows: a container whose hard limit is lower, without the right to
    raise it, gets a warning and runs with what there is (supervisord's ``minfds`` would refuse
    to start instead). The limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= wanted:
        target = wanted if hard == resource.RLIM_INFINITY else hard
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return max(soft, target)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))  # root with CAP_SYS_RESOURCE
        return wanted
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logs.log.warning("descriptor limit %d, below the %d asked for (the hard limit here, which this user may not "
                     "raise); nginx and the processes run with it. Raise it with `ulimit -Hn`, LimitNOFILE= "
                     "(systemd) or the container's --ulimit nofile=", hard, wanted)
    return hard


def find_nginx() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if os.access(p, os.X_OK)), None)
    if not found:
        logs.fail("nginx not found on PATH or in /usr/sbin (apt-get install nginx)")
    return found


def mediasrv_command() -> list[str]:
    """This installation's `mediasrv` (beside the interpreter running it, as in a venv), else
    the same package run by this interpreter: the processes run exactly the sidecar's code."""
    beside = Path(sys.executable).parent / "mediasrv"
    if os.access(beside, os.X_OK):
        return [str(beside)]
    return [sys.executable, "-m", "mediasrv"]
