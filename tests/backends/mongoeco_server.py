"""Run mongoeco's MongoDB wire-protocol server until SIGTERM or SIGINT.

    python3.13 mongoeco_server.py PORT [HOST [SQLITE_FILE]]

Started by the test session (and scripts/ci-backends, scripts/cluster) with a Python 3.13
interpreter that has ``mongoeco[wire]``; it prints ``READY <port>`` on stdout once it accepts
connections. HOST defaults to 127.0.0.1 (the simulated cluster gives its data host's address).
Data is in memory unless SQLITE_FILE is given: then it is kept in that file, so the server can
be stopped and started again on the same port with nothing lost (the cluster's outage test).
This file is not imported by the project (it runs in another interpreter).
"""
from __future__ import annotations

import asyncio
import signal
import sys


async def main(port: int, host: str, sqlite_file: str | None) -> None:
    from mongoeco.wire import AsyncMongoEcoProxyServer

    engine = None
    if sqlite_file:
        from mongoeco.engines.sqlite import SQLiteEngine

        engine = SQLiteEngine(sqlite_file)
    server = AsyncMongoEcoProxyServer(host=host, port=port, engine=engine)
    address = await server.start()
    print(f"READY {address.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(int(args[0]) if args else 0, args[1] if len(args) > 1 else "127.0.0.1",
                     args[2] if len(args) > 2 else None))
