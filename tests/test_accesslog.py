"""The access log: one line per request from its own thread, no query string, 5xx at ERROR."""
from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
import tornado.web

from mediasrv.web.accesslog import AccessLog
from tests.conftest import Api


@pytest.fixture
def lines(app: tornado.web.Application) -> Iterator[io.StringIO]:
    """The server's default level (INFO); pytest leaves the root logger at WARNING."""
    out = io.StringIO()
    access = AccessLog(stream=out)
    access.start()
    app.settings["log_function"] = access
    logging.getLogger("mediasrv.access").setLevel(logging.INFO)
    yield out
    logging.getLogger("mediasrv.access").setLevel(logging.NOTSET)
    access.stop()


async def test_one_line_per_request_without_the_query(api: Api, app: tornado.web.Application,
                                                      lines: io.StringIO) -> None:
    assert (await api.call("GET", "/ping?token=very-secret")).code == 200
    assert (await api.call("GET", "/m/no-such-file-abc?signature=s3cr3t")).code == 404
    app.settings["log_function"].stop()  # flushes what is queued
    written = lines.getvalue().splitlines()
    assert len(written) == 2, written
    assert " INFO mediasrv.access: 200 GET /ping " in written[0] and written[0].endswith("ms")
    assert " INFO mediasrv.access: 404 GET /m/no-such-file-abc " in written[1]
    assert "secret" not in lines.getvalue() and "s3cr3t" not in lines.getvalue()


def test_server_errors_go_through_logging_and_below_info_nothing_is_written(
        caplog: pytest.LogCaptureFixture) -> None:
    class Request:
        method, path = "GET", "/boom"

        @staticmethod
        def request_time() -> float:
            return 0.0125

    class Handler:
        request = Request()

        def __init__(self, status: int) -> None:
            self.status = status

        def get_status(self) -> int:
            return self.status

    out = io.StringIO()
    access = AccessLog(stream=out)
    access.start()
    with caplog.at_level(logging.ERROR, logger="mediasrv.access"):
        access(Handler(502))  # type: ignore[arg-type]
        logging.getLogger("mediasrv.access").setLevel(logging.WARNING)
        try:
            access(Handler(200))  # type: ignore[arg-type]
        finally:
            logging.getLogger("mediasrv.access").setLevel(logging.NOTSET)
    access.stop()
    assert [r.getMessage() for r in caplog.records] == ["502 GET /boom 12.5ms"]
    assert out.getvalue() == ""
