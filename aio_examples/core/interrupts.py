"""Ctrl-C and SIGTERM stop a run, always, and what was measured is kept.

Both raise KeyboardInterrupt (SIGTERM as its subclass Terminated, so the command line can exit 143 instead
of 130) and are remembered: a library that catches and drops the exception (a compiler's worker, a
runtime's telemetry thread) cannot lose the request, because `check()` raises it again at the runner's next
step.
"""

import signal
import threading
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop as on Ctrl-C."""


_pending: int | None = None
_depth = 0


def _raise(signum: int):
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _handler(signum, frame):
    global _pending
    _pending = signum
    _raise(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _handled_by(handler):
    """SIGINT and SIGTERM go to `handler` within the block, and back to the handlers they had after it."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def stop_on_signals():
    """Within the block, SIGINT and SIGTERM raise (and are remembered for `check`). Only the main thread can
    set handlers: elsewhere the block runs as it is."""
    global _pending, _depth
    if not _main_thread():
        yield
        return
    _depth += 1
    try:
        with _handled_by(_handler):
            yield
    finally:
        _depth -= 1
        if not _depth:          # the outermost block forgets the signal it has answered
            _pending = None


@contextmanager
def deferred():
    """Within the block, a first SIGINT or SIGTERM is only remembered, for the block's loop to answer with
    `check()` between two calls into a library that an exception raised mid-call could leave stuck (Ray's
    client holds locks across its gRPC calls); a second one raises at once. Main thread only, as above."""
    def remember(signum, frame):
        global _pending
        if _pending is not None:
            _raise(signum)
        _pending = signum

    if not _main_thread():
        yield
        return
    with _handled_by(remember):
        yield


def check() -> None:
    """Raise the interrupt a signal asked for, if one came (and was swallowed on its way)."""
    if _pending is not None:
        _raise(_pending)
