"""``python -m aiayn``: the same command line as the ``aiayn`` script."""

from .cli.main import main

main()
