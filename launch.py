"""The run's lifecycle: which run_dir a run may use, resume points, stop signals, and the launcher.

The launcher: `python trainer.py --nproc_per_node N [--nnodes M --node_rank R --master_addr A --master_port P]
--config ...` checks the config and data once, before any rank starts, then runs torchrun's launcher in this
process and owns the run's shutdown and exit code:

- a config or data error: one message, exit 2, no rank started;
- SIGTERM or SIGINT (to this process, its process group, or Ctrl-C): forwarded once to every rank as SIGTERM; the
  ranks finish the step, checkpoint and exit 0, and so does this process (torchrun itself would give the ranks
  30 s and then kill them, and end in a traceback with exit 1);
- a rank that stops with exit 2 (config) or 3 (training stopped): this process exits with that code, without
  torchrun's failure report (the rank has printed its message).

Plain `torchrun ... trainer.py` works too; there, errors exit 1 after torchrun's report, and say_once keeps the
rank's message from being lost to it.
"""
import atexit
import dataclasses
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import yaml

from config import ConfigError
from model import all_max, too_many_ranks


def read_manifest(path: Path) -> dict:
    """A checkpoint's manifest.json, checked; a damaged one is a ConfigError naming it."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path / 'manifest.json'}: not a readable checkpoint manifest ({e})") from None
    if not isinstance(manifest, dict) or not {"step", "world", "policy_version"} <= set(manifest):
        raise ConfigError(f"{path / 'manifest.json'}: not a checkpoint manifest (needs step, world, policy_version)")
    return manifest


def complete_checkpoints(root: Path) -> list[Path]:
    """Checkpoint folders with a manifest, oldest first (half-written .tmp folders are ignored)."""
    return sorted(p for p in root.glob("step_*") if not p.name.endswith(".tmp") and (p / "manifest.json").is_file())


def save_checkpoint(run, step: int) -> Path:
    """run.state_dict(): the sharded part through torch.distributed.checkpoint, each rank's part in rankN.pt, the
    shared part in manifest.json. Written to step_N.tmp, renamed to step_N when every rank is done: a folder
    without manifest.json is never taken for a checkpoint."""
    root = run.run_dir / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f"step_{step:06d}.tmp"
    if run.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    sharded, mine, shared = run.state_dict(step)
    dcp.save(sharded, checkpoint_id=str(tmp / "dcp"))
    torch.save(mine, tmp / f"rank{run.rank}.pt")
    dist.barrier()
    if run.rank == 0:
        (tmp / "manifest.json").write_text(json.dumps({**shared, "time": time.time()}))
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        for old in complete_checkpoints(root)[:-run.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load_checkpoint(run, path: Path) -> int:
    """Restore everything save_checkpoint wrote; -> the step it was taken after. A damaged checkpoint is a
    ConfigError naming the file."""
    sharded, _, _ = run.state_dict(0)
    try:
        dcp.load(sharded, checkpoint_id=str(path / "dcp"))
    except Exception as e:  # DCP wraps file and planner errors in several types (CheckpointException...)
        raise ConfigError(f"checkpoint {path / 'dcp'} does not load ({type(e).__name__}: {str(e)[:300]})") from None
    try:
        mine = torch.load(path / f"rank{run.rank}.pt", weights_only=False)  # our own file
        first = torch.load(path / f"rank{run.rank - run.eg.member}.pt", weights_only=False) if run.eg.member else mine
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise ConfigError(f"checkpoint {path / f'rank{run.rank}.pt'} does not load ({type(e).__name__}: {e})") from None
    return run.load_state_dict(sharded, {**first, **mine}, read_manifest(path))


def resume_point(cfg) -> Path | None:
    if cfg.resume == "off":
        return None
    if cfg.resume != "auto":
        return Path(cfg.resume)
    found = complete_checkpoints(Path(cfg.run_dir) / "checkpoints")
    return found[-1] if found else None


RUN_FILES = ("metrics.jsonl", "checkpoints", "export", "eval_summary.json")  # what makes a run_dir used


def run_contents(run_dir: Path) -> list[str]:
    """What a used run_dir holds, said for a message: metrics.jsonl and its steps, the checkpoints (complete or
    half-written), export/, an evaluation's summary; [] for an unused one."""
    out = []
    for name in RUN_FILES:
        p = run_dir / name
        if name == "metrics.jsonl" and p.is_file():
            steps = re.findall(r'^\{"step": (\d+)', p.read_text(), re.M)
            out.append(f"metrics.jsonl with steps {steps[0]}..{steps[-1]}" if steps else "metrics.jsonl")
        elif name == "checkpoints" and p.is_dir():
            done = [c.name for c in complete_checkpoints(p)]
            rest = ", ".join(sorted(c.name for c in p.iterdir())) or "empty"
            out.append(f"checkpoints/ ({', '.join(done)})" if done else
                       f"checkpoints/ with no complete checkpoint ({rest})")
        elif p.exists():
            out.append(name + "/" * p.is_dir())
    return out


