"""Resumable uploads (tus) through the nginx sidecar, run for real: a real tus client (tuspy)
against nginx in front of two mediasrv processes (SQLite + files), and one in front of S3.

nginx streams PATCH bodies (``proxy_request_buffering off``) under the same body limit as
POST /files: a chunk cut off mid-body reaches mediasrv as far as it came, which keeps it.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tusclient.client import TusClient
from tusclient.exceptions import TusCommunicationError, TusUploadFailed
from tusclient.uploader import Uploader

from tests.cli.test_serve_behind_nginx import NGINX, Sidecar, _token, request, running_sidecar

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
MIB = 1024 * 1024
CHUNK = 5 * MIB + 321
ZIP = b"PK\x03\x04"


@pytest.fixture(scope="module")
def tus_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sidecar, str, str]]:
    tmp = tmp_path_factory.mktemp("tus-sidecar")
    with running_sidecar(tmp, MEDIASRV_WORKERS="2", MEDIASRV_MAX_UPLOAD_SIZE_BYTES=str(30 * MIB)) as running:
        outbox = tmp / "data" / "outbox"
        yield (running, _token(running.port, outbox, "tus1@example.com", "127.0.0.1"),
               _token(running.port, outbox, "tus2@example.com", "127.0.0.1"))


def uploader(port: int, token: str | None, data: bytes, *, url: str | None = None, chunk: int = CHUNK,
             filetype: str = "application/zip") -> Uploader:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = TusClient(f"http://127.0.0.1:{port}/uploads", headers=headers)
    return client.uploader(file_stream=io.BytesIO(data), chunk_size=chunk, url=url, upload_checksum=True,
                           metadata={"filename": "big.zip", "filetype": filetype})


def payload(size: int, head: bytes = ZIP) -> bytes:
    return head + os.urandom(size - len(head))


def path_of(url: str) -> str:
    return "/uploads/" + url.rsplit("/", 1)[1]


def auth(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Tus-Resumable": "1.0.0", **extra}


def test_chunked_upload_and_a_resume_by_a_new_client(tus_sidecar: tuple[Sidecar, str, str]) -> None:
    side, token, _ = tus_sidecar
    data = payload(13 * MIB + 3)
    first = uploader(side.port, token, data)
    first.upload(stop_at=2 * CHUNK)  # two chunks, then this client is gone
    second = uploader(side.port, token, data, url=first.url)
    assert second.offset == 2 * CHUNK
    second.upload()
    fid = first.url.rsplit("/", 1)[1]
    r = request(side.port, "GET", f"/files/{fid}", headers={"Authorization": f"Bearer {token}"})
    assert r.status == 200 and r.json()["size"] == len(data)
    r = request(side.port, "GET", f"/d/{fid}")
    assert r.status == 200 and hashlib.sha256(r.body).digest() == hashlib.sha256(data).digest()


def test_nginx_streams_a_patch_body_it_has_not_finished_reading(tus_sidecar: tuple[Sidecar, str, str]) -> None:
    """Half a chunk sent, then the client goes: nginx passed the half on as it came (a buffering
    proxy would have passed nothing), and mediasrv kept it."""
    side, token, _ = tus_sidecar
    data = payload(4 * MIB)
    r = request(side.port, "POST", "/uploads", headers=auth(token, **{"Upload-Length": str(len(data))}))
    assert r.status == 201, r.body
    path = r.headers["location"]
    half = 2 * MIB
    with socket.create_connection(("127.0.0.1", side.port), timeout=10) as sock:
        sock.sendall((f"PATCH {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nTus-Resumable: 1.0.0\r\n"
                      "Upload-Offset: 0\r\nContent-Type: application/offset+octet-stream\r\n"
                      f"Content-Length: {len(data)}\r\n\r\n").encode() + data[:half])
        time.sleep(0.5)  # (a real client stalls, then its connection drops)
    offset = 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and offset == 0:
        offset = int(request(side.port, "HEAD", path, headers=auth(token)).headers["upload-offset"])
        time.sleep(0.1)
    assert 0 < offset <= half
    up = uploader(side.port, token, data, url=f"http://127.0.0.1:{side.port}{path}")
    up.upload()
    assert request(side.port, "GET", "/d/" + path.rsplit("/", 1)[1]).body == data


def test_checksum_offset_termination_and_ownership(tus_sidecar: tuple[Sidecar, str, str]) -> None:
    side, token, other = tus_sidecar
    data = payload(3 * MIB)
    r = request(side.port, "POST", "/uploads", headers=auth(token, **{"Upload-Length": str(len(data))}))
    path = r.headers["location"]
    stream = {"Content-Type": "application/offset+octet-stream"}
    wrong = base64.b64encode(hashlib.md5(b"nope").digest()).decode()
    r = request(side.port, "PATCH", path, body=data[:MIB], headers=auth(token, **stream, **{
        "Upload-Offset": "0", "Upload-Checksum": f"md5 {wrong}"}))
    assert r.status == 460 and r.json()["code"] == "CHECKSUM_MISMATCH"
    r = request(side.port, "PATCH", path, body=data[:MIB], headers=auth(token, **stream, **{"Upload-Offset": "0"}))
    assert r.status == 204 and r.headers["upload-offset"] == str(MIB)
    r = request(side.port, "PATCH", path, body=data[:MIB], headers=auth(token, **stream, **{"Upload-Offset": "0"}))
    assert r.status == 409 and r.json()["code"] == "OFFSET_MISMATCH"
    assert request(side.port, "HEAD", path, headers=auth(other)).status == 404
    assert request(side.port, "DELETE", path, headers=auth(other)).status == 404
    assert request(side.port, "DELETE", path, headers=auth(token)).status == 204
    assert request(side.port, "HEAD", path, headers=auth(token)).status == 404


def test_cap_anonymous_and_refused_bytes(tus_sidecar: tuple[Sidecar, str, str]) -> None:
    side, token, _ = tus_sidecar
    r = request(side.port, "POST", "/uploads", headers=auth(token, **{"Upload-Length": str(30 * MIB + 1)}))
    assert r.status == 413 and r.json()["code"] == "FILE_TOO_LARGE"
    r = request(side.port, "POST", "/uploads", headers={"Upload-Length": "10", "Tus-Resumable": "1.0.0"})
    assert r.status == 401 and r.json()["code"] == "UNAUTHORIZED"
    with pytest.raises(TusCommunicationError):
        uploader(side.port, None, payload(MIB)).upload()
    refused = uploader(side.port, token, payload(6 * MIB, b"plain text, not a zip"))
    with pytest.raises(TusUploadFailed) as failed:
        refused.upload()
    assert failed.value.status_code == 400 and b"CONTENT_MISMATCH" in failed.value.response_content
    assert request(side.port, "HEAD", path_of(refused.url), headers=auth(token)).status == 404
    r = request(side.port, "OPTIONS", "/uploads", headers={"Authorization": f"Bearer {token}"})
    assert r.status == 204 and r.headers["tus-max-size"] == str(30 * MIB)


def test_resumable_upload_through_nginx_to_s3(moto, tmp_path: Path) -> None:
    from tests.backends.fixtures import moto_endpoint, new_bucket
    from tests.backends.servers import S3_ENV

    with running_sidecar(tmp_path, MEDIASRV_WORKERS="2", MEDIASRV_S3_BUCKET=new_bucket(),
                         MEDIASRV_S3_ENDPOINT_URL=moto_endpoint(moto), **S3_ENV) as side:
        token = _token(side.port, tmp_path / "data" / "outbox", "tus-s3@example.com", "127.0.0.1")
        data = payload(17 * MIB + 11)
        first = uploader(side.port, token, data)
        first.upload(stop_at=CHUNK)
        second = uploader(side.port, token, data, url=first.url)
        assert second.offset == CHUNK
        second.upload()
        assert request(side.port, "GET", "/d/" + first.url.rsplit("/", 1)[1]).body == data
