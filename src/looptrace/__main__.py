"""``python -m looptrace``: the command line, as ``looptrace``."""

from .cli import main

main()
