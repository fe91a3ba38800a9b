"""One process in a session of its own: plain `python trainer.py` (no launcher, no torchrun) re-runs itself as a child
started the way torchrun starts every rank (start_new_session), before torch, transformers and vLLM load.

Why (docs/speed.md, "One process against 2 ranks"): where Linux's autogroup scheduling is on
(/proc/sys/kernel/sched_autogroup_enabled = 1, the default of most distributions' kernels), the kernel shares the CPU
between sessions first and between the threads of one session second. torchrun's ranks are sessions of their own; one
process started from a shell shares its session, and so its share, with every job that shell started. Beside two busy
loops started from the same session it got about 2/3 of a core where 2 ranks got 2/3 each (one_vs_ranks_busy
1.41 to 2.53); in a session of its own, about a whole core (1.04 to 1.39).

The parent only waits: SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the child (Ctrl-C reaches the terminal's
foreground process group, which the child has left), the child dies with the parent (PR_SET_PDEATHSIG), and the parent
ends as the child did (its exit code, or the same signal). Nothing happens where the process leads its session already
(started with setsid, as tests/helpers.start does), without autogroup, or with RL_OWN_SESSION=0 in the environment.
"""
import os
import signal
import subprocess
import sys

FLAG = "RL_OWN_SESSION"  # "1" in the child (already done), "0": stay in the caller's session
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
AUTOGROUP = "/proc/sys/kernel/sched_autogroup_enabled"


def autogroup_on(path: str = AUTOGROUP) -> bool:
    try:
        with open(path) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def wanted(argv: list[str], env: dict, leads_session: bool, autogroup: bool) -> bool:
    """A plain one-process run (no torchrun rank, no launcher: its ranks are in their own sessions) that does not lead
    its session, where the kernel schedules by session, not switched off by RL_OWN_SESSION."""
    plain = "RANK" not in env and not any(a.split("=")[0] == "--nproc_per_node" for a in argv)
    return plain and FLAG not in env and not leads_session and autogroup


def _die_with_parent() -> None:  # in the child, before exec
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a SIGKILLed parent takes the child along
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)  # the parent's mask is inherited across exec


def own_session(argv: list[str]) -> None:
    """Returns where nothing is to do (and in the child); else runs this command again in a new session and ends this
    process as the child ended."""
    if not wanted(argv, os.environ, os.getsid(0) == os.getpid(), autogroup_on()):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)  # held until they can be passed on
    child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env={**os.environ, FLAG: "1"},
                             start_new_session=True, preexec_fn=_die_with_parent)
    for sig in PASSED_ON:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
    code = child.wait()
    sys.stdout.flush()
    if code < 0:  # killed by a signal: this process ends by the same one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(128 - code if code < 0 else code)
