"""Issue 19 item 4: the deployment works from the built wheel alone, with no checkout.

The wheel is built from a clean copy of what it is made of (a stale ``build/`` in the checkout
could smuggle files in), installed into a fresh venv in a temporary directory, and run from
there: ``mediasrv sidecar`` (nginx in front, its templates read from the installed package) and
``mediasrv supervisord-conf`` + supervisord, as the README's deployment section does, each
answering ``/ping`` through nginx.

Dependencies: the fresh venv sees the project venv's site-packages through a ``.pth`` line (a
plain path: the editable install's own ``.pth`` there is not processed, so the checkout's
``mediasrv`` is not importable from it; the test checks that the one running is the wheel's).
Installing them again from the index would take more than a minute and prove only pip.
"""
from __future__ import annotations

import os
import shutil
import signal
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_serve_behind_nginx import NGINX, SUPERVISORD, base_env, free_port, request, wait_ready

ROOT = Path(__file__).resolve().parents[2]
WHEEL_SOURCES = ("pyproject.toml", "setup.cfg", "README.md", "LICENSE", "mediasrv", "handlers", "store")
"""What the wheel is built from (pyproject.toml's packages, metadata and package data)."""

pytestmark = [pytest.mark.wheel,  # about a minute: run by .ci/run, not by the default suite
              pytest.mark.timeout(600),  # the build and a fresh venv in the first test's setup
              pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a fresh venv holding only the wheel (and a path to the dependencies)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w",
                            str(tmp / "dist")], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp / "dist").glob("mediasrv-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--no-deps", "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [venv_site] = (venv / "lib").glob("python3*/site-packages")
    (venv_site / "project-dependencies.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    return venv / "bin"


def installed_env(bin_dir: Path, data: Path, **extra: str) -> dict[str, str]:
    """The README's environment: the venv's bin first on PATH, the data directory; no checkout."""
    env = base_env(data, **extra)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def test_the_wheel_runs_from_its_own_files(installed: Path, tmp_path: Path) -> None:
    probe = ("import mediasrv, importlib.resources as r; print(mediasrv.__file__); "
             "print(r.files('mediasrv').joinpath('deploy/nginx/mediasrv.conf.template').is_file())")
    done = subprocess.run([str(installed / "python"), "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    where, template = done.stdout.split()
    assert Path(where).is_relative_to(installed.parent) and template == "True", done.stderr
    conf = subprocess.run([str(installed / "mediasrv"), "supervisord-conf"], capture_output=True, text=True,
                          timeout=60)
    assert conf.returncode == 0 and conf.stdout == (ROOT / "supervisord.conf").read_text()


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def test_mediasrv_sidecar_from_the_wheel_answers_through_nginx(installed: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "sidecar.log"
    env = installed_env(installed, tmp_path / "data", MEDIASRV_WORKERS="2")
    with open(log, "ab") as out:
        proc = subprocess.Popen(["mediasrv", "sidecar", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(proc, port, log)
        r = request(port, "GET", "/ping")
        assert r.status == 200 and r.json() == {"status": "ok"} and r.headers.get("server") == "nginx"
        serving = [p for p in Path("/proc").glob("[0-9]*/cmdline") if b"\0serve\0--host\0" in _read(p)
                   and _read(p.parent / "environ").find(f"MEDIASRV_DATA_DIR={tmp_path / 'data'}".encode()) >= 0]
        assert len(serving) == 2  # the wheel's `mediasrv` runs the processes too
        assert all(_read(p).split(b"\0")[1] == str(installed / "mediasrv").encode() for p in serving)
    finally:
        assert _stop(proc, 25) == 0, log.read_text()[-3000:]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # exited meanwhile
        return b""


@pytest.mark.skipif(SUPERVISORD is None, reason="supervisord is not installed (apt-get install supervisor)")
def test_supervisord_conf_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    """The README's lines: write the packaged supervisord.conf, export the paths, start it."""
    port = free_port()
    (tmp_path / "run").mkdir()
    env = installed_env(installed, tmp_path / "data", MEDIASRV_RUN_DIR=str(tmp_path / "run"),
                        MEDIASRV_HOST="127.0.0.1", MEDIASRV_PORT=str(port), MEDIASRV_WORKERS="1")
    subprocess.run(["mediasrv", "supervisord-conf", "-o", "supervisord.conf"], env=env, cwd=tmp_path,
                   check=True, timeout=60)
    log = tmp_path / "supervisord.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([SUPERVISORD, "-c", "supervisord.conf"], env=env, cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(proc, port, log)
        r = request(port, "GET", "/ping")
        assert r.status == 200 and r.headers.get("server") == "nginx"
    finally:
        assert _stop(proc, 40) == 0, log.read_text()[-3000:]
    assert "stopped: mediasrv (exit status 0)" in log.read_text()
