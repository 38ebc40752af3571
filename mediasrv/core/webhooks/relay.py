"""The delivery loop of one process: spread recorded changes, claim due deliveries, send them.

Every serving process runs one. Each round it asks the store to spread the changes recorded
since (MongoDB; SQLite wrote the deliveries with the change), then claims as many due
deliveries as it has free slots (``MEDIASRV_WEBHOOK_CONCURRENCY``), at most
``MEDIASRV_WEBHOOK_PER_ENDPOINT`` in flight to one endpoint, so a slow or dead endpoint holds
a few slots for at most the 10 s timeout each and every other endpoint's deliveries go on.
A claim lasts ``MEDIASRV_WEBHOOK_CLAIM`` seconds: no other process (of this host or another)
sends that delivery meanwhile; if this process dies, another takes it when the claim runs out.
Delivery is at least once: a process that sent but died before recording it, or whose claim
expired while the receiver was slow, may see it sent again, under the same ``webhook-id``.

A round runs at once when this process records a change (``poke``: the store wrapper in
``mediasrv.core.webhooks.service`` calls it after an upload or delete), when a delivery ends
and frees a slot, and every ``poll_s`` otherwise (retries falling due, other processes'
changes, claims of dead processes). Everything here is on the event loop; the sends are
network I/O, the store calls are the store's own executors.

Each attempt is logged in the access log's terms (``mediasrv.webhooks``: status, where, how
long, whose) and counted for /metrics, with the queue's size and age (``snapshot``).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mediasrv.base.tasks import cancel_and_wait
from mediasrv.base.timeutil import iso, parse_iso
from mediasrv.core.lease import holder_id
from mediasrv.core.mail import MailQueue, Message
from mediasrv.core.webhooks.attempts import Attempt, Sender
from mediasrv.core.webhooks.destinations import origin_of
from mediasrv.core.webhooks.events import DISABLE_AFTER, MAX_ATTEMPTS, Renderer, render_body, retry_delay_s
from store.base import MetaStore
from store.errors import StoreError
from store.models import (
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    DELIVERY_SUCCEEDED,
    ClaimedDelivery,
    DeliveryOutcome,
    FileRecord,
)

log = logging.getLogger("mediasrv.webhooks")
POLL_S = 1.0
GATHER_S = 0.02
"""After a poke, the relay waits this long before its round, so that the changes of a burst of
uploads are claimed a batch at a time rather than one claim each."""
RECORD_GATHER_S = 0.05
"""Outcomes are written at most this often: one write for the attempts of that moment."""
RENDER_CACHE_S = 1.0
"""An account's File rendering (its custom domain looked up) is reused this long."""
SPREAD_BATCH = 500
STATS_EVERY_S = 10.0
PURGE_EVERY_S = 3600.0
KEEP_DELIVERIES = dt.timedelta(days=7)
"""Finished deliveries stay listed (GET /webhooks/{id}/deliveries) this long."""
SETTLE_MIN_S = 60.0
ERROR_PAUSE_S = 5.0
PREFETCH = 8
"""Claims per endpoint slot: an endpoint may have ``PREFETCH x MEDIASRV_WEBHOOK_PER_ENDPOINT``
deliveries claimed here, of which ``MEDIASRV_WEBHOOK_PER_ENDPOINT`` are being sent and the rest
wait their turn in this process. One claim (a store write) per delivery in flight capped an
endpoint at a few deliveries per round: 80/s on the benchmark, behind 160 uploads/s."""
YIELD_MAX_S = 5.0
"""While requests are being answered, deliveries wait at most this long for them (``_dispatch``)."""
YIELD_CHECK_S = 0.05
CLAIM_MARGIN_S = 1.0
"""A queued delivery is sent only if its claim outlasts the attempt (the sender's timeout) by
this much; else it is let go unsent (a round claims it again at once), so no other process can
take it while it is being sent. MEDIASRV_WEBHOOK_CLAIM (15 s at least) leaves it seconds to wait."""


