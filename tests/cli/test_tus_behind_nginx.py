"""Resumable uploads (tus) through the nginx sidecar, run for real: a real tus client (tuspy)
against nginx in front of two mediasrv processes, on each backend (SQLite + files, MongoDB
(mongoeco over the wire) + S3 (moto's server)).

nginx streams PATCH bodies (``proxy_request_buffering off``) under the same body limit as
POST /files: a chunk cut off mid-body reaches mediasrv as far as it came, which keeps it.
Expiry: the sidecar is a set of processes whose clock cannot be moved, so the test ages the
upload's state in its store (as MEDIASRV_UPLOAD_EXPIRY seconds of waiting would) and lets the
restarted sidecar's housekeeping end it.
"""
from __future__ import annotations

import base64
import datetime as dt
import email.utils
import hashlib
import io
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tusclient.client import TusClient
from tusclient.exceptions import TusCommunicationError, TusUploadFailed
from tusclient.uploader import Uploader

from tests.cli.test_serve_behind_nginx import NGINX, Sidecar, _token, request, running_sidecar

pytestmark = [pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)"),
              pytest.mark.slow]  # whole processes: scheduled first (tests/conftest.py)
MIB = 1024 * 1024
CHUNK = 5 * MIB + 321  # not a multiple of S3's part size: tails are kept between PATCHes
ZIP = b"PK\x03\x04"
SIDECAR_ENV = {"MEDIASRV_WORKERS": "2", "MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(30 * MIB)}


@pytest.fixture(scope="module", params=["sqlite+files", "mongo+s3"])
def backend(request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings of each backend in turn (a fresh database and bucket per module run)."""
    return backend_env(request, request.param)


def backend_env(request: pytest.FixtureRequest, kind: str) -> dict[str, str]:
    """``kind``'s settings, on a database and a bucket of their own."""
    if kind == "sqlite+files":
        return {}
    from tests.backends.fixtures import moto_endpoint, new_bucket, new_database
    from tests.backends.servers import S3_ENV

    mongo = request.getfixturevalue("mongoeco")
    s3 = request.getfixturevalue("moto")
    return {"MEDIASRV_MONGODB_URL": mongo.url(new_database()), "MEDIASRV_S3_BUCKET": new_bucket(),
            "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(s3), **S3_ENV}


@pytest.fixture(scope="module")
def sidecar_tmp(tmp_path_factory: pytest.TempPathFactory, backend: dict[str, str]) -> Path:
    """The module's sidecar directory (its data in ``data``), one per backend."""
    return tmp_path_factory.mktemp("tus-sidecar")


ON_THE_MODULES_SIDECARS = pytest.mark.xdist_group("tus-sidecars")
"""One worker runs the tests of ``tus_sidecar`` (setup.cfg: --dist loadgroup): a sidecar per
backend for all of them, not one per worker that happens to take one."""


@pytest.fixture(scope="module")
def tus_sidecar(sidecar_tmp: Path, backend: dict[str, str]) -> Iterator[tuple[Sidecar, str, str]]:
    tmp = sidecar_tmp
    with running_sidecar(tmp, **SIDECAR_ENV, **backend) as running:
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


@ON_THE_MODULES_SIDECARS
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


@ON_THE_MODULES_SIDECARS
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


@ON_THE_MODULES_SIDECARS
def test_checksum_offset_termination_and_ownership(tus_sidecar: tuple[Sidecar, str, str], sidecar_tmp: Path,
                                                   backend: dict[str, str]) -> None:
    side, token, other = tus_sidecar
    before = usage(side.port, token)
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
    assert usage(side.port, token) == (before[0] + len(data), before[1] + 1)  # reserved
    assert request(side.port, "DELETE", path, headers=auth(token)).status == 204
    assert request(side.port, "HEAD", path, headers=auth(token)).status == 404
    assert usage(side.port, token) == before
    assert partial_bytes_left(sidecar_tmp / "data", backend, path.rsplit("/", 1)[1]) == []


@ON_THE_MODULES_SIDECARS
def test_cap_anonymous_and_refused_bytes(tus_sidecar: tuple[Sidecar, str, str], sidecar_tmp: Path,
                                        backend: dict[str, str]) -> None:
    side, token, _ = tus_sidecar
    before = usage(side.port, token)
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
    assert usage(side.port, token) == before  # nothing left: no reservation, no bytes
    assert partial_bytes_left(sidecar_tmp / "data", backend, path_of(refused.url).rsplit("/", 1)[1]) == []
    r = request(side.port, "OPTIONS", "/uploads", headers={"Authorization": f"Bearer {token}"})
    assert r.status == 204 and r.headers["tus-max-size"] == str(30 * MIB)


def usage(port: int, token: str) -> tuple[int, int]:
    r = request(port, "GET", "/usage", headers={"Authorization": f"Bearer {token}"})
    assert r.status == 200, r.body
    return r.json()["storage_bytes"], r.json()["files_count"]


def age_upload(data_dir: Path, backend: dict[str, str], file_id: str) -> None:
    """Move the upload's expiry into the past in its store, as waiting it out would."""
    past = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    if "MEDIASRV_MONGODB_URL" not in backend:
        with sqlite3.connect(data_dir / "meta.sqlite3") as db:
            changed = db.execute("UPDATE uploads SET expires_at = ? WHERE file_id = ?",
                                 ("2000-01-01T00:00:00.000Z", file_id)).rowcount
        assert changed == 1
        return
    from pymongo import MongoClient

    with MongoClient(backend["MEDIASRV_MONGODB_URL"], timeoutMS=10_000) as client:
        changed = client.get_default_database()["uploads"].update_one(
            {"_id": file_id}, {"$set": {"expires_at": past}}).matched_count
    assert changed == 1


def partial_bytes_left(data_dir: Path, backend: dict[str, str], file_id: str) -> list[str]:
    """What the blob store still holds of the upload: its partial file, or its S3 tail objects
    and multipart upload."""
    if "MEDIASRV_S3_BUCKET" not in backend:
        return [str(p) for p in (data_dir / "partial").rglob(file_id)] if (data_dir / "partial").exists() else []
    import botocore.session

    s3 = botocore.session.get_session().create_client(
        "s3", endpoint_url=backend["MEDIASRV_S3_ENDPOINT_URL"], region_name=backend["AWS_REGION"],
        aws_access_key_id=backend["AWS_ACCESS_KEY_ID"], aws_secret_access_key=backend["AWS_SECRET_ACCESS_KEY"])
    bucket = backend["MEDIASRV_S3_BUCKET"]
    objects = s3.list_objects_v2(Bucket=bucket, Prefix=f"resumable/{file_id}/").get("Contents", [])
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix=f"blobs/{file_id}").get("Uploads", [])
    return [o["Key"] for o in objects] + [u["Key"] for u in uploads]


@pytest.fixture
def own_backend(request: pytest.FixtureRequest, backend: dict[str, str]) -> dict[str, str]:
    """The module's backend on a database and a bucket of its own (the module's sidecar, on the
    shared ones, would hold MongoDB's housekeeping lease)."""
    return backend_env(request, "mongo+s3" if backend else "sqlite+files")


def test_expiry_through_the_sidecar(own_backend: dict[str, str], tmp_path: Path) -> None:
    """Upload-Expires is MEDIASRV_UPLOAD_EXPIRY after the last PATCH; once past, HEAD and the
    next PATCH are 410 through nginx; the housekeeping (at the restarted sidecar's start) ends
    the upload: its bytes (partial file, S3 parts and tail) and its reservation go."""
    backend = own_backend
    env = {**SIDECAR_ENV, "MEDIASRV_UPLOAD_EXPIRY": "600", **backend,
           "MEDIASRV_HOUSEKEEPING_LEASE": "5"}  # MongoDB: a lease the stopped sidecar kept runs out soon
    data_dir = tmp_path / "data"
    with running_sidecar(tmp_path, **env) as side:
        token = _token(side.port, data_dir / "outbox", "tus-expiry@example.com", "127.0.0.1")
        data = payload(12 * MIB)
        up = uploader(side.port, token, data)
        before = dt.datetime.now(dt.UTC).replace(microsecond=0)
        up.upload(stop_at=CHUNK)
        after = dt.datetime.now(dt.UTC)
        path = path_of(up.url)
        r = request(side.port, "HEAD", path, headers=auth(token))
        assert r.status == 200 and r.headers["upload-offset"] == str(CHUNK)
        expires = email.utils.parsedate_to_datetime(r.headers["upload-expires"])
        assert before <= expires - dt.timedelta(seconds=600) <= after, (before, r.headers["upload-expires"], after)
        assert usage(side.port, token) == (len(data), 1)  # reserved at creation
        age_upload(data_dir, backend, path.rsplit("/", 1)[1])
        r = request(side.port, "HEAD", path, headers=auth(token))
        assert r.status == 410, r.body
        r = request(side.port, "PATCH", path, body=data[CHUNK:2 * CHUNK], headers=auth(token, **{
            "Upload-Offset": str(CHUNK), "Content-Type": "application/offset+octet-stream"}))
        assert r.status == 410 and r.json()["code"] == "UPLOAD_EXPIRED", r.body
        with pytest.raises(TusCommunicationError):  # a tus client resuming it is told it is gone
            uploader(side.port, token, data, url=up.url).upload()
        assert partial_bytes_left(data_dir, backend, path.rsplit("/", 1)[1])  # (not ended yet)
    (tmp_path / "sidecar.log").rename(tmp_path / "sidecar-first.log")
    with running_sidecar(tmp_path, **env) as side:  # the same data: its housekeeping runs at start
        deadline = time.monotonic() + 60  # (on MongoDB, once one of its processes holds the lease)
        while (left := usage(side.port, token)) != (0, 0) and time.monotonic() < deadline:
            time.sleep(1)
        assert left == (0, 0)
        assert request(side.port, "HEAD", path, headers=auth(token)).status == 404
        assert partial_bytes_left(data_dir, backend, path.rsplit("/", 1)[1]) == []
