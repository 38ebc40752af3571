"""mediasrv.core.mail against a real SMTP sink (aiosmtpd in its own thread on 127.0.0.1)."""
from __future__ import annotations

import asyncio
import datetime as dt
import email
import email.policy
import ipaddress
import logging
import pathlib
import smtplib
import socket
import ssl
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from mediasrv.base.settings import Settings
from mediasrv.core.mail import MailQueue, Message, OutboxMailer, SmtpMailer, make_mailer
from tests.launcher import free_port

TOKEN = "tok3n-S3CRET-abc"
LINK = f"https://media.example.test/v1/auth/confirm?token={TOKEN}"
TEXT = f"Grüße — please confirm your address:\n\n{LINK}\n\nThe mediasrv team\n"
SENDER = "mediasrv@mail.example.test"


def _message(to: str = "alice@example.test") -> Message:
    return Message(to=to, subject="Bestätigen ✓", text=TEXT)


# --- the SMTP sink ---------------------------------------------------------------------------

@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    mail_options: list[str]
    content: bytes
    tls: bool

    def parsed(self) -> email.message.EmailMessage:
        return email.message_from_bytes(self.content, policy=email.policy.default)  # type: ignore[return-value]


@dataclass
class Sink:
    hold: threading.Event | None = None
    """When given, a message's DATA is answered only once it is set (the test decides when)."""
    entered: threading.Event = field(default_factory=threading.Event)
    """Set when a DATA command arrives."""
    drop_8bitmime: bool = False
    quit_reply: str = "221 Bye"
    received: list[Received] = field(default_factory=list)
    logins: list[tuple[bytes, bytes]] = field(default_factory=list)

    async def handle_EHLO(self, server: Any, session: Any, envelope: Any, hostname: str,
                          responses: list[str]) -> list[str]:
        session.host_name = hostname
        if self.drop_8bitmime:
            return [r for r in responses if "8BITMIME" not in r.upper()]
        return responses

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.entered.set()
        if self.hold is not None:  # the sink runs its own loop in its own thread: wait off it
            await asyncio.to_thread(self.hold.wait, 10)  # a bound only so that a regression fails
        self.received.append(Received(
            mail_from=envelope.mail_from, rcpt_tos=list(envelope.rcpt_tos),
            mail_options=list(envelope.mail_options), content=envelope.original_content,
            tls=server.transport.get_extra_info("ssl_object") is not None))
        return "250 OK"

    async def handle_QUIT(self, server: Any, session: Any, envelope: Any) -> str:
        return self.quit_reply

    def authenticator(self, server: Any, session: Any, envelope: Any, mechanism: str,
                      auth_data: Any) -> AuthResult:
        assert isinstance(auth_data, LoginPassword)
        self.logins.append((auth_data.login, auth_data.password))
        ok = (auth_data.login, auth_data.password) == (b"a@b", b"p@ss")
        return AuthResult(success=ok, handled=False)  # handled=False: aiosmtpd answers 535 itself


@pytest.fixture
def start_sink() -> Iterator[Callable[..., tuple[Sink, int]]]:
    """Start an aiosmtpd sink; keyword arguments go to the Controller (and so to SMTP)."""
    controllers: list[Controller] = []

    def start(sink: Sink | None = None, **kwargs: Any) -> tuple[Sink, int]:
        sink = sink or Sink()
        port = free_port()
        controller = Controller(sink, hostname="127.0.0.1", port=port, server_hostname="mx.test",
                                **kwargs)
        controller.start()
        controllers.append(controller)
        return sink, port

    yield start
    for controller in controllers:
        controller.stop()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for localhost/127.0.0.1: (server context, trusting client context)."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path_factory.mktemp("tls")
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert_file, key_file)
    client_ctx = ssl.create_default_context(cafile=str(cert_file))
    return server_ctx, client_ctx


# --- SmtpMailer -------------------------------------------------------------------------------

def _check_delivered(got: Received, to: str = "alice@example.test") -> None:
    assert got.mail_from == SENDER
    assert got.rcpt_tos == [to]
    parsed = got.parsed()
    assert parsed["From"] == SENDER
    assert parsed["To"] == to
    assert parsed["Subject"] == "Bestätigen ✓"
    assert parsed["Date"] and parsed["Message-ID"].endswith("@mail.example.test>")
    body = parsed.get_content()
    assert body.replace("\r\n", "\n") == TEXT
    assert LINK + "\n" in body.replace("\r\n", "\n")


