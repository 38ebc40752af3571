"""The bare-Tornado references, run by the harness as a separate process.

- ``GET /mem``: one handler writing the bytes of ``--mem-file`` from memory (the ceiling of
  any Tornado handler serving that response: no store, no auth, no limits, no logging).
- ``GET /static/<name>``: Tornado's own ``StaticFileHandler`` over ``--static-dir``.
- ``POST /upload``: the body streamed to a new file with fsync, off the loop (the ceiling of
  a small-file upload on the same disk).

Usage: python peer_tornado.py --port P --static-dir DIR --upload-dir DIR [--mem-file FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from pathlib import Path

import tornado.httpserver
import tornado.web


class Ping(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write("ok")


class Mem(tornado.web.RequestHandler):
    def initialize(self, data: bytes) -> None:  # type: ignore[override]
        self.data = data

    def get(self) -> None:
        self.set_header("Content-Type", "image/jpeg")
        self.write(self.data)


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@tornado.web.stream_request_body
class Upload(tornado.web.RequestHandler):
    def initialize(self, directory: Path) -> None:  # type: ignore[override]
        self.directory = directory

    def prepare(self) -> None:
        self.parts: list[bytes] = []

    def data_received(self, chunk: bytes) -> None:
        self.parts.append(chunk)

    async def post(self) -> None:
        path = self.directory / uuid.uuid4().hex
        await asyncio.get_running_loop().run_in_executor(None, _write_synced, path, b"".join(self.parts))
        self.set_status(201)
        self.write({"id": path.name})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--static-dir", type=Path, required=True)
    parser.add_argument("--upload-dir", type=Path, required=True)
    parser.add_argument("--mem-file", type=Path)
    args = parser.parse_args()
    args.upload_dir.mkdir(parents=True, exist_ok=True)
    data = args.mem_file.read_bytes() if args.mem_file else b""
    app = tornado.web.Application([
        (r"/ping", Ping),
        (r"/mem", Mem, {"data": data}),
        (r"/static/(.*)", tornado.web.StaticFileHandler, {"path": str(args.static_dir)}),
        (r"/upload", Upload, {"directory": args.upload_dir}),
    ])

    async def run() -> None:
        server = tornado.httpserver.HTTPServer(app, max_body_size=1 << 30)
        server.listen(args.port, "127.0.0.1")
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