class AttemptLine(NamedTuple):
    """One attempt, as its log line says it (the access log's terms: status, where, how long, who)."""

    when: float
    ok: bool
    status: int | None
    origin: str
    """``scheme://host[:port]``: never the URL's path or query (they may hold a receiver's token)."""
    duration_ms: int
    user: str
    webhook: str
    event: str
    webhook_id: str
    attempt: int
    outcome: str
    next_attempt_at: str | None
    error: str | None

    def text(self) -> str:
        status = self.status if self.status is not None else "-"
        return (f"{status} POST {self.origin} {self.duration_ms}ms user={self.user} webhook={self.webhook} "
                f"event={self.event} id={self.webhook_id} attempt={self.attempt} {self.outcome}"
                + (f" next={self.next_attempt_at}" if self.next_attempt_at else "")
                + (f" error={self.error!r}" if self.error else ""))


def log_attempt(line: AttemptLine) -> None:
    """Through ``logging`` (``mediasrv.webhooks``): where no access log takes the lines (tests,
    commands); ``mediasrv serve`` hands them to its access log's writer thread instead."""
    log.log(logging.INFO if line.ok else logging.WARNING, "webhook delivery: %s", line.text(),
            extra={"webhook": line._asdict()})


@dataclass
class Counters:
    """What /metrics reads (plain numbers, read at scrape time)."""

    attempts: dict[str, int] = field(default_factory=lambda: {"succeeded": 0, "retry": 0, "failed": 0})
    pending: int = 0
    due: int = 0
    oldest_pending_age_s: float = 0.0
    oldest_due_age_s: float = 0.0
    in_flight: int = 0
    disabled: int = 0