async def test_smtp_delivers_utf8_message(io_loop: Any, start_sink: Any) -> None:
    sink, port = start_sink()
    await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER).send(_message())
    [got] = sink.received
    _check_delivered(got)
    assert not got.tls  # nothing offered STARTTLS
    assert "BODY=8BITMIME" in got.mail_options  # 8bit body declared to the server


async def test_smtp_failing_quit_after_acceptance_is_success(io_loop: Any, start_sink: Any) -> None:
    # Raising here would make MailQueue send the (already accepted) message again.
    sink, port = start_sink(Sink(quit_reply="421 closing"))
    await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER).send(_message())
    assert len(sink.received) == 1


async def test_smtp_without_8bitmime_sends_7bit_body(io_loop: Any, start_sink: Any) -> None:
    sink, port = start_sink(Sink(drop_8bitmime=True))
    await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER).send(_message())
    [got] = sink.received
    got.content.decode("ascii")  # 7-bit clean on the wire
    assert got.parsed()["Content-Transfer-Encoding"] == "quoted-printable"
    assert "BODY=8BITMIME" not in got.mail_options
    _check_delivered(got)


@pytest.mark.parametrize("userinfo", ["a@b:p%40ss", "a%40b:p%40ss"])
async def test_smtp_login_with_percent_decoded_credentials(io_loop: Any, start_sink: Any,
                                                           userinfo: str) -> None:
    sink = Sink()
    sink, port = start_sink(sink, authenticator=sink.authenticator, auth_require_tls=False)
    await SmtpMailer(f"smtp://{userinfo}@127.0.0.1:{port}", SENDER).send(_message())
    assert sink.logins == [(b"a@b", b"p@ss")]
    _check_delivered(sink.received[0])


@pytest.mark.parametrize("to", ["bob,eve@example.test", "bob(x)eve@example.test"])
async def test_smtp_refuses_ambiguous_recipient(io_loop: Any, start_sink: Any, to: str) -> None:
    sink, port = start_sink()
    with pytest.raises(ValueError):
        await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER).send(_message(to))
    assert not sink.received


async def test_smtp_wrong_credentials_raise(io_loop: Any, start_sink: Any) -> None:
    sink = Sink()
    sink, port = start_sink(sink, authenticator=sink.authenticator, auth_require_tls=False)
    with pytest.raises(smtplib.SMTPAuthenticationError):
        await SmtpMailer(f"smtp://a@b:wrong@127.0.0.1:{port}", SENDER).send(_message())
    assert not sink.received


async def test_smtp_uses_starttls_when_offered(io_loop: Any, start_sink: Any, certs: Any) -> None:
    server_ctx, client_ctx = certs
    sink, port = start_sink(tls_context=server_ctx, require_starttls=True)
    await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER, ssl_context=client_ctx).send(_message())
    [got] = sink.received
    assert got.tls
    _check_delivered(got)


async def test_smtp_logs_in_only_after_starttls(io_loop: Any, start_sink: Any, certs: Any) -> None:
    server_ctx, client_ctx = certs
    sink = Sink()
    # auth_require_tls=True (the default): AUTH is only offered once the connection is encrypted.
    sink, port = start_sink(sink, tls_context=server_ctx, authenticator=sink.authenticator)
    await SmtpMailer(f"smtp://a%40b:p%40ss@127.0.0.1:{port}", SENDER,
                     ssl_context=client_ctx).send(_message())
    assert sink.logins == [(b"a@b", b"p@ss")]
    assert sink.received[0].tls


async def test_smtp_starttls_with_untrusted_certificate_fails(io_loop: Any, start_sink: Any,
                                                              certs: Any) -> None:
    server_ctx, _ = certs
    sink, port = start_sink(tls_context=server_ctx)
    # Default (system) trust store: the self-signed certificate is refused, no clear-text fallback.
    with pytest.raises(ssl.SSLCertVerificationError):
        await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER).send(_message())
    assert not sink.received


async def test_smtps_implicit_tls(io_loop: Any, start_sink: Any, certs: Any) -> None:
    server_ctx, client_ctx = certs
    sink, port = start_sink(ssl_context=server_ctx)
    await SmtpMailer(f"smtps://localhost:{port}", SENDER, ssl_context=client_ctx).send(_message())
    [got] = sink.received
    assert got.tls
    _check_delivered(got)


async def test_smtp_connection_refused_raises(io_loop: Any) -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(ConnectionRefusedError):
        await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER, timeout_s=2.0).send(_message())


async def test_smtp_silent_server_times_out(io_loop: Any) -> None:
    with socket.socket() as listener:  # accepts TCP connections (backlog) but never greets
        listener.bind(("127.0.0.1", 0))
        listener.listen(5)
        port = listener.getsockname()[1]
        with pytest.raises(OSError):  # the timeout, since the server never says a word
            await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER, timeout_s=0.3).send(_message())


