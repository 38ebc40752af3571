"""How ``mediasrv upload`` shows its progress: bars on a terminal, plain lines otherwise.

Either way a pause for a 429 or 503 is visible with its reason and the time left ("waiting
41 s: rate limited"), so a slow run never looks stuck.
"""
from __future__ import annotations

import sys
import time
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

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as RichBars

        self.console = Console(stderr=True)
        self.live = RichBars(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TextColumn("{task.fields[files]}", markup=False),
                             TimeRemainingColumn(), _wait_column(), console=self.console, transient=False)
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
        self.live.reset(handle)
        self.live.advance(self._total, -sent)

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


def _wait_column() -> Any:
    """A rich column rendering ``wait_text`` (rich re-renders several times a second, so the time
    left counts down). Built on first use: the server process never imports rich."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class WaitColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(wait_text(task.fields, time.monotonic()), style="yellow")

    return WaitColumn()


