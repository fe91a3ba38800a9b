"""Job functions for tests/test_pool.py in a module that takes SLOW_IMPORT_S seconds to import (default 0): a
spawned worker pays that before it is ready, and the pool's wall limit must not count it."""
import os
import sys
import tempfile
import time

time.sleep(float(os.environ.get("SLOW_IMPORT_S", "0")))


def job(kind: str, arg=None):
    """quick -> (1.0, ok with the pool's time_left); hang -> sleeps; litter -> writes `arg` MB into the worker's
    temporary directory, then hangs; env -> the worker's CUDA_VISIBLE_DEVICES and LOCAL_RANK; modules -> the heavy
    modules this worker has imported."""
    from rewards.deadline import time_left
    if kind == "hang":
        time.sleep(600)
    if kind == "litter":
        d = tempfile.mkdtemp(prefix="sandbox-")
        with open(os.path.join(d, "out"), "wb") as f:
            f.write(b"x" * (arg << 20))
        time.sleep(600)
    if kind == "env":
        return 1.0, {"reason": "ok", "env": [os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK")]}
    if kind == "modules":
        return 1.0, {"reason": "ok", "modules": sorted(m for m in ("torch", "vllm", "trainer", "transformers")
                                                         if m in sys.modules)}
    return 1.0, {"reason": "ok", "time_left": time_left()}


def hang_once(kind: str, arg=None):
    """A prepare step that hangs the first time it runs on this machine (marker file `arg`), then returns; with no
    marker it always hangs."""
    if not arg or not os.path.exists(arg):
        if arg:
            open(arg, "w").close()
        time.sleep(600)


def tool(env: str, row: dict, segment: str):
    """A tool function: 'hang' in the call hangs, anything else answers pong."""
    if "hang" in segment:
        time.sleep(600)
    return "pong", {"reason": "ok"}
