"""``mediasrv --version`` and ``mediasrv upload`` load none of the server (issue 16 item 1).

Each case runs the installed command's entry point (pyproject's ``[project.scripts]``) in a fresh
interpreter and lists ``sys.modules`` once it has finished: no libvips binding, no Tornado, no
handlers or web code, no store (a client has none), no database or S3 driver.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.cli.test_server import ServerTestCase

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("pyvips", "tornado", "handlers", "mediasrv.web", "mediasrv.images.vips", "mediasrv.images.pipeline",
             "mediasrv.cli.server", "mediasrv.assembly", "store", "pymongo", "aiobotocore", "bcrypt", "sqlite3")

RUN_AND_LIST = """
import importlib, json, sys
module, _, name = sys.argv[1].partition(":")
try:
    getattr(importlib.import_module(module), name)(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
else:
    code = None
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def entry_point() -> str:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return str(scripts["mediasrv"])


def modules_after(*argv: str, timeout: float = 60) -> tuple[object, list[str]]:
    """(exit code, every module imported) of ``mediasrv ARGV`` run in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST, entry_point(), *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["code"], report["modules"]


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


@pytest.mark.parametrize("argv", [["--version"], ["upload", "--help"], ["--help"], ["serve", "--help"]])
def test_help_and_version_load_nothing_of_the_server(argv: list[str]) -> None:
    code, modules = modules_after(*argv)
    assert code == 0
    assert heavy(modules) == []


def test_the_checker_sees_the_server_when_it_is_loaded() -> None:
    """The same check on ``serve``'s module: what the cases above must not show is found here."""
    done = subprocess.run([sys.executable, "-c", "import json, sys, mediasrv.cli.server; "
                           "print(json.dumps(sorted(sys.modules)))"], capture_output=True, text=True, timeout=60)
    found = heavy(json.loads(done.stdout))
    assert {"pyvips", "tornado.web", "handlers", "mediasrv.assembly.app", "store.sqlite"} <= set(found)


def test_a_server_loads_what_it_uses_when_it_first_uses_it() -> None:
    """The server's modules leave out what a server may never use: httpx (a webhook or a
    domain provider; with its command line, click and rich, 0.1 s), simplejpeg and numpy (the
    first JPEG decoded, 0.13 s). Every process a test or an operator starts paid them."""
    done = subprocess.run([sys.executable, "-c", "import json, sys, mediasrv.cli.server, mediasrv.assembly.app, "
                           "handlers.routes; print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=60)
    modules = set(json.loads(done.stdout))
    assert "handlers.routes" in modules
    assert modules.isdisjoint({"httpx", "simplejpeg", "numpy", "click"})


class UploadLoadsOnlyTheClientTest(ServerTestCase):
    def test_an_upload_run_loads_only_the_client(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        r = self.client.post(server.url + "/auth/api-keys", json={"name": "lazy"},
                             headers={"Authorization": f"Bearer {token}"})
        self.assertEqual(r.status_code, 201, r.text)
        (self.tmp / "up").mkdir()
        (self.tmp / "up" / "a.txt").write_bytes(b"uploaded by a command that loads no server code\n")
        code, modules = modules_after("upload", str(self.tmp / "up"), "--url", server.url, "--api-key",
                                      r.json()["key"], "--manifest", str(self.tmp / "manifest.jsonl"),
                                      "--no-progress")
        self.assertEqual(code, 0)
        self.assertIn("mediasrv.client", modules)  # it did run the upload
        self.assertEqual(self.get(server, "/files", token).json()["total"], 1)
        self.assertEqual(heavy(modules), [])
