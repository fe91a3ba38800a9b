"""This process's host memory for the benchmarks, on every runtime the GPU check may land on. Linux's /proc gives the
resident set now (VmRSS in /proc/self/status) and its peak (VmHWM), which writing 5 to /proc/self/clear_refs resets
to the current RSS. gVisor's /proc has neither clear_refs nor VmHWM; there the peak comes from
resource.getrusage's ru_maxrss (the peak since the process started: it cannot be reset), and a peak that cannot be
told is None, reported as "not measured", never as a number from another window.
"""
import resource

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"


def status_bytes(field: str) -> int | None:
    """A kB field of /proc/self/status (VmRSS, VmHWM) in bytes; None where the file or the field is missing."""
    try:
        with open(STATUS) as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":")), None)
    except OSError:
        return None


def maxrss_bytes() -> int:
    """getrusage's peak RSS of this process since it started (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakRSS:
    """The peak RSS of this process since this object was made (window=True) or since the process started.

    window=True: VmHWM after resetting it through clear_refs; where that cannot be done, ru_maxrss, which is the
    window's peak exactly when it rose inside the window (the peak lies after the start), and unknown (None)
    otherwise. window=False: VmHWM, else ru_maxrss: both since the start, always known."""

    def __init__(self, window: bool = True):
        self.window = window
        self.cleared = False
        if window:
            try:
                with open(CLEAR_REFS, "w") as f:
                    f.write("5")  # VmHWM := current RSS
                self.cleared = True
            except OSError:
                pass
        self.maxrss0 = maxrss_bytes() if window else 0

    @property
    def source(self) -> str:
        if (self.cleared or not self.window) and status_bytes("VmHWM") is not None:
            return "VmHWM"
        return "getrusage" + (" (no /proc/self/clear_refs: the peak since the window began only if it rose in it)"
                              if self.window else "")

    def bytes(self) -> int | None:
        if self.cleared or not self.window:
            hwm = status_bytes("VmHWM")
            if hwm is not None:
                return hwm
        now = maxrss_bytes()
        return now if now > self.maxrss0 else None
