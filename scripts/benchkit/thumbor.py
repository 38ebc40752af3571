"""thumbor 7.8 as the resize peer: installed once into its own cached venv, started per run.

thumbor pins its own dependency set (Pillow, its own Tornado), so it never shares the
project's venv. The interpreter is the first of: this one, then pyenv's 3.12, 3.11, 3.10,
3.9 that can install it. Configuration: PIL engine, ENGINE_THREADPOOL_SIZE = cores, no
storage and no result storage (nothing cached), unsafe URLs, file loader over the images
directory, QUALITY 82 (mediasrv's JPEG quality), everything else thumbor's default. With
``result_storage`` (the mix benchmark), thumbor's own result cache is on: its file result
storage in that directory, unsafe URLs stored too.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchkit.images import CACHE_ROOT
from benchkit.procs import Helper, free_port, start_helper

VERSION = "7.8.0"
VENV = CACHE_ROOT / "thumbor"


def _candidates() -> list[str]:
    found = [sys.executable]
    pyenv = shutil.which("pyenv")
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    if pyenv:
        out = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        root = Path(out.stdout.strip() or root)
    versions = root / "versions"
    if versions.is_dir():
        for minor in ("3.12", "3.11", "3.10", "3.9"):
            for v in sorted(versions.glob(f"{minor}.*"), reverse=True):
                python = v / "bin" / "python"
                if python.exists():
                    found.append(str(python))
                    break
    return found


def installed() -> bool:
    python = VENV / "bin" / "python"
    if not python.exists():
        return False
    check = subprocess.run([str(python), "-c", f"import thumbor; assert thumbor.__version__ == {VERSION!r}"],
                           capture_output=True, check=False)
    return check.returncode == 0


def install(log: Path) -> str | None:
    """Install thumbor into VENV; None on success, else the reason (shown in the table)."""
    if installed():
        return None
    reasons = []
    for python in _candidates():
        shutil.rmtree(VENV, ignore_errors=True)
        VENV.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            made = subprocess.run([python, "-m", "venv", str(VENV)], stdout=out, stderr=out, check=False)
            if made.returncode != 0:
                reasons.append(f"{python}: venv failed")
                continue
            print(f"  installing thumbor {VERSION} with {python} into {VENV} (once; log {log})", flush=True)
            pip = subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"thumbor=={VERSION}"],
                                 stdout=out, stderr=out, check=False, timeout=900)
        if pip.returncode == 0 and installed():
            return None
        reasons.append(f"{python}: pip install failed")
    shutil.rmtree(VENV, ignore_errors=True)
    return "thumbor could not be installed (" + "; ".join(reasons) + f"); see {log}"


def start(work: Path, images_root: Path, threads: int, result_storage: Path | None = None,
          name: str = "thumbor") -> Helper:
    conf = work / f"{name}.conf"
    results = "RESULT_STORAGE = None\n"
    if result_storage is not None:
        results = ("RESULT_STORAGE = 'thumbor.result_storages.file_storage'\n"
                   f"RESULT_STORAGE_FILE_STORAGE_ROOT_PATH = {str(result_storage)!r}\n"
                   "RESULT_STORAGE_STORES_UNSAFE = True\n"
                   "RESULT_STORAGE_EXPIRATION_SECONDS = 0\n")
    conf.write_text(
        "LOADER = 'thumbor.loaders.file_loader'\n"
        f"FILE_LOADER_ROOT_PATH = {str(images_root)!r}\n"
        "ENGINE = 'thumbor.engines.pil'\n"
        f"ENGINE_THREADPOOL_SIZE = {threads}\n"
        "STORAGE = 'thumbor.storages.no_storage'\n"
        + results +
        "ALLOW_UNSAFE_URL = True\n"
        "QUALITY = 82\n"
        "MAX_AGE = 0\n")
    port = free_port()
    command = [str(VENV / "bin" / "thumbor"), "--port", str(port), "--ip", "127.0.0.1", "--conf", str(conf),
               "--log-level", "warning"]
    return start_helper(command, work, name, "/healthcheck", port)