def check_run_dir(cfg, world: int) -> None:
    """Before anything starts: a used run_dir is refused unless it is continued from its own checkpoint or
    overwrite: true replaces it (--resume=auto where no complete checkpoint exists, or --resume=<a checkpoint of
    another run_dir>, would mix two runs in one metrics.jsonl); a checkpoint to resume must come from the same
    number of ranks. A run_dir that cannot be created or written in is refused too."""
    run_dir = Path(cfg.run_dir)
    check_writable(run_dir)
    ckpt = resume_point(cfg)
    if ckpt is not None:
        manifest = read_manifest(ckpt)
        if (manifest["world"], manifest.get("tensor_parallel_size", 1)) != (world, cfg.engine.tensor_parallel_size):
            raise ConfigError(f"checkpoint {ckpt} was written by {manifest['world']} ranks (engine.tensor_parallel_size"
                              f"={manifest.get('tensor_parallel_size', 1)}); this run has {world} "
                              f"({cfg.engine.tensor_parallel_size}): resume with the same rank count and t")
    used = run_contents(run_dir)
    if not used or cfg.overwrite or continues(run_dir, ckpt):
        return
    held = "; ".join(used)
    if cfg.resume == "off":
        raise ConfigError(f"run_dir {run_dir} already holds a run ({held}): continue it with --resume=auto, pick a "
                          f"new --run_dir, or delete it with --overwrite=true")
    if ckpt is None:
        raise ConfigError(f"--resume=auto: run_dir {run_dir} holds {held} but no complete checkpoint to continue "
                          f"from: start over there with --overwrite=true (deletes them) or use a fresh --run_dir")
    raise ConfigError(f"--resume={ckpt}: run_dir {run_dir} holds another run ({held}): resume into a fresh "
                      f"--run_dir, or delete that run first with --overwrite=true")


def check_writable(run_dir: Path) -> None:
    """run_dir, or else the nearest folder above it that exists, must be a folder this process can create folders in
    (tried: a temporary folder made and removed)."""
    base = run_dir.absolute()
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise ConfigError(f"run_dir {run_dir}: cannot be created: {base} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(dir=base, prefix=".write-test-"))
    except OSError as e:
        raise ConfigError(f"run_dir {run_dir}: cannot be created (making a folder in {base} fails: {e.strerror})") from None


def continues(run_dir: Path, ckpt: Path | None) -> bool:
    """Whether the checkpoint to resume is one of run_dir's own (its checkpoints/ or a before-resume-N/)."""
    return ckpt is not None and run_dir.resolve() in ckpt.resolve().parents


def start_run_dir(cfg, rank: int) -> Path | None:
    """Rank 0 prepares run_dir (overwrite deletes the run there, and says so; a resume sets aside what lies after
    its checkpoint and the config it replaces: set_aside) and writes config.yaml; -> the checkpoint to resume from,
    if any."""
    run_dir, ckpt = Path(cfg.run_dir), resume_point(cfg)
    if rank == 0:
        if cfg.overwrite and not continues(run_dir, ckpt) and run_contents(run_dir):
            print(f"overwrite: deleting the earlier run in {run_dir} ({'; '.join(run_contents(run_dir))})")
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)
        if ckpt is not None:
            set_aside(run_dir, read_manifest(ckpt)["step"], config)
        (run_dir / "config.yaml").write_text(config)
    dist.barrier()
    return ckpt


def same_settings(old: str, new: str) -> bool:
    """Two config.yaml texts that differ at most in how the run was started (resume, overwrite)."""
    def settings(text):
        try:
            cfg = yaml.safe_load(text)
        except yaml.YAMLError:
            return text
        return {k: v for k, v in cfg.items() if k not in ("resume", "overwrite")} if isinstance(cfg, dict) else text
    return settings(old) == settings(new)


