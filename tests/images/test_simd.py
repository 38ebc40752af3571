"""mediasrv.images.simd: libvips' SIMD targets detected once, none of them disabled."""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import pyvips

from mediasrv.images import simd

_FRESH = """
import ctypes, json
import pyvips
from mediasrv.images import simd, vips
lib = ctypes.CDLL(vips._loaded_library())
lib.vips_vector_get_supported_targets.restype = ctypes.c_int64
detected = lib.vips_vector_get_supported_targets()
pinned = []
pin = simd.pin_targets
simd.pin_targets = lambda library: pinned.append(pin(library)) or pinned[-1]
vips.configure()
print(json.dumps({"detected": detected, "after": lib.vips_vector_get_supported_targets(),
                  "enabled": bool(lib.vips_vector_isenabled()), "pinned": pinned}))
"""


def test_configure_pins_the_targets_it_detected_and_keeps_vector_code_on() -> None:
    """In a process of its own, so that the targets read first are Highway's own detection."""
    if pyvips.version(0) * 100 + pyvips.version(1) < 815:
        pytest.skip("an Orc build: no per-build detection and no such call (pin_targets returns None)")
    result = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=120, check=True)
    targets = json.loads(result.stdout)
    if targets["detected"] == 0:
        pytest.skip("this libvips was built without Highway: nothing to pin")
    assert targets["pinned"] == [targets["detected"]]  # configure pinned them, once
    assert targets["after"] == targets["detected"]
    assert targets["enabled"] is True


def test_no_library_or_no_such_call_pins_nothing(tmp_path: Path) -> None:
    assert simd.pin_targets("") is None
    assert simd.pin_targets(str(tmp_path / "libvips.so.42")) is None  # not there
    libc = ctypes.util.find_library("c")
    assert libc is not None and simd.pin_targets(libc) is None  # a library without the call


class _FakeLibvips:
    """The two C functions ``pin_targets`` calls, recording what it passes."""

    def __init__(self) -> None:
        self.disabled: list[int] = []
        self.vips_vector_disable_targets = self._Function(self.disabled.append)
        self.vips_vector_get_supported_targets = self._Function(lambda: 0b1110_0000)

    class _Function:
        def __init__(self, body: Callable[..., object]) -> None:
            self.body, self.argtypes, self.restype = body, None, None

        def __call__(self, *args: object) -> object:
            return self.body(*args)


def test_pinning_disables_no_target_and_returns_what_libvips_then_supports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The targets read back from a real libvips are the same pinned or not, so the call itself
    is checked here: ``vips_vector_disable_targets(0)``, a 64-bit argument, nothing disabled."""
    fake = _FakeLibvips()
    monkeypatch.setattr(ctypes, "CDLL", lambda path: fake)
    assert simd.pin_targets("/lib/libvips.so.42") == 0b1110_0000
    assert fake.disabled == [0]
    assert fake.vips_vector_disable_targets.argtypes == [ctypes.c_int64]
