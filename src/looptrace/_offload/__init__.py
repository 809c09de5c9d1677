"""Large spans serialized and encoded by worker processes.

    parent   the application's side: the Offloader (handoffs, fallbacks counted by reason)
    pool     the worker processes and the pipes to them (a thread per pool reads answers)
    worker   a worker's main loop: frames in, answers out (imports none of capture)
    child    what a worker runs: finish a prepared span, encode it

The package root imports nothing, so that a worker, which imports ``worker`` and ``child``,
loads none of the application's side.
"""
