"""How a large payload's strings and bytes reach the worker process without a pickle.

Handing a 2.5 MB string to a worker through the pool's pipe means pickling it: a new 2.5 MB
buffer, and on the virtual machines we measure on, memory the process has not touched recently
costs about 1 ms per MB in page faults, on whichever thread makes the copy while holding the
GIL. That thread stalls the event loop for as long. Two carriers avoid it:

- :class:`Direct` copies nothing. A slot names the address of the value's own buffer in this
  process, and the worker reads it from there with ``process_vm_readv`` (a compact ASCII
  ``str``: ``PyUnicode_AsUTF8AndSize`` returns its data without encoding anything; ``bytes``:
  its buffer). The parent keeps the value alive until the worker has answered; both types are
  immutable, so what the worker reads is what the span recorded. The kernel allows the read
  only where this process may be traced by its own child (same user; not under Yama's
  ``ptrace_scope`` 1 or more, which we do not loosen): the offloader tries one read when the
  pool starts, and uses the ring where it fails.
- :class:`Ring`, for where direct reads are refused, is one region of shared memory, faulted
  in once when the pool starts and reused from then on: one copy into warm memory on the loop,
  about 0.4 ms for 2.5 MB. It takes ASCII ``str``, ``bytes`` and ``bytearray``. Regions are
  handed out first-in first-out and released when the worker has answered; a payload that finds
  no room is pickled as before.

The offloader uses one carrier or the other, never both: where direct reads work, a
``bytearray`` (which could change before the worker reads it) travels in the pickle.

POSIX only: where ``shm_open`` or ``ctypes`` is missing, :func:`create` returns None and every
payload is pickled; direct reads are Linux only.
"""

from __future__ import annotations

import collections
import mmap
import os
import secrets
import threading
from typing import Any

__all__ = ["MIN_COPY_BYTES", "Direct", "Reader", "Ring", "Slot", "create"]

# Below this a pickle copy costs a few microseconds: not worth a region.
MIN_COPY_BYTES = 64 * 1024
DEFAULT_SIZE = 64 * 1024 * 1024

_STR, _BYTES, _BYTEARRAY = 0, 1, 2
# Direct slots: ``off`` is an address in the parent process.
_DIRECT_STR, _DIRECT_BYTES = 3, 4


class Slot:
    """Stands in for a payload piece that travels in the ring: where it is and what it was."""

    __slots__ = ("kind", "n", "off")

    def __init__(self, off: int, n: int, kind: int) -> None:
        self.off = off
        self.n = n
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (Slot, (self.off, self.n, self.kind))

    def __repr__(self) -> str:
        return f"<ring slot {self.off}+{self.n}>"


class _Mapping:
    """A shared mapping made through libc, not the ``mmap`` module, whose calls hold the GIL
    while the kernel faults in or unmaps 64 MiB (a 55-100 ms stall here). ctypes releases the
    GIL for each call.

    In the parent, the pages are faulted in and unmapped 1 MiB at a time: ``MAP_POPULATE``
    and a whole ``munmap`` hold the process's memory-map lock throughout, and any thread that
    needs it meanwhile (the loop allocating a new arena) waits as long: a 70 ms stall now
    and then. The worker, a process of its own, maps with ``MAP_POPULATE``."""

    def __init__(self, fd: int, size: int, populate: bool) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap failed")
        self.addr: int = addr
        self.size = size
        self._munmap = libc.munmap
        if not populate:
            for off in range(0, size, _STEP):
                ctypes.memset(addr + off, 0, min(_STEP, size - off))
        self._buf = (ctypes.c_char * size).from_address(addr)
        self.view = memoryview(self._buf).cast("B")

    def close(self) -> None:
        self.view.release()
        del self._buf
        for off in range(0, self.size, _STEP):
            self._munmap(self.addr + off, min(_STEP, self.size - off))


_STEP = 1 << 20
_READ_STEP = 256 * 1024


