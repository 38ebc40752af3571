"""The base ring: what every other part of mediasrv may import and which imports none of them.

Errors with an HTTP meaning (``errors``), time and ids, the background-task helpers and the
settings (``settings``: declared, parsed, checked and described in one package). Nothing here
imports Tornado, libvips, a store or another ring of mediasrv.
"""
