"""Outgoing e-mail: SMTP delivery, a file outbox for development, and a background queue.

Message bodies carry single-use tokens, so SMTP delivery never logs them. Without
``MEDIASRV_SMTP_URL`` each e-mail is written to ``DATA_DIR/outbox/`` as an ``.eml`` file and
its links are logged at INFO (the documented development behaviour).

All blocking work (smtplib, file I/O) runs in an executor so the event loop never waits on it,
and ``MailQueue`` sends in the background so a request never waits for delivery either.
"""
from __future__ import annotations

import asyncio
import contextlib
import email.policy
import email.utils
import logging
import os
import pathlib
import re
import secrets
import smtplib
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.message import EmailMessage
from typing import TYPE_CHECKING, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from mediasrv.base.settings import Settings

log = logging.getLogger("mediasrv.mail")

_T = TypeVar("_T")
_FORBIDDEN_HEADER_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_LINK = re.compile(r"https?://\S+")
_LINK_TRAILING = ".,;:!?)]}>'\""


@dataclass(frozen=True)
class Message:
    """One e-mail to one recipient. Links in ``text`` appear as bare URLs on their own lines."""

    to: str
    subject: str
    text: str

    def __post_init__(self) -> None:
        # Header values must be single lines: a CR/LF would let a value inject headers.
        for name in ("to", "subject"):
            if _FORBIDDEN_HEADER_CHARS.search(getattr(self, name)):
                raise ValueError(f"Message.{name} must not contain control characters")
        if "@" not in self.to:
            raise ValueError("Message.to must be an e-mail address")


class Mailer(Protocol):
    async def send(self, message: Message) -> None: ...


def _domain_of(address: str) -> str:
    return email.utils.parseaddr(address)[1].rpartition("@")[2] or "localhost"


def _build(message: Message, mail_from: str, *, cte: str | None = None) -> EmailMessage:
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = mail_from
    msg["To"] = message.to
    msg["Subject"] = message.subject
    msg["Date"] = email.utils.formatdate(usegmt=True)
    # An explicit domain: make_msgid() would otherwise do a (possibly slow) FQDN lookup.
    msg["Message-ID"] = email.utils.make_msgid(domain=_domain_of(mail_from))
    msg.set_content(message.text, charset="utf-8", cte=cte)
    return msg


async def _in_executor(fn: Callable[..., _T], *args: object) -> _T:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class SmtpMailer:
    """Delivers through an SMTP server given as ``smtp://`` or ``smtps://`` URL.

    ``smtp://[user:password@]host[:port]`` (port 25) upgrades with STARTTLS whenever the server
    offers it; ``smtps://…`` (port 465) uses implicit TLS. User and password are
    percent-decoded; when given, the mailer logs in. ``ssl_context`` (default: the system's
    verifying context) is used for both STARTTLS and implicit TLS.
    """

    def __init__(self, url: str, mail_from: str, *, timeout_s: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("smtp", "smtps"):
            raise ValueError("SMTP URL scheme must be smtp or smtps")
        try:
            port = parts.port
        except ValueError:
            raise ValueError("SMTP URL has an invalid port") from None
        if not parts.hostname:
            raise ValueError("SMTP URL has no host")
        self.implicit_tls = scheme == "smtps"
        self.host = parts.hostname
        self.port = port or (465 if self.implicit_tls else 25)
        self.mail_from = mail_from
        self.timeout_s = timeout_s
        self._username = unquote(parts.username) if parts.username is not None else None
        self._password = unquote(parts.password) if parts.password is not None else ""
        self._ssl_context = ssl_context
        self._warned_cleartext = False

    def __repr__(self) -> str:  # never show the password
        scheme = "smtps" if self.implicit_tls else "smtp"
        return f"SmtpMailer({scheme}://{self.host}:{self.port})"

    def _context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    async def send(self, message: Message) -> None:
        await _in_executor(self._send_blocking, message)

    def _send_blocking(self, message: Message) -> None:
        # smtplib would quietly take a different envelope recipient from "bob,eve@x.test"
        # ("<bob>") or "a(b)c@x.test"; send only to an address that parses as exactly itself.
        if email.utils.getaddresses([message.to]) != [("", message.to)]:
            raise ValueError("recipient address cannot be used as an SMTP envelope address")
        smtp: smtplib.SMTP
        if self.implicit_tls:
            smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout_s,
                                    context=self._context())
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout_s)
        try:
            self._converse(smtp, message)
            # The message is accepted: a failing QUIT must not make the queue send it again.
            with contextlib.suppress(smtplib.SMTPException, OSError):
                smtp.quit()
        finally:
            smtp.close()

    def _converse(self, smtp: smtplib.SMTP, message: Message) -> None:
        smtp.ehlo()
        tls = self.implicit_tls
        if not tls and smtp.has_extn("starttls"):
            smtp.starttls(context=self._context())
            smtp.ehlo()
            tls = True
        if self._username is not None:
            if not tls and not self._warned_cleartext:
                self._warned_cleartext = True
                log.warning("SMTP server %s:%s offers no TLS; credentials are sent in clear text",
                            self.host, self.port)
            smtp.login(self._username, self._password)
        msg = _build(message, self.mail_from)
        options: tuple[str, ...] = ()
        if msg["Content-Transfer-Encoding"] == "8bit":
            if smtp.has_extn("8bitmime"):
                options = ("BODY=8BITMIME",)
            else:
                msg = _build(message, self.mail_from, cte="quoted-printable")
        smtp.send_message(msg, to_addrs=[message.to], mail_options=options)


