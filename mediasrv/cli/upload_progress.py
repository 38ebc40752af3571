"""How ``mediasrv upload`` shows its progress: bars on a terminal, plain lines otherwise.

Either way a pause for a 429 or 503 is visible with its reason and the time left ("waiting
41 s: rate limited"), so a slow run never looks stuck.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from mediasrv.cli.upload_manifest import LocalFile


class Progress(Protocol):
    def start(self, total_files: int, total_bytes: int) -> None: ...
    def begin(self, f: LocalFile) -> Any: ...
    def advance(self, handle: Any, nbytes: int) -> None: ...
    def restart(self, handle: Any, sent: int) -> None: ...
    def end(self, handle: Any, ok: bool, message: str | None = None) -> None: ...
    def waiting(self, reason: str, seconds: float) -> None: ...
    def resumed(self) -> None: ...


class NoProgress:
    """No bars (stderr is not a terminal): failures and waits as plain lines on stderr."""

    def __init__(self) -> None:
        self._wait_until = 0.0

    def start(self, total_files: int, total_bytes: int) -> None:
        pass

    def begin(self, f: LocalFile) -> Any:
        return None

    def advance(self, handle: Any, nbytes: int) -> None:
        pass

    def restart(self, handle: Any, sent: int) -> None:
        pass

    def end(self, handle: Any, ok: bool, message: str | None = None) -> None:
        if not ok and message:
            print(f"mediasrv upload: {message}", file=sys.stderr)

    def waiting(self, reason: str, seconds: float) -> None:
        until = time.monotonic() + seconds
        if until > self._wait_until + 1:  # one line per pause, not one per waiting stream
            self._wait_until = until
            print(f"mediasrv upload: {reason}; resuming in {seconds:.0f} s", file=sys.stderr, flush=True)

    def resumed(self) -> None:
        pass


class RichProgress:
    """A total bar (files and bytes) and one bar per file in flight, on stderr."""

    def __init__(self, console: Any = None, clock: Callable[[], float] | None = None) -> None:
        """``console``: where the bars go (stderr); ``clock``: rich's time (tests move it)."""
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, TextColumn
        from rich.progress import Progress as RichBars

        self.console = console or Console(stderr=True)
        speed, remaining = _rate_columns()
        self.live = RichBars(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                             speed, TextColumn("{task.fields[files]}", markup=False),
                             remaining, _wait_column(), console=self.console, transient=False, get_time=clock)
        self._total: Any = None
        self._files_done = 0
        self._files_total = 0

    def start(self, total_files: int, total_bytes: int) -> None:
        self._files_total = total_files
        self._total = self.live.add_task("total", total=total_bytes, files=f"0/{total_files} files",
                                         resume_at=None, reason="")

    def waiting(self, reason: str, seconds: float) -> None:
        """The total line shows "waiting 41 s: rate limited", counting down (``WaitColumn``)."""
        if self._total is not None:
            self.live.update(self._total, resume_at=time.monotonic() + seconds, reason=reason)

    def resumed(self) -> None:
        if self._total is not None:
            self.live.update(self._total, resume_at=None, reason="")

    def begin(self, f: LocalFile) -> Any:
        name = f.name if len(f.name) <= 40 else "…" + f.name[-39:]
        return self.live.add_task(name, total=f.size, files="", resume_at=None, reason="")

    def advance(self, handle: Any, nbytes: int) -> None:
        self.live.advance(handle, nbytes)
        self.live.advance(self._total, nbytes)

    def restart(self, handle: Any, sent: int) -> None:
        """The file is sent again from its start: its bytes leave the total. Not as a negative
        step of the total (rich would average it into a negative speed and ETA): the total is
        set back and its speed measured afresh."""
        self.live.reset(handle)
        done = self.live.tasks[self._total_index()].completed
        self.live.reset(self._total, completed=max(0, int(done) - sent))

    def _total_index(self) -> int:
        return next(n for n, task in enumerate(self.live.tasks) if task.id == self._total)

    def end(self, handle: Any, ok: bool, message: str | None = None) -> None:
        self.live.remove_task(handle)
        self._files_done += 1
        self.live.update(self._total, files=f"{self._files_done}/{self._files_total} files")
        if not ok and message:
            self.console.print(f"failed: {message}", markup=False, highlight=False)


def wait_text(fields: dict[str, Any], now: float) -> str:
    """What the waiting column shows: "waiting 41 s: rate limited" while a pause lasts."""
    resume_at = fields.get("resume_at")
    if resume_at is None:
        return ""
    return f"waiting {max(0.0, resume_at - now):.0f} s: {fields.get('reason', '')}"


def rate_texts(fields: dict[str, Any], speed: float | None, remaining: float | None) -> tuple[str | None, str | None]:
    """What the speed and time-left columns show instead of rich's own numbers: "paused" and
    "-:--:--" while a pause lasts (no bytes move, whatever the last samples say), "?" and
    "-:--:--" for an estimate that is not a positive number; None: rich's own text."""
    if fields.get("resume_at") is not None:
        return "paused", "-:--:--"
    return ("?" if speed is None or speed <= 0 else None,
            "-:--:--" if remaining is not None and remaining < 0 else None)


def _rate_columns() -> tuple[Any, Any]:
    """rich's transfer speed and time-left columns, minus negative numbers and stale estimates
    during a pause (``rate_texts``). Built on first use, like ``_wait_column``."""
    from rich.progress import TimeRemainingColumn, TransferSpeedColumn
    from rich.text import Text

    class SpeedColumn(TransferSpeedColumn):
        def render(self, task: Any) -> Text:
            shown, _ = rate_texts(task.fields, task.finished_speed or task.speed, None)
            return Text(shown, style="progress.data.speed") if shown else super().render(task)

    class RemainingColumn(TimeRemainingColumn):
        def render(self, task: Any) -> Text:
            _, shown = rate_texts(task.fields, task.speed, task.time_remaining)
            return Text(shown, style="progress.remaining") if shown else super().render(task)

    return SpeedColumn(), RemainingColumn()


def _wait_column() -> Any:
    """A rich column rendering ``wait_text`` (rich re-renders several times a second, so the time
    left counts down). Built on first use: the server process never imports rich."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class WaitColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(wait_text(task.fields, time.monotonic()), style="yellow")

    return WaitColumn()


