"""mediasrv.images.warmup: the server's one tiny transform before it listens."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import pyvips

from mediasrv.images import pipeline, warmup
from mediasrv.images.vips import init_vips

_FRESH = """
import json, sys
from mediasrv.images import vips, warmup
vips.init_vips(50_000_000)
names = ("simplejpeg", "PIL.JpegImagePlugin", "PIL.WebPImagePlugin")
before = [name for name in names if name in sys.modules]
ran = warmup.warm_up(50_000_000)
print(json.dumps({"ran": ran, "before": before, "after": [name for name in names if name in sys.modules]}))
"""


def test_a_fresh_process_has_what_its_first_resize_needs_loaded_after_the_warm_up() -> None:
    """In a process of its own (this one has imported everything already): nothing the first
    JPEG resize loads is loaded before, all of it after, and both transforms ran."""
    result = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout) == {"ran": True, "before": [],
                                         "after": ["simplejpeg", "PIL.JpegImagePlugin", "PIL.WebPImagePlugin"]}


def test_a_failing_warm_up_is_logged_and_does_not_raise(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    init_vips(50_000_000)

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("no decoder")
    monkeypatch.setattr(pipeline, "transform", broken)
    with caplog.at_level(logging.WARNING, logger=warmup.__name__):
        assert warmup.warm_up(50_000_000) is False
    assert "warm-up failed" in caplog.text and "no decoder" in caplog.text


def test_a_source_that_cannot_be_made_is_a_logged_failure_too(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    init_vips(50_000_000)

    def no_saver(*_args: object, **_kwargs: object) -> bytes:
        raise pyvips.Error("no JPEG saver")
    monkeypatch.setattr(pyvips.Image, "jpegsave_buffer", no_saver)
    with caplog.at_level(logging.WARNING, logger=warmup.__name__):
        assert warmup.warm_up(50_000_000) is False
    assert "no JPEG saver" in caplog.text


def test_the_warm_up_runs_both_writers() -> None:
    init_vips(50_000_000)
    calls: list[str | None] = []
    real = pipeline.transform

    def spied(data: bytes, source_type: str, spec: object, max_pixels: int) -> tuple[bytes, str]:
        out = real(data, source_type, spec, max_pixels)  # type: ignore[arg-type]
        calls.append(out[1])
        return out
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "transform", spied)
        assert warmup.warm_up(50_000_000) is True
    assert calls == ["image/jpeg", "image/webp"]