async def test_smtp_send_does_not_block_event_loop(io_loop: Any, start_sink: Any) -> None:
    """The sink holds the DATA command until the test lets it go: had the send blocked the
    event loop, this test could not run (nor observe the send unfinished) until it ended."""
    sink, port = start_sink(Sink(hold=threading.Event()))
    send = asyncio.ensure_future(SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER).send(_message()))
    try:
        assert await asyncio.to_thread(sink.entered.wait, 10), "the message never reached DATA"
        assert not send.done() and not sink.received  # held by the sink, and the loop runs on
    finally:
        assert sink.hold is not None
        sink.hold.set()
    await send
    assert len(sink.received) == 1


async def test_smtp_never_logs_the_body(io_loop: Any, start_sink: Any,
                                        caplog: pytest.LogCaptureFixture) -> None:
    sink, port = start_sink()
    caplog.set_level(logging.DEBUG)
    await SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER).send(_message())
    assert sink.received
    ours = [r for r in caplog.records if not r.name.startswith("mail.log")]  # not the sink's own log
    assert all(TOKEN not in r.getMessage() for r in ours)


def test_smtp_url_parsing() -> None:
    plain = SmtpMailer("smtp://mail.example.test", SENDER)
    assert (plain.host, plain.port, plain.implicit_tls) == ("mail.example.test", 25, False)
    tls = SmtpMailer("smtps://u:secret@mail.example.test", SENDER)
    assert (tls.host, tls.port, tls.implicit_tls) == ("mail.example.test", 465, True)
    assert "secret" not in repr(tls)
    assert SmtpMailer("SMTP://[::1]:2525", SENDER).port == 2525
    for bad in ("http://mail.example.test", "smtp://", "smtp://host:notaport", "smtp://host:99999"):
        with pytest.raises(ValueError):
            SmtpMailer(bad, SENDER)


# --- OutboxMailer -----------------------------------------------------------------------------

