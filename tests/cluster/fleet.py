"""What the cluster tests do as clients: HTTP from chosen client addresses, accounts, windows.

Every client request names the fleet's public host (the balancer's address) in Host, also
when it goes straight to one application host: mediasrv answers only its public host and the
custom domains it knows, as every machine of a real fleet serves one hostname.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from email import message_from_bytes, policy
from typing import TypeVar

import httpx

from tests.cluster.sim import Cluster, Host

PASSWORD = "fleet-pass-1"
LINK_RE = re.compile(r"https?://[^\s\"'<>]+/auth/confirm[^\s\"'<>]*")
WINDOW_S = 60
T = TypeVar("T")


class Addresses:
    """Hands out the root namespace's client addresses, each once: one per simulated client,
    so no test meets another's per-address counters."""

    def __init__(self, cluster: Cluster) -> None:
        self._free = list(cluster.client_addresses)

    def take(self, n: int = 1) -> list[str]:
        if len(self._free) < n:
            raise RuntimeError("out of client addresses (raise sim.CLIENT_ADDRESSES)")
        taken, self._free = self._free[:n], self._free[n:]
        return taken

    def one(self) -> str:
        return self.take(1)[0]


def spread_over_hosts(cluster: Cluster, addresses: Addresses, per_host: int) -> list[str]:
    """Client addresses the balancer sends to each host, ``per_host`` of each (it hashes by
    address, so which host an address reaches depends on the subnet of the run)."""
    wanted = {f"{app.address}:80": per_host for app in cluster.apps}
    chosen: list[str] = []
    while any(wanted.values()):
        source = addresses.one()
        with client(cluster, cluster.lb, source) as c:
            upstream = c.get("/ping").headers["X-Fleet-Upstream"]
        if wanted.get(upstream, 0) > 0:
            wanted[upstream] -= 1
            chosen.append(source)
    return chosen


def public_host(cluster: Cluster) -> str:
    return cluster.lb.address


@contextlib.contextmanager
def client(cluster: Cluster, via: Host, source: str, token: str | None = None,
           timeout: float = 30.0) -> Iterator[httpx.Client]:
    """An HTTP client to ``via`` (the balancer or one host) from client address ``source``."""
    headers = {"Host": public_host(cluster)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=via.url, headers=headers, transport=transport, timeout=timeout,
                      trust_env=False) as c:
        yield c


def async_client(cluster: Cluster, source: str, token: str | None = None,
                 timeout: float = 30.0) -> httpx.AsyncClient:
    """An async client from ``source``; requests give absolute URLs (any host)."""
    headers = {"Host": public_host(cluster)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.AsyncClient(headers=headers, transport=httpx.AsyncHTTPTransport(local_address=source),
                             timeout=timeout, trust_env=False)


@dataclass(frozen=True)
class Account:
    email: str
    token: str
    user_id: str


def confirmation_link(cluster: Cluster, email: str, timeout: float = 15.0) -> str:
    """The link of the confirmation e-mail to ``email``, from whichever host's outbox has it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for app in cluster.apps:
            for path in sorted((app.data_dir / "outbox").glob("*.eml")):
                message = message_from_bytes(path.read_bytes(), policy=policy.default)
                if email in str(message["To"]):
                    text = message.get_body(preferencelist=("plain",)).get_content()
                    return LINK_RE.findall(text)[0]
        time.sleep(0.05)
    raise AssertionError(f"no confirmation e-mail to {email} in any host's outbox")


def register(cluster: Cluster, source: str, via: Host | None = None) -> Account:
    """A new confirmed account, registered, confirmed and logged in through ``via`` (the balancer)."""
    email = f"u{uuid.uuid4().hex[:12]}@fleet.test"
    with client(cluster, via or cluster.lb, source) as c:
        r = c.post("/auth/register", json={"email": email, "password": PASSWORD})
        assert r.status_code == 201, r.text
        link = confirmation_link(cluster, email)
        confirm = httpx.URL(link)
        assert c.get(confirm.raw_path.decode(), follow_redirects=False).status_code == 303
        return login(c, email)


def login(c: httpx.Client, email: str) -> Account:
    r = c.post("/auth/login", json={"email": email, "password": PASSWORD})
    assert r.status_code == 200, r.text
    body = r.json()
    return Account(email, str(body["session"]["access_token"]), str(body["user"]["id"]))


def window() -> int:
    """The rate limiter's current one-minute window (it counts in windows on the clock minute)."""
    return int(time.time() // WINDOW_S)


def within_one_window(attempt: Callable[[], T], tries: int = 3) -> T:
    """``attempt()`` again (it must use fresh counters: a new client address or account) when
    a window boundary fell inside it, so a count is never split over two windows."""
    for n in range(tries):
        start = window()
        result = attempt()
        if window() == start:
            return result
        if n + 1 < tries:
            time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.05)  # the next try gets a whole window
    raise AssertionError(f"{tries} attempts each crossed a window boundary")


def gather(coros: list[Awaitable[T]]) -> list[T]:
    async def all_of() -> list[T]:
        return list(await asyncio.gather(*coros))
    return asyncio.run(all_of())


@dataclass(frozen=True)
class Answer:
    path: str
    status: int | None
    """None: no HTTP answer (the exception's name is in ``error``)."""
    error: str
    retry_after: str | None
    upstream: str
    """The balancer's X-Fleet-Upstream: the host(s) tried, "a, b" when it retried the next one."""
    started: float
    """time.monotonic() when the request was sent."""
    seconds: float


class SteadyLoad:
    """GETs through the balancer from several client addresses, one thread each, until stopped.

    Each thread sends its paths in turn, one request every ``interval_s`` at most (a steady
    rate that leaves the two shared cores to the hosts), and records every answer.
    """

    def __init__(self, cluster: Cluster, sources: list[str], paths: list[str], token: str | None = None,
                 interval_s: float = 0.02, timeout: float = 30.0) -> None:
        self.cluster, self.sources, self.paths, self.token = cluster, sources, paths, token
        self.interval_s, self.timeout = interval_s, timeout
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(s,), daemon=True) for s in sources]

    def __enter__(self) -> SteadyLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)

    def _run(self, source: str) -> None:
        with client(self.cluster, self.cluster.lb, source, self.token, timeout=self.timeout) as c:
            for path in itertools.cycle(self.paths):
                if self._stop.is_set():
                    return
                started = time.monotonic()
                try:
                    r = c.get(path)
                    answer = Answer(path, r.status_code, "", r.headers.get("Retry-After"),
                                    r.headers.get("X-Fleet-Upstream", ""), started, time.monotonic() - started)
                except httpx.HTTPError as exc:
                    answer = Answer(path, None, type(exc).__name__, None, "", started, time.monotonic() - started)
                with self._lock:
                    self.answers.append(answer)
                self._stop.wait(self.interval_s)

    def between(self, start: float, end: float) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if start <= a.started < end]

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` answers are in (the load is running)."""
        deadline = time.monotonic() + timeout
        while len(self.answers) < count:
            assert time.monotonic() < deadline, "the load got no answers"
            time.sleep(0.05)
