"""``mediasrv serve`` runs with glibc's ``malloc.hugetlb`` tunable (``allocator``): image buffers
mapped in huge pages, not faulted in 4 KiB at a time; an operator's own setting is kept."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from mediasrv.images.allocator import tunables_with_hugepages
from tests.cli.test_server import ServerTestCase


def test_the_tunable_is_added_to_what_is_set_and_never_overrides_it() -> None:
    assert tunables_with_hugepages({}, "glibc 2.36") == "glibc.malloc.hugetlb=1"
    assert tunables_with_hugepages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "glibc 2.35") == \
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert tunables_with_hugepages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "glibc 2.36") is None
    assert tunables_with_hugepages({}, "glibc 2.34") is None  # no such tunable: nothing to restart for
    assert tunables_with_hugepages({}, None) is None  # musl, macOS
    assert tunables_with_hugepages({}, "glibc unknown") is None


def _libc_has_hugetlb() -> bool:
    try:
        return tunables_with_hugepages({}, os.confstr("CS_GNU_LIBC_VERSION")) is not None
    except (ValueError, OSError):
        return False


def _tunables(pid: int) -> str | None:
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"GLIBC_TUNABLES="):
            return entry.split(b"=", 1)[1].decode()
    return None


@pytest.mark.skipif(not _libc_has_hugetlb(), reason="glibc 2.35 or later only")
class HugePagesTest(ServerTestCase):
    def test_serve_restarts_itself_once_with_the_tunable_in_the_same_process(self) -> None:
        server = self.serve(GLIBC_TUNABLES="")
        assert server.proc is not None
        self.assertEqual(_tunables(server.proc.pid), "glibc.malloc.hugetlb=1")
        # the script run again, not the interpreter: ``pgrep -x mediasrv`` still finds it
        self.assertEqual(Path(f"/proc/{server.proc.pid}/comm").read_text().strip(), "mediasrv")
        self.assertEqual(self.client.get(server.url + "/health").status_code, 200)
        self.assertEqual(server.terminate()[0], 0)

    def test_an_operators_setting_is_kept(self) -> None:
        server = self.serve(GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
        assert server.proc is not None
        self.assertEqual(_tunables(server.proc.pid), "glibc.malloc.hugetlb=0")
        self.assertEqual(server.terminate()[0], 0)
