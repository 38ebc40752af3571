"""Run mongoeco's MongoDB wire-protocol server on loopback until SIGTERM or SIGINT.

Started by the test session (and scripts/ci-backends) with a Python 3.13 interpreter that has
``mongoeco[wire]``; it prints ``READY <port>`` on stdout once it accepts connections. This file
is not imported by the project (it runs in another interpreter).
"""
from __future__ import annotations

import asyncio
import signal
import sys


async def main(port: int) -> None:
    from mongoeco.wire import AsyncMongoEcoProxyServer

    server = AsyncMongoEcoProxyServer(host="127.0.0.1", port=port)
    address = await server.start()
    print(f"READY {address.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
