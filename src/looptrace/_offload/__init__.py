"""Large spans serialized and encoded by worker processes.

    parent   the application's side: the Offloader (handoffs, fallbacks counted by reason)
    pool     the worker processes and the pipes to them (one queue of calls, a thread per
             worker)
    worker   a worker's main loop: frames in, answers out (imports none of capture)
    child    what a worker runs: finish a prepared span, encode it

The package root imports nothing, so that a worker, which imports ``worker`` and ``child``,
loads none of the application's side.

The words the modules share:

    offload      encoding a large span in a worker instead of on the application's side; the
                 worker only encodes, the loop's own client sends what it returns
    Offloader    the application's side: hands a span over, or encodes it here (a fallback,
                 counted by reason: the pool broken, retired, unavailable or shut down)
    PoolState    where the pool is in its life (unstarted, running, broken, retired,
                 unavailable, shutdown); a broken pool starts again on the next large span
    call         one request to a worker: a pickle, then the raw values after it
    lift         replacing a payload's large str and bytes leaves by slots before the pickle,
                 so that they travel as raw bytes instead of being pickled (``_Lifter``)
    Slot         what stands in a lifted payload for the n-th raw value; ``restore`` puts the
                 value back in the worker
    Raw          a call's arguments or answer with its raw values, written and read straight
                 from the pipe in pieces of ``PIECE_CHARS``
    helper       a worker at the ordinary priority, started while the idle-priority ones are
                 behind (a call waited ``BEHIND_SECONDS``, or none started within
                 ``START_HELP_SECONDS``); it takes the queue and copies of calls a starved
                 worker holds, and exits after ``HELPER_IDLE_SECONDS`` with nothing to do
    WorkerGone   the answer will not come (a worker died, or the pool closed): encode here
    WorkerError  the work raised inside the worker, which lives on
"""
