"""Driving load with Debian's ``wrk``, through a generated Lua script.

The script cycles over a list of paths (so consecutive requests hit different files), can
send a method, headers and a body, and prints one JSON line from ``done`` with the counts
and latency percentiles: nothing is scraped from wrk's human output. Throughput counts only
2xx/3xx answers; errors are reported beside it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "wrk is not installed: sudo apt-get install wrk (Debian/Ubuntu), or build it from its repository"

_LUA = """
local paths = {%(paths)s}
local method = %(method)s
local headers = {%(headers)s}
local body = %(body)s
local i = 0
request = function()
  i = i + 1
  return wrk.format(method, paths[(i %% #paths) + 1], headers, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "bytes": %%d, "status": %%d, "connect": %%d, ' ..
    '"read": %%d, "write": %%d, "timeout": %%d, "p50_us": %%d, "p95_us": %%d, "p99_us": %%d}\\n',
    summary.requests, summary.duration, summary.bytes, e.status, e.connect, e.read, e.write,
    e.timeout, latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None


def _lua_string(value: str | bytes | None) -> str:
    if value is None:
        return "nil"
    raw = value.encode() if isinstance(value, str) else value
    return '"' + "".join(f"\\{b:03d}" for b in raw) + '"'


@dataclass
class WrkResult:
    requests: int
    seconds: float
    errors: int
    """non-2xx/3xx answers plus socket errors and timeouts"""
    p50_ms: float
    p95_ms: float
    p99_ms: float
    bytes: int

    @property
    def ok_per_s(self) -> float:
        return max(self.requests - self.errors, 0) / self.seconds if self.seconds else 0.0


def run(base: str, paths: list[str], *, seconds: float, connections: int, method: str = "GET",
        headers: dict[str, str] | None = None, body: bytes | None = None, threads: int = 1) -> WrkResult:
    """One wrk run against ``base`` cycling over ``paths``; bounded by ``seconds`` plus a margin."""
    lua = _LUA % {
        "paths": ", ".join(_lua_string(p) for p in paths),
        "method": _lua_string(method),
        "headers": ", ".join(f"[{_lua_string(k)}] = {_lua_string(v)}" for k, v in (headers or {}).items()),
        "body": _lua_string(body),
    }
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(lua)
        script = Path(fh.name)
    try:
        duration = max(1, round(seconds))
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--timeout", "30s", "-s", str(script),
             base + paths[0]],
            capture_output=True, text=True, timeout=duration + 60, check=False)
    finally:
        script.unlink(missing_ok=True)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed (exit {out.returncode}): {out.stderr.strip() or out.stdout[-500:]}")
    data = json.loads(line[len("WRKJSON "):])
    errors = data["status"] + data["connect"] + data["read"] + data["write"] + data["timeout"]
    return WrkResult(requests=data["requests"], seconds=data["duration_us"] / 1e6, errors=errors,
                     p50_ms=data["p50_us"] / 1000, p95_ms=data["p95_us"] / 1000, p99_ms=data["p99_us"] / 1000,
                     bytes=data["bytes"])
