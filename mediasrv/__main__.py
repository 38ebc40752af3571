"""``python -m mediasrv``: the same as the ``mediasrv`` command."""
from mediasrv.cli.main import main

main()