class Ring:
    """The parent's side: allocate, copy in, release. ``put`` runs on the flusher's loop;
    ``release`` on whichever thread learns that the worker answered."""

    def __init__(self, name: str, size: int) -> None:
        import _posixshmem  # type: ignore[import-not-found,unused-ignore]
        import ctypes
        from multiprocessing import resource_tracker

        self.name = name
        self.size = size
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        # The tracker unlinks the segment if this process dies without closing the ring.
        resource_tracker.register(name, "shared_memory")
        try:
            os.ftruncate(fd, size)
            self._mapping = _Mapping(fd, size, populate=False)
        except BaseException:
            _posixshmem.shm_unlink(name)
            resource_tracker.unregister(name, "shared_memory")
            raise
        finally:
            os.close(fd)
        self._view = self._mapping.view
        self._base = self._mapping.addr
        self._memmove = ctypes.memmove
        # A prototype of our own: setting argtypes on ctypes.pythonapi's shared attribute would
        # change it for every other user of that function in the process.
        prototype = ctypes.PYFUNCTYPE(
            ctypes.c_void_p, ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t)
        )
        self._as_utf8 = prototype(("PyUnicode_AsUTF8AndSize", ctypes.pythonapi))
        self._n = ctypes.c_ssize_t()
        self._lock = threading.Lock()
        # Live regions in allocation order: [offset, end, released].
        self._regions: collections.deque[list[Any]] = collections.deque()
        self._head = 0
        self.closed = False

    def __repr__(self) -> str:
        return f"<looptrace Ring {self.name} {len(self._regions)} regions>"

    @property
    def busy(self) -> int:
        """Regions not yet released."""
        return sum(1 for r in self._regions if not r[2])

    def _alloc(self, n: int) -> int | None:
        regions = self._regions
        if not regions:
            self._head = 0
            return 0 if n <= self.size else None
        head, tail = self._head, regions[0][0]
        if head > tail:  # in use: [tail, head)
            if self.size - head >= n:
                return head
            return 0 if tail >= n else None
        # Wrapped: in use [tail, size) and [0, head); head == tail means full (no empty regions).
        return head if tail - head >= n else None

    def put(self, value: Any) -> Slot | None:
        """Copy a large ASCII str, bytes or bytearray into the ring; None if it has no room
        (or the value is of another kind)."""
        cls = type(value)
        if cls is str:
            if not value.isascii():
                return None  # its UTF-8 form would be a new copy: let pickle make it
            kind = _STR
        elif cls is bytes:
            kind = _BYTES
        elif cls is bytearray:
            kind = _BYTEARRAY
        else:
            return None
        n = len(value)
        # The copy happens under the lock too: close() must not unmap the ring under it.
        with self._lock:
            if self.closed:
                return None
            off = self._alloc(n)
            if off is None:
                return None
            if kind == _STR:
                src = self._as_utf8(value, self._n)
                if src is None or self._n.value != n:  # pragma: no cover - not CPython
                    return None
                self._memmove(self._base + off, src, n)
            else:
                self._view[off : off + n] = value
            self._regions.append([off, off + n, False])
            self._head = off + n
        return Slot(off, n, kind)

    def release(self, off: int) -> None:
        """The worker is done with the region at ``off``."""
        with self._lock:
            regions = self._regions
            for region in regions:
                if region[0] == off and not region[2]:
                    region[2] = True
                    break
            while regions and regions[0][2]:
                regions.popleft()

    def close(self) -> None:
        """Unmap and unlink (a worker that still has it mapped keeps its own mapping)."""
        import _posixshmem  # type: ignore[import-not-found,unused-ignore]
        from multiprocessing import resource_tracker

        with self._lock:
            if self.closed:
                return
            self.closed = True
        # Unmapping 64 MiB takes ~20 ms of kernel time; it releases the GIL, but whichever
        # thread calls it waits, and that may be the application's loop.
        try:
            threading.Thread(target=self._mapping.close, name="looptrace-ring", daemon=True).start()
        except RuntimeError:  # interpreter shutdown: no new threads
            self._mapping.close()
        try:
            _posixshmem.shm_unlink(self.name)
        except OSError:
            pass
        resource_tracker.unregister(self.name, "shared_memory")


def create(size: int = DEFAULT_SIZE) -> Ring | None:
    """A new ring, or None where shared memory or ctypes is not available."""
    try:
        return Ring(f"/looptrace-{os.getpid()}-{secrets.token_hex(4)}", size)
    except (ImportError, OSError, AttributeError, ValueError):
        return None


class Direct:
    """The parent's side of direct reads: a slot that names where a value lives, no copy.

    Only the loop's thread calls :meth:`put`. The caller keeps each value alive (and
    referenced, so that CPython never resizes it in place) until the worker has answered."""

    def __init__(self) -> None:
        import ctypes

        self.pid = os.getpid()
        self._as_utf8 = ctypes.PYFUNCTYPE(
            ctypes.c_void_p, ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t)
        )(("PyUnicode_AsUTF8AndSize", ctypes.pythonapi))
        self._as_string = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(
            ("PyBytes_AsString", ctypes.pythonapi)
        )

    def __repr__(self) -> str:
        return f"<looptrace Direct pid {self.pid}>"

    def put(self, value: Any) -> Slot | None:
        """A slot for an ASCII str or a bytes object; None for anything else (a non-ASCII str
        has no UTF-8 buffer to read until one is made, and a bytearray may change)."""
        cls = type(value)
        if cls is str:
            if not value.isascii():
                return None
            addr = self._as_utf8(value, None)
            kind = _DIRECT_STR
        elif cls is bytes:
            addr = self._as_string(value)
            kind = _DIRECT_BYTES
        else:
            return None
        if not addr:  # pragma: no cover - not CPython
            return None
        return Slot(addr, len(value), kind)


