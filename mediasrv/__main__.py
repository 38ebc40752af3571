"""``python -m mediasrv``: the same as the ``mediasrv`` command."""
from mediasrv.cli.server import main

main()