class OutboxMailer:
    """Writes each e-mail to ``outbox_dir`` as ``<timestamp>-<random>.eml`` and logs its links."""

    def __init__(self, outbox_dir: pathlib.Path, mail_from: str = "mediasrv@localhost") -> None:
        self.outbox_dir = pathlib.Path(outbox_dir)
        self.mail_from = mail_from

    async def send(self, message: Message) -> None:
        path = await _in_executor(self._write_blocking, message)
        links = [link.rstrip(_LINK_TRAILING) for link in _LINK.findall(message.text)]
        log.info("e-mail to %s, subject %r, written to %s; links: %s", message.to, message.subject,
                 path, " ".join(links) or "(none)")

    def _write_blocking(self, message: Message) -> pathlib.Path:
        if not self.outbox_dir.is_dir():
            self.outbox_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.outbox_dir, 0o700)
        # 8bit keeps the file readable as plain text (no quoted-printable soft breaks in links).
        data = _build(message, self.mail_from, cte="8bit").as_bytes()
        now_us = time.time_ns() // 1000
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_us // 1_000_000))
        stamp += f".{now_us % 1_000_000:06d}Z"
        path = self.outbox_dir / f"{stamp}-{secrets.token_hex(6)}.eml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(data)
        finally:
            if fd >= 0:
                os.close(fd)
        return path


def _permanent(exc: BaseException) -> bool:
    """A 5xx answer (or an unusable message) will not change on retry."""
    if isinstance(exc, ValueError):
        return True
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return bool(exc.recipients) and all(code >= 500 for code, _ in exc.recipients.values())
    return isinstance(exc, smtplib.SMTPResponseException) and 500 <= exc.smtp_code < 600


def _describe(exc: BaseException) -> str:
    """The error without server text (which may echo addresses) and never the body."""
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"{type(exc).__name__} {exc.smtp_code}"
    if isinstance(exc, smtplib.SMTPException):
        return type(exc).__name__
    return f"{type(exc).__name__}: {exc}"


class MailQueue:
    """Sends in the background so a request never waits for SMTP (and response timing reveals nothing).

    A failed send is retried ``retries`` times, waiting ``backoff_s``, then twice as long, and so
    on; a final failure is logged at WARNING with the recipient's domain only. At most
    ``concurrency`` sends run at once.
    """

    def __init__(self, mailer: Mailer, *, retries: int = 3, backoff_s: float = 1.0,
                 concurrency: int = 4) -> None:
        self.mailer = mailer
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        return len(self._tasks)

    def submit(self, message: Message) -> None:
        """Schedule ``message`` on the running loop and return at once."""
        task = asyncio.get_running_loop().create_task(self._deliver(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def submit_made(self, making: Awaitable[Message]) -> None:
        """``submit`` for a message whose making writes something first (a reset link's token):
        made in the background too, so an answer that may or may not have a message behind it
        takes the same time either way. A message that cannot be made is logged, not sent."""
        task = asyncio.get_running_loop().create_task(self._make_and_deliver(making))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _make_and_deliver(self, making: Awaitable[Message]) -> None:
        try:
            message = await making
        except Exception as exc:  # a store outage: the request was answered already
            log.warning("an e-mail could not be made: %s", _describe(exc))
            return
        await self._deliver(message)

    async def _deliver(self, message: Message) -> None:
        domain = _domain_of(message.to)
        try:
            for attempt in range(self.retries + 1):
                try:
                    async with self._slots:
                        await self.mailer.send(message)
                    return
                except Exception as exc:
                    if attempt >= self.retries or _permanent(exc):
                        log.warning("e-mail to a recipient at %s failed after %d attempt(s): %s",
                                    domain, attempt + 1, _describe(exc))
                        return
                    delay = self.backoff_s * 2 ** attempt
                    log.debug("e-mail to a recipient at %s failed (%s); retrying in %.1f s",
                              domain, _describe(exc), delay)
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            log.warning("e-mail to a recipient at %s abandoned at shutdown", domain)
            raise

    async def drain(self, timeout_s: float) -> None:
        """At shutdown: wait up to ``timeout_s`` for pending sends, then cancel the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while self._tasks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait(set(self._tasks), timeout=remaining)
        if self._tasks:
            leftover = set(self._tasks)
            for task in leftover:
                task.cancel()
            await asyncio.gather(*leftover, return_exceptions=True)


def make_mailer(settings: Settings) -> Mailer:
    """SMTP when ``MEDIASRV_SMTP_URL`` is set, else the ``DATA_DIR/outbox/`` directory."""
    if settings.smtp_url:
        return SmtpMailer(settings.smtp_url, settings.mail_from)
    return OutboxMailer(settings.data_dir / "outbox", settings.mail_from)