class Relay:
    def __init__(self, meta: MetaStore, sender: Sender, renderer: Renderer, mail: MailQueue | None = None, *,
                 concurrency: int = 32, per_endpoint: int = 4, claim_s: float = 60.0, poll_s: float = POLL_S,
                 settle_s: float = SETTLE_MIN_S, holder: str | None = None,
                 clock: Callable[[], float] = time.time, dashboard_url: str = "",
                 requests: Callable[[], int] = lambda: 0, yield_max_s: float = YIELD_MAX_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``clock``: Unix seconds for every decision (due times, claims, the three days before
        an endpoint is disabled); tests move it instead of waiting. ``settle_s``: how long a
        MongoDB delete's event may wait for its record to go (more than the store's timeouts).
        ``requests``: how many requests this process is answering now; while there are some,
        each endpoint gets one delivery at a time (``_dispatch``). ``monotonic``: the clock of
        claims' ends and of that wait, in seconds (tests move it too)."""
        self._meta, self._sender, self._renderer, self._mail = meta, sender, renderer, mail
        self._concurrency, self._per_endpoint = concurrency, per_endpoint
        self._claim_s, self._poll_s, self._settle_s = claim_s, poll_s, settle_s
        self.holder = holder or holder_id()
        self._clock = clock
        self._dashboard_url = dashboard_url
        self._requests = requests
        self._monotonic = monotonic
        self.log_attempt: Callable[[AttemptLine], None] = log_attempt
        """Where each attempt's line goes (``mediasrv serve``: the access log's writer)."""
        self._sending: dict[asyncio.Task[None], ClaimedDelivery] = {}
        self._queued: dict[str, collections.deque[tuple[float, ClaimedDelivery]]] = {}
        """Claimed here, waiting for a slot of their endpoint: (claim's end, monotonic; the delivery)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_stats = 0.0
        self._next_purge = 0.0
        self._renderings: dict[str, tuple[float, Callable[[FileRecord], dict[str, Any]]]] = {}
        self._outcomes: dict[str, DeliveryOutcome] = {}
        """Attempts made, not yet recorded: written together by ``_record_outcomes``."""
        self._recording: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._recheck: asyncio.TimerHandle | None = None
        self._yield_max_s = max(0.0, min(yield_max_s, claim_s - sender.timeout_s - 2 * CLAIM_MARGIN_S))
        """Never so long that the claim could not outlast the attempt after the wait."""
        self.counters = Counters()

    # --- life ------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def poke(self) -> None:
        """A change was recorded here: run a round now rather than at the next poll."""
        self._wake.set()

    async def stop(self, grace_s: float = 2.0) -> None:
        """No more claims; sends in flight get ``grace_s`` to finish, the rest are cancelled and
        their claims let go, so another process sends them at once (never lost, maybe twice)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        queued = [claimed for queue in self._queued.values() for _, claimed in queue]
        self._queued.clear()
        if self._sending:
            await asyncio.wait(set(self._sending), timeout=grace_s)
        left = dict(self._sending)
        for pending in left:
            pending.cancel()
        if left:
            await asyncio.wait(set(left), timeout=1.0)
        if self._recording is not None:
            await asyncio.wait({self._recording}, timeout=2.0)
        unsent = [c.delivery.id for c in (*left.values(), *queued)]
        if unsent:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._meta.release_deliveries(unsent, self.holder), 2.0)
        await self._sender.close()

    async def idle(self) -> None:
        """Until no delivery claimed here is queued or in flight, and every outcome is recorded."""
        while self._sending or self._background or (self._recording is not None and not self._recording.done()):
            await asyncio.wait({*self._sending, *self._background, *([self._recording] if self._recording else [])})

    async def _run(self) -> None:
        while True:
            busy = False
            try:
                busy = await self.round()
            except Exception as exc:  # a store outage: try again later, never end the loop
                log.warning("webhook relay round failed (%s); trying again in %.0f s", type(exc).__name__,
                            ERROR_PAUSE_S)
                await asyncio.sleep(ERROR_PAUSE_S)
            if not busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._poll_s)
                    await asyncio.sleep(GATHER_S)
            self._wake.clear()

    # --- one round ---------------------------------------------------------------------------

    async def round(self) -> bool:
        """Spread, claim, start the sends; True when there is more to do at once (a full batch
        of changes). Claims go to their endpoint's queue; ``_dispatch`` sends from the queues
        as slots free (``_done`` calls it, and wakes the loop to claim more). While requests are
        being answered and claims wait here already, none are added: they could not be sent
        before those (``_dispatch``), and a claim is a write beside the requests' own."""
        now = self._clock()
        spread = await self._meta.spread_events(iso_at(now), iso_at(now - self._settle_s), SPREAD_BATCH)
        await self._housekeeping(now)
        held = self._held()
        room = self._concurrency * PREFETCH - sum(held.values())
        if room > 0 and not (any(self._queued.values()) and self._requests() > 0):
            started = self._monotonic()
            claims = await self._meta.claim_deliveries(self.holder, iso_at(now), iso_at(now + self._claim_s), room,
                                                       self._per_endpoint * PREFETCH, held)
            ends = started + self._claim_s
            for claimed in claims:
                self._queued.setdefault(claimed.webhook.id, collections.deque()).append((ends, claimed))
        self._dispatch()
        return spread >= SPREAD_BATCH

    def _held(self) -> dict[str, int]:
        """Deliveries claimed here by endpoint, sending or queued."""
        held = {hook: len(queue) for hook, queue in self._queued.items() if queue}
        for claimed in self._sending.values():
            held[claimed.webhook.id] = held.get(claimed.webhook.id, 0) + 1
        return held

    def _dispatch(self) -> None:
        """Start sends from the endpoints' queues, in turn, within both bounds (all endpoints,
        one endpoint). A delivery whose claim would not outlast its attempt is let go unsent.

        Requests come first: while this process is answering some, a delivery claimed less
        than ``YIELD_MAX_S`` ago waits (re-checked every ``YIELD_CHECK_S``), and older ones go
        one per endpoint at a time (every endpoint still gets its turn, so none waits behind
        another); once no request is being answered, they all go at full speed. A burst of
        uploads then keeps its rate and its events follow it by a second or two; under
        constant load events wait ``YIELD_MAX_S`` at most. Sent beside the burst instead (at
        any concurrency), the deliveries' share of the process cost the burst a fifth of its
        rate on two cores (``scripts/bench.py --only webhooks``: ~0.7 ms of CPU per delivery
        against ~4 ms per upload, and the receiver's beside them)."""
        busy = self._requests() > 0
        per_endpoint = 1 if busy else self._per_endpoint
        now = self._monotonic()
        waiting = False
        sending: dict[str, int] = {}
        for claimed in self._sending.values():
            sending[claimed.webhook.id] = sending.get(claimed.webhook.id, 0) + 1
        expired: list[str] = []
        progress = True
        while progress and len(self._sending) < self._concurrency:
            progress = False
            for hook_id, queue in list(self._queued.items()):
                if not queue:
                    del self._queued[hook_id]
                    continue
                if sending.get(hook_id, 0) >= per_endpoint or len(self._sending) >= self._concurrency:
                    continue
                if busy and now - (queue[0][0] - self._claim_s) < self._yield_max_s:
                    waiting = True
                    continue
                ends, claimed = queue.popleft()
                if ends - self._monotonic() < self._sender.timeout_s + CLAIM_MARGIN_S:
                    expired.append(claimed.delivery.id)
                    progress = True
                    continue
                task = asyncio.get_running_loop().create_task(self._deliver(claimed))
                self._sending[task] = claimed
                task.add_done_callback(self._done)
                sending[hook_id] = sending.get(hook_id, 0) + 1
                progress = True
        self.counters.in_flight = len(self._sending)
        if expired:
            self._release(expired)
        if waiting and self._recheck is None:
            self._recheck = asyncio.get_running_loop().call_later(YIELD_CHECK_S, self._rechecked)

    def _rechecked(self) -> None:
        self._recheck = None
        self._dispatch()

    def _release(self, delivery_ids: list[str]) -> None:
        async def release() -> None:
            with contextlib.suppress(StoreError):
                await self._meta.release_deliveries(delivery_ids, self.holder)
        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._sending.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook delivery failed unexpectedly", exc_info=task.exception())
        self._dispatch()
        if sum(map(len, self._queued.values())) < self._concurrency:
            self._wake.set()  # running low: claim more (not after every delivery: a claim serves many)

    async def _housekeeping(self, now: float) -> None:
        if now >= self._next_stats:
            self._next_stats = now + STATS_EVERY_S
            stats = await self._meta.delivery_stats(iso_at(now))
            c = self.counters
            c.pending, c.due = stats.pending, stats.due
            c.oldest_pending_age_s = _age(now, stats.oldest_pending_at)
            c.oldest_due_age_s = _age(now, stats.oldest_due_at)
        if now >= self._next_purge:
            self._next_purge = now + PURGE_EVERY_S
            await self._meta.purge_deliveries(iso_at(now - KEEP_DELIVERIES.total_seconds()))

    # --- one delivery ------------------------------------------------------------------------

    async def _deliver(self, claimed: ClaimedDelivery) -> None:
        hook, event = claimed.webhook, claimed.event
        if not hook.enabled:  # disabled between the claim and now
            self._conclude(claimed, Attempt(ok=False, status=None, error="endpoint disabled", duration_ms=0),
                           give_up=True)
            return
        try:
            body = await render_body(event, self._rendering)
        except StoreError as exc:  # the owner's custom domain could not be read: an attempt failed
            attempt = Attempt(ok=False, status=None, error=f"not sent: {type(exc).__name__}", duration_ms=0)
        else:
            attempt = await self._sender.send(hook.url, hook.secret, event.id, body)
        self._conclude(claimed, attempt)
        try:
            if attempt.ok:
                if hook.failing_since is not None:
                    await self._meta.note_webhook_result(hook.id, True, iso_at(self._clock()))
            else:
                await self._note_failure(claimed)
        except StoreError as exc:
            log.warning("webhook %s: its health could not be recorded (%s)", hook.id, type(exc).__name__)

    async def _rendering(self, user_id: str) -> Callable[[FileRecord], dict[str, Any]]:
        """The account's File rendering, kept ``RENDER_CACHE_S``: a burst of one account's
        events looks its custom domain up once, not once per delivery."""
        now = self._monotonic()
        kept = self._renderings.get(user_id)
        if kept is not None and now - kept[0] < RENDER_CACHE_S:
            return kept[1]
        render = await self._renderer(user_id)
        if len(self._renderings) > 1000:
            self._renderings.clear()
        self._renderings[user_id] = (now, render)
        return render

    def _conclude(self, claimed: ClaimedDelivery, attempt: Attempt, *, give_up: bool = False) -> None:
        """What follows the attempt (succeeded, retried at the schedule's next step, or given
        up), queued for recording: the slot is free once this returns."""
        now = self._clock()
        attempts = claimed.delivery.attempts + 1
        delay = None if give_up or attempts >= MAX_ATTEMPTS else retry_delay_s(attempts)
        if attempt.ok:
            state, next_at, outcome = DELIVERY_SUCCEEDED, None, "succeeded"
        elif delay is None:
            state, next_at, outcome = DELIVERY_FAILED, None, "failed"
        else:
            state, next_at, outcome = DELIVERY_PENDING, iso_at(now + delay), "retry"
        result = DeliveryOutcome(state=state, at=iso_at(now), next_attempt_at=next_at,
                                 response_status=attempt.status, error=attempt.error,
                                 duration_ms=attempt.duration_ms)
        self._outcomes[claimed.delivery.id] = result
        if self._recording is None or self._recording.done():
            self._recording = asyncio.get_running_loop().create_task(self._record_outcomes())
        self.counters.attempts[outcome] += 1
        self._log(claimed, attempt, attempts, outcome, next_at)

    async def _record_outcomes(self) -> None:
        """Write the queued outcomes, as many as have gathered, one write at a time (one
        write per delivery cost more than the delivery). An outcome that cannot be written is
        sent again by whoever claims it once its claim runs out: at least once."""
        while self._outcomes:
            await asyncio.sleep(RECORD_GATHER_S)
            batch, self._outcomes = self._outcomes, {}
            try:
                recorded = await self._meta.finish_deliveries(self.holder, batch)
            except StoreError as exc:
                log.warning("%d webhook delivery outcomes could not be recorded (%s); they are sent again "
                            "once their claims run out", len(batch), type(exc).__name__)
                continue
            if recorded < len(batch):
                log.info("%d webhook delivery outcomes not recorded: the endpoint was disabled or deleted, or "
                         "the claim had run out and another process took the delivery", len(batch) - recorded)

    async def _note_failure(self, claimed: ClaimedDelivery) -> None:
        now = self._clock()
        hook = await self._meta.note_webhook_result(claimed.webhook.id, False, iso_at(now))
        if hook is None or not hook.enabled or hook.failing_since is None:
            return
        if now - parse_iso(hook.failing_since).timestamp() < DISABLE_AFTER.total_seconds():
            return
        if not await self._meta.set_webhook_enabled(hook.id, False, iso_at(now), "failing"):
            return  # another process disabled it first (and told the owner)
        self.counters.disabled += 1
        log.warning("webhook %s of user %s disabled: every attempt failed since %s", hook.id, hook.user_id,
                    hook.failing_since)
        await self._tell_owner(hook.user_id, hook.id, origin_of(hook.url), hook.failing_since)

    async def _tell_owner(self, user_id: str, webhook_id: str, where: str, since: str) -> None:
        if self._mail is None:
            return
        user = await self._meta.get_user(user_id)
        if user is None:  # the account is gone: nobody to tell
            return
        self._mail.submit(Message(
            to=user.email, subject="A webhook endpoint was disabled",
            text=(f"Every delivery to your webhook endpoint {webhook_id} ({where}) has failed since {since}, "
                  "so it has been disabled and its pending events dropped.\n\n"
                  "Fix the receiver, then enable the endpoint again in the dashboard's Webhooks page "
                  f"(or PATCH /webhooks/{webhook_id} with {{\"enabled\": true}}):\n\n{self._dashboard_url}\n")))

    def _log(self, claimed: ClaimedDelivery, attempt: Attempt, attempts: int, outcome: str,
             next_at: str | None) -> None:
        hook, event = claimed.webhook, claimed.event
        self.log_attempt(AttemptLine(time.time(), attempt.ok, attempt.status, origin_of(hook.url), attempt.duration_ms,
                                     hook.user_id, hook.id, event.type, event.id, attempts, outcome, next_at,
                                     attempt.error))


def iso_at(unix_s: float) -> str:
    return iso(dt.datetime.fromtimestamp(unix_s, dt.UTC))


def _age(now: float, stamp: str | None) -> float:
    return max(0.0, now - parse_iso(stamp).timestamp()) if stamp else 0.0