def set_aside(run_dir: Path, step: int, config: str) -> None:
    """Resuming at `step` in run_dir with the resolved config `config`: the config.yaml it replaces (if its settings
    differ), metric lines after `step` and checkpoints newer than it (and then the export) would be overwritten or
    pruned by the resumed run. Move them to run_dir/before-resume-<n>/ (metrics.jsonl whole, as it was) and say
    what moved; metrics.jsonl keeps its lines up to `step`."""
    metrics, old_config = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    lines = [line for line in metrics.read_text().splitlines() if line] if metrics.exists() else []
    keep = [line for line in lines if json.loads(line)["step"] <= step]
    newer = [c for c in complete_checkpoints(run_dir / "checkpoints") if int(c.name[5:]) > step]
    replaced = old_config.exists() and not same_settings(old_config.read_text(), config)
    if len(keep) == len(lines) and not newer and not replaced:
        return
    n = 1
    while (run_dir / f"before-resume-{n}").exists():
        n += 1
    aside = run_dir / f"before-resume-{n}"
    aside.mkdir()
    moved = ["config.yaml (its settings differ from this run's)"] if replaced else []
    if replaced:
        old_config.rename(aside / "config.yaml")
    if len(keep) < len(lines):
        moved.append(f"{len(lines) - len(keep)} metric lines after step {step}")
        shutil.copy2(metrics, aside / "metrics.jsonl")
        metrics.write_text("".join(line + "\n" for line in keep))
    if newer:
        (aside / "checkpoints").mkdir()
    for c in newer:
        c.rename(aside / "checkpoints" / c.name)
    if newer and (run_dir / "export").exists():
        (run_dir / "export").rename(aside / "export")
        moved.append("export/")
    moved += [f"checkpoints/{c.name}" for c in newer]
    print(f"resuming at step {step}: moved {', '.join(moved)} to {aside} (nothing deleted)")


class StopSignal:
    """SIGTERM / SIGINT set a flag; the loop finishes its step, checkpoints and exits 0."""

    def __init__(self):
        self.raised = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.raised = True

    def agreed(self, device) -> bool:
        """True on every rank once any rank got a signal."""
        return all_max(int(self.raised), device) > 0


def exit_process(code: int) -> None:
    """End this process with exit code `code`, without interpreter finalization. The process group is left, atexit
    hooks (wandb, logging) run and output is flushed first. On Python < 3.14, a native thread (gloo's, torch's) that
    takes the GIL while the interpreter finalizes is ended with pthread_exit, which aborts the whole process at random
    ("terminate called without an active exception", SIGABRT) after a run that succeeded."""
    if dist.is_initialized():
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        stream.flush()
    os._exit(code)


def say_once(line: str) -> None:
    """Print a rank's one-line error to stderr before it exits, whichever rank found it, once per node.

    Every rank that finds an error says it itself: waiting for rank 0 to say it loses the line whenever another rank
    exits first (torchrun then kills rank 0 before it prints). The ranks of one torchrun agent share its attempt folder
    (the parent of TORCHELASTIC_ERROR_FILE's folder, unique per agent and attempt): under an exclusive flock on a file
    there, a rank prints its line unless an earlier rank recorded the same one, then records it. The lock is held
    until the line is out, so no rank exits (and gets the others killed) before it is. Without torchrun's folder
    (one process, another launcher) the line is printed as it is; so it is by a rank whose stderr torchrun discards
    (--local-ranks-filter), which records nothing."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    muted = os.path.samestat(os.fstat(sys.__stderr__.fileno()), os.stat(os.devnull))
    if not error_file or muted or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) < 2:
        print(line, file=sys.__stderr__, flush=True)
        return
    with open(Path(error_file).parent.parent / "said.txt", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        if line + "\n" not in f.readlines():
            print(line, file=sys.__stderr__, flush=True)
            f.write(line + "\n")
            f.flush()


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
    flags, rest = split_args(argv)
    try:
        nproc, nnodes = int(flags.get("nproc_per_node", "")), int(flags.get("nnodes", "1"))
    except ValueError:
        print(f"config error: --nproc_per_node and --nnodes take integers, got {flags}", file=sys.stderr)
        return 2
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        print(f"config error: {too_many_ranks(nproc, torch.cuda.device_count())}", file=sys.stderr)
        return 2
    os.environ["LOCAL_WORLD_SIZE"] = str(nproc)  # as torchrun sets it in the ranks: the checks of one node's ranks
    try:
        preflight(rest, nproc * nnodes)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run as torchrun
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // nproc)))
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
    tr = [f"--nproc_per_node={nproc}", f"--nnodes={nnodes}", "--signals_to_handle=SIGHUP,SIGQUIT"]  # TERM, INT: ours
    if nnodes == 1 and "master_addr" not in flags:
        tr.append("--standalone")
    tr += [f"--{k}={v}" for k, v in flags.items() if k not in ("nproc_per_node", "nnodes")]
    try:
        torchrun(get_args_parser().parse_args(tr + [os.path.abspath(sys.argv[0]), *rest]))
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        return next((c for c in codes if c in (2, 3)), 1)
    return 0
