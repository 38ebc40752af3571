"""The webhook benchmark's receiver: a process of its own that answers 204 and keeps every request.

Asyncio and a hand-written HTTP/1.1 reader (keep-alive, Content-Length bodies: what mediasrv
sends), so receiving costs the machine's shared cores little beside the server under test;
``tests/webhook_receiver.py`` (http.server, a thread per connection) cost several times more.
Each request becomes one JSON line (headers, body) in OUT, flushed every 20 ms.

    python scripts/benchkit/receiver.py PORT OUT
"""
from __future__ import annotations

import asyncio
import json
import sys

ANSWER = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"


async def main(port: int, out: str) -> None:
    lines: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = {}
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                lines.append(json.dumps({"headers": headers, "body": body.decode()}))
                writer.write(ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print("ready", flush=True)
    with open(out, "a") as sink:
        async with server:
            while True:
                await asyncio.sleep(0.02)
                if lines:
                    batch, lines[:] = list(lines), []
                    sink.write("\n".join(batch) + "\n")
                    sink.flush()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