class Reader:
    """The worker's side: turns slots back into values. ``Reader(ring.name, ring.size, pid)``
    maps the ring (when there is one) and reads direct slots from process ``pid``."""

    def __init__(self, name: str | None = None, size: int = 0, pid: int | None = None) -> None:
        self._view: memoryview | None = None
        self._name: str | None = None
        self._pid = pid
        # Bound on the first direct read (ctypes is not imported until then).
        self._readv: Any = None
        self._new_str: Any = None
        self._str_data: Any = None
        self._new_bytes: Any = None
        self._bytes_data: Any = None
        if name is not None:
            self.map(name, size)

    def map(self, name: str, size: int) -> None:
        """Map ring ``name`` (once: a ring already mapped is kept)."""
        if name == self._name:
            return
        import _posixshmem  # type: ignore[import-not-found,unused-ignore]

        fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
        try:
            self._view = _Mapping(fd, size, populate=True).view
        finally:
            os.close(fd)
        # A replaced pool comes with new workers, so a reader never needs two rings: the old
        # mapping stays until the process ends.
        self._name = name

    def value(self, slot: Slot) -> Any:
        if slot.kind >= _DIRECT_STR:
            return self._read(slot.off, slot.n, slot.kind)
        if self._view is None:
            raise LookupError("a ring slot, but no ring")
        piece = self._view[slot.off : slot.off + slot.n]
        if slot.kind == _STR:
            return str(piece, "ascii")
        if slot.kind == _BYTES:
            return bytes(piece)
        return bytearray(piece)

    def _read(self, addr: int, n: int, kind: int) -> Any:
        """The ``str`` or ``bytes`` of ``n`` bytes at ``addr`` in the parent, read by the
        kernel straight into the new object's own buffer.

        Into the object itself: a zero-filled buffer, then a ``str`` made from it, copied
        2.5 MB twice more. The object is written before anything else can see it, as CPython's
        own constructors do, and holds only ASCII: the parent sent an ASCII ``str`` and keeps
        it alive, unchanged, until we answer.

        The object's memory is zeroed first, though the kernel overwrites it. In the large
        payload scenario (``benchmarks/scenario_large_payloads.py``), the kernel took 1.9-2.2 ms
        per 2.5 MB to read into memory this process had not written since ``malloc`` gave it
        back; zeroed first, 0.9-1.0 ms (the old three passes: 1.25-1.5). Alone, with no event
        loop and backend beside it, the read takes 0.4 ms either way and the zeroing 0.1 ms.
        We did not find the cause: with ``perf`` watching, the difference goes away."""
        import ctypes

        if self._pid is None:
            raise LookupError("a direct slot, but no process to read it from")
        if self._readv is None:
            self._bind()
        if kind == _DIRECT_STR:
            out = self._new_str(n, 127)
            base = self._str_data(out, None) if n else 0
        else:
            out = self._new_bytes(None, n)
            base = self._bytes_data(out)
        # ``struct iovec`` is {void *, size_t}: two size_t-wide fields on every ABI we run on.
        iovec = ctypes.c_size_t * 2
        ctypes.memset(base, 0, n)
        done = 0
        while done < n:
            # In pieces: this worker is a SCHED_IDLE process on a kernel that may not preempt a
            # system call, so each return to user space is a point where the application's
            # loop can take the core back.
            step = min(n - done, _READ_STEP)
            local = iovec(base + done, step)
            remote = iovec(addr + done, step)
            got = self._readv(
                self._pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, ctypes.c_ulong(0)
            )
            if got <= 0:
                err = ctypes.get_errno()
                raise OSError(err, f"process_vm_readv: {os.strerror(err) if err else 'no data'}")
            done += got
        return out

    def _bind(self) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        readv = libc.process_vm_readv
        readv.restype = ctypes.c_ssize_t
        api = ctypes.pythonapi
        ssize = ctypes.c_ssize_t
        self._new_str = ctypes.PYFUNCTYPE(ctypes.py_object, ssize, ctypes.c_uint32)(
            ("PyUnicode_New", api)
        )
        # For a compact ASCII str this is its own data: nothing is encoded or cached.
        self._str_data = ctypes.PYFUNCTYPE(
            ctypes.c_void_p, ctypes.py_object, ctypes.POINTER(ssize)
        )(("PyUnicode_AsUTF8AndSize", api))
        self._new_bytes = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ssize)(
            ("PyBytes_FromStringAndSize", api)
        )
        self._bytes_data = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(
            ("PyBytes_AsString", api)
        )
        self._readv = readv