async def test_outbox_writes_private_eml_and_logs_link(io_loop: Any, tmp_path: pathlib.Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    outbox = tmp_path / "data" / "outbox"
    caplog.set_level(logging.INFO, logger="mediasrv.mail")
    mailer = OutboxMailer(outbox)
    await mailer.send(_message())
    await mailer.send(_message("bob@example.test"))

    assert stat.S_IMODE(outbox.stat().st_mode) == 0o700
    files = sorted(outbox.iterdir())
    assert len(files) == 2
    for path in files:
        assert path.suffix == ".eml"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    parsed = email.message_from_bytes(files[0].read_bytes(), policy=email.policy.default)
    assert parsed["To"] in ("alice@example.test", "bob@example.test")
    assert parsed["Subject"] == "Bestätigen ✓"
    assert parsed["From"] and parsed["Date"] and parsed["Message-ID"]
    assert parsed.get_content().replace("\r\n", "\n") == TEXT
    assert LINK.encode() in files[0].read_bytes()  # readable as is, not encoded

    records = [r for r in caplog.records if r.name == "mediasrv.mail" and r.levelno == logging.INFO]
    assert len(records) == 2
    text = records[0].getMessage()
    assert "alice@example.test" in text and "Bestätigen ✓" in text and LINK in text
    assert any(str(path) in r.getMessage() for r in records for path in files)


async def test_outbox_logs_every_link(io_loop: Any, tmp_path: pathlib.Path,
                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mediasrv.mail")
    text = "Reset:\nhttps://a.test/reset?t=1\nor cancel:\nhttp://b.test/cancel?t=2\n"
    await OutboxMailer(tmp_path).send(Message(to="x@example.test", subject="s", text=text))
    logged = caplog.records[-1].getMessage()
    assert "https://a.test/reset?t=1" in logged and "http://b.test/cancel?t=2" in logged


def test_message_rejects_header_injection() -> None:
    with pytest.raises(ValueError):
        Message(to="alice@example.test", subject="hi\r\nBcc: eve@example.test", text="")
    with pytest.raises(ValueError):
        Message(to="alice@example.test\nBcc: eve@example.test", subject="hi", text="")
    with pytest.raises(ValueError):
        Message(to="not-an-address", subject="hi", text="")


def test_make_mailer(tmp_path: pathlib.Path) -> None:
    outbox = make_mailer(Settings(data_dir=tmp_path))
    assert isinstance(outbox, OutboxMailer)
    assert outbox.outbox_dir == tmp_path / "outbox"
    smtp = make_mailer(Settings(data_dir=tmp_path, smtp_url="smtps://mail.example.test",
                                mail_from=SENDER))
    assert isinstance(smtp, SmtpMailer)
    assert (smtp.host, smtp.port, smtp.mail_from) == ("mail.example.test", 465, SENDER)


# --- MailQueue --------------------------------------------------------------------------------

class FakeMailer:
    def __init__(self, failures: int = 0, delay_s: float = 0.0,
                 error: Exception | None = None) -> None:
        self.failures = failures
        self.delay_s = delay_s
        self.error = error or ConnectionRefusedError(111, "Connection refused")
        self.attempts = 0
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.attempts += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.attempts <= self.failures:
            raise self.error
        self.sent.append(message)


async def test_queue_submit_returns_at_once_and_retries(io_loop: Any) -> None:
    mailer = FakeMailer(failures=1)
    queue = MailQueue(mailer, retries=3, backoff_s=0.01)
    queue.submit(_message())
    assert mailer.attempts == 0  # nothing ran yet: submit only schedules
    await queue.drain(5)
    assert mailer.attempts == 2
    assert mailer.sent == [_message()]
    assert queue.pending == 0


async def test_queue_makes_a_message_in_the_background_and_logs_one_it_cannot_make(
        io_loop: Any, caplog: pytest.LogCaptureFixture) -> None:
    mailer = FakeMailer()
    queue = MailQueue(mailer, retries=0, backoff_s=0.01)

    async def made() -> Message:
        return _message()

    async def unmade() -> Message:
        raise ConnectionError("the store is down")

    queue.submit_made(made())
    queue.submit_made(unmade())
    assert queue.pending == 2 and mailer.attempts == 0  # nothing ran yet: only scheduled
    await queue.drain(5)
    assert mailer.sent == [_message()] and queue.pending == 0
    assert "an e-mail could not be made: ConnectionError: the store is down" in caplog.text


async def test_queue_gives_up_with_warning_naming_domain_only(io_loop: Any,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="mediasrv.mail")
    mailer = FakeMailer(failures=99)
    queue = MailQueue(mailer, retries=2, backoff_s=0.01)
    queue.submit(_message("alice@example.test"))
    await queue.drain(5)
    assert mailer.attempts == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "example.test" in warnings[0].getMessage()
    assert "alice" not in caplog.text and TOKEN not in caplog.text


@pytest.mark.parametrize("error", [
    smtplib.SMTPRecipientsRefused({"alice@example.test": (550, b"no such user")}),
    smtplib.SMTPDataError(554, b"rejected"),
    ValueError("unusable message"),
])
async def test_queue_does_not_retry_permanent_failure(io_loop: Any, error: Exception) -> None:
    mailer = FakeMailer(failures=99, error=error)
    queue = MailQueue(mailer, retries=3, backoff_s=0.01)
    queue.submit(_message())
    await queue.drain(5)
    assert mailer.attempts == 1


async def test_queue_retries_temporary_smtp_failure(io_loop: Any) -> None:
    mailer = FakeMailer(failures=1, error=smtplib.SMTPDataError(451, b"try later"))
    queue = MailQueue(mailer, retries=3, backoff_s=0.01)
    queue.submit(_message())
    await queue.drain(5)
    assert mailer.attempts == 2 and len(mailer.sent) == 1


async def test_queue_drain_waits_for_pending_sends(io_loop: Any) -> None:
    mailer = FakeMailer(delay_s=0.2)
    queue = MailQueue(mailer)
    for to in ("a@example.test", "b@example.test", "c@example.test"):
        queue.submit(_message(to))
    assert queue.pending == 3
    await queue.drain(5)
    assert sorted(m.to for m in mailer.sent) == ["a@example.test", "b@example.test", "c@example.test"]


async def test_queue_drain_gives_up_after_timeout(io_loop: Any, caplog: pytest.LogCaptureFixture) -> None:
    mailer = FakeMailer(delay_s=30)
    queue = MailQueue(mailer)
    queue.submit(_message())
    await queue.drain(0.1)  # the send takes 30 s: drain gives up, the message is dropped
    assert queue.pending == 0 and not mailer.sent
    assert any("abandoned" in r.getMessage() for r in caplog.records)


async def test_queue_delivers_through_real_smtp(io_loop: Any, start_sink: Any) -> None:
    hold = threading.Event()
    sink, port = start_sink(Sink(hold=hold))
    queue = MailQueue(SmtpMailer(f"smtp://127.0.0.1:{port}", SENDER))
    queue.submit(_message())  # returns at once: the sink could not have answered yet
    assert queue.pending == 1 and not sink.received
    hold.set()
    await queue.drain(10)
    _check_delivered(sink.received[0])
