"""Runs a Python script as on gVisor's /proc: /proc/self/clear_refs does not exist and /proc/self/status has no
VmHWM line (everything else as here). `python tests/gvisor_proc.py SCRIPT ARGS...`: open() answers those two paths
as gVisor would, then SCRIPT runs as __main__ in this process."""
import builtins
import io
import runpy
import sys

_open = builtins.open


def gvisor_open(file, mode="r", *args, **kwargs):
    if str(file) == "/proc/self/clear_refs":
        raise FileNotFoundError(2, "No such file or directory (gVisor)", str(file))
    f = _open(file, mode, *args, **kwargs)
    if str(file) == "/proc/self/status":
        with f:
            return io.StringIO("".join(line for line in f if not line.startswith("VmHWM:")))
    return f


builtins.open = gvisor_open
sys.argv = sys.argv[1:]
sys.path.insert(0, str(__import__("pathlib").Path(sys.argv[0]).resolve().parent))
runpy.run_path(sys.argv[0], run_name="__main__")
