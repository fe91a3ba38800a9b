"""The launcher: `python trainer.py --nproc_per_node N [--nnodes M --node_rank R --master_addr A --master_port P]
--config ...` checks the config and data once, before any rank starts, then runs torchrun's launcher in this
process and owns the run's shutdown and exit code:

- a config or data error: one message, exit 2, no rank started;
- SIGTERM or SIGINT (to this process, its process group, or Ctrl-C): forwarded once to every rank as SIGTERM; the
  ranks finish the step, checkpoint and exit 0, and so does this process (torchrun itself would give the ranks
  30 s and then kill them, and end in a traceback with exit 1);
- a rank that stops with exit 2 (config) or 3 (training stopped): this process exits with that code, without
  torchrun's failure report (the rank has printed its message).

Plain `torchrun ... trainer.py` works too; there, errors exit 1 after torchrun's report.
"""
import logging
import os
import signal
import sys

LAUNCHER_FLAGS = ("--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port")


def wants_launcher(argv: list[str]) -> bool:
    """True for `python trainer.py --nproc_per_node ...` (not inside a rank, where torchrun set RANK)."""
    return "RANK" not in os.environ and any(a.split("=")[0] == "--nproc_per_node" for a in argv)


def split_args(argv: list[str]) -> tuple[dict, list[str]]:
    """-> (launcher flags, the rest for the trainer); flags take `--flag=value` or `--flag value`."""
    flags, rest, i = {}, [], 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name in LAUNCHER_FLAGS:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            flags[name[2:]] = value
        else:
            rest.append(argv[i])
        i += 1
    return flags, rest


def _children() -> list[int]:
    """Pids of this process's children (the ranks torchrun's agent started in this process)."""
    me, out = str(os.getpid()), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    out.append(int(pid))
        except (OSError, IndexError):
            continue
    return out


def run(argv: list[str], preflight) -> int:
    """preflight(trainer_args, world) raises config.ConfigError on anything wrong; -> the process exit code."""
    from config import ConfigError
    flags, rest = split_args(argv)
    try:
        nproc, nnodes = int(flags.get("nproc_per_node", "")), int(flags.get("nnodes", "1"))
    except ValueError:
        print(f"config error: --nproc_per_node and --nnodes take integers, got {flags}", file=sys.stderr)
        return 2
    try:
        preflight(rest, nproc * nnodes)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run as torchrun
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGHUP,SIGQUIT"  # SIGTERM and SIGINT are ours (below)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    stopping = []

    def forward(signum, frame):
        if not stopping:
            stopping.append(signum)
            for pid in _children():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    tr = [f"--nproc_per_node={nproc}", f"--nnodes={nnodes}"]
    if nnodes == 1 and "master_addr" not in flags:
        tr.append("--standalone")
    tr += [f"--{k}={v}" for k, v in flags.items() if k not in ("nproc_per_node", "nnodes")]
    try:
        torchrun(get_args_parser().parse_args(tr + [os.path.abspath(sys.argv[0]), *rest]))
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        return next((c for c in codes if c in (2, 3)), 1)
    return 0


class StopSignal:
    """In a rank: SIGTERM / SIGINT set a flag; the loop finishes its step, checkpoints and exits 0."""

    def __init__(self):
        self.raised = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.raised = True

    def agreed(self, device) -> bool:
        """True on every rank once any rank got a signal."""
        from model import all_max
        return all_max(int(self.raised), device) > 0
