"""The wall-clock deadline of the reward job running in this process, shared by the pool (which sets it) and the
sandbox (which keeps its own limits below it), so neither imports the other.

    set_deadline(seconds)   # the pool, when a job starts; None when it ends
    time_left()             # seconds before the pool kills the job; None outside a pool job
"""
import time

_DEADLINE: float | None = None  # time.monotonic() at which the pool kills the running job


def set_deadline(seconds: float | None) -> None:
    """The running job ends `seconds` from now (None: no job runs)."""
    global _DEADLINE
    _DEADLINE = None if seconds is None else time.monotonic() + seconds


def time_left() -> float | None:
    """Seconds before the pool's wall limit kills the job this worker runs; None outside a pool job."""
    return None if _DEADLINE is None else _DEADLINE - time.monotonic()
