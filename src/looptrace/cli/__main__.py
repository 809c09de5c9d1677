"""``python -m looptrace.cli``: the ``looptrace`` command without its console script."""

from looptrace.cli import main

main()
