"""Building blocks of ``scripts/bench.py``: processes, HTTP seeding, wrk, images, the report.

Kept out of the server packages on purpose: nothing here is imported by ``mediasrv``; the
harness treats the server as a black box started with ``mediasrv serve``, except where a
benchmark seeds the embedded metadata store directly before the server starts (listing).
"""
