"""Run untrusted Python in a throw-away sandbox and report what happened; never raises on hostile code.

    problem = refusal()     # None, or why untrusted code must not run here (rewards then score 0, no_sandbox)
    res = run_python(script, files={"candidate.py": code}, timeout_s=60, read_back=("result.bin",))
    res.status    # ok | exit_nonzero | timeout | signal | oom | output_too_large | sandbox_error
    res.files     # {"result.bin": b"..."} for the read_back names the script wrote (absent if left empty)

Layers, outermost first (rewards/README.md has the full table of what is and is not enforced):
- bubblewrap (`bwrap`, Debian package bubblewrap; `make install` brings it): new mount, pid, net, ipc, uts
  and cgroup namespaces, --die-with-parent; read-only binds of only the interpreter, its site-packages and
  the system library dirs (so /work, the repository and its reference solutions do not exist inside); the
  cwd /scratch is a size-capped tmpfs that vanishes with the sandbox, holding `files` as read-only binds and
  each read_back name as a writable bind of one host file (nothing else the script writes reaches the host);
  a private size-capped /tmp. When the pid namespace's first process ends, the kernel kills the rest.
- as root, the script drops to a fresh unused uid before it runs (bwrap gets no user namespace then: root
  would bypass RLIMIT_NPROC in one), so the process limit counts this sandbox only, nothing outside is
  writable, and every process of that uid is SIGKILLed after the run;
- a memory cgroup per sandbox (v2, or the v1 memory controller) when this process may create one: the limit
  holds for all its processes together, an OOM kill is status "oom", and every member is SIGKILLed after;
- rlimits: CPU seconds, address space per process (data segment when gpu=True), processes, file size, no core;
- own session / process group, SIGKILLed on the wall timeout and again after a normal exit; inside a reward or
  tool pool job the wall timeout is cut to end CLEANUP_S before the pool's (inner_limit), so the sandbox, not the
  pool's SIGKILL of the worker, ends an overlong run and its files go with it;
- scrubbed environment (PATH, HOME, LANG, single-threaded BLAS/OpenMP, plus the caller's `env`).
Without a usable bwrap the rewards refuse to run (`refusal()`), unless the operator opted out
(RL_SANDBOX_OPT_OUT=1, set by `require_isolation(opt_out=True)`): then only the layers below bwrap apply and
`not_enforced` says what is missing.
"""

import functools
import os
import resource
import secrets
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from rewards.deadline import time_left

OPT_OUT_ENV = "RL_SANDBOX_OPT_OUT"   # "1": run untrusted code even without bwrap (rlimits only)
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/ld.so.conf",
                "/etc/ld.so.conf.d", "/etc/alternatives")
_GPU_PATHS = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1",
              "/dev/nvidia2", "/dev/nvidia3", "/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia6", "/dev/nvidia7",
              "/dev/nvidia-caps", "/dev/dri", "/sys")   # nvidia-caps: MIG instances
# what the CUDA driver, runtime and Triton find their libraries by (NGC images, GKE's /usr/local/nvidia/lib64,
# conda): passed into a GPU sandbox, each existing directory they name bound read-only (_gpu_dirs)
_GPU_ENV = ("LD_LIBRARY_PATH", "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH", "CUDA_HOME", "CUDA_PATH")
_NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
_UID_BASE = 1_000_000      # sandbox uids are drawn from [_UID_BASE, _UID_BASE + 2**20): unused by real accounts
_SCRATCH = "/scratch"      # the script's cwd inside bwrap
_MAIN = "sandbox_main.py"  # the script's file name in the scratch dir: every sandbox process has it in its argv
_KILL_WAIT_S = 2.0         # how long the after-run kills keep polling for members that are still exiting
CLEANUP_S = 3.0            # a sandbox in a pool job ends this long before the pool would kill the job: the kills
                           # (up to _KILL_WAIT_S), reading its output, removing its files and returning fit in it
# The first statement the sandboxed interpreter runs when started as root: drop to the sandbox uid (no groups,
# no capabilities left), then run the script as __main__.
_DROP_AND_RUN = ("import os, runpy, sys; u = int(sys.argv[1]); os.setgroups([]); os.setresgid(u, u, u); "
                 "os.setresuid(u, u, u); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


class SandboxUnavailable(RuntimeError):
    """Raised by require_isolation when untrusted code could only run without bwrap and nobody opted out."""


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did. returncode: exit code, or -N when killed by signal N (None if never started)."""
    status: str
    returncode: int | None
    signal: str | None
    stdout: str
    stderr: str
    wall_s: float
    files: dict = field(default_factory=dict)          # {read_back name: bytes}
    enforced: tuple = ()
    not_enforced: tuple = ()


@functools.cache
def bwrap_problem() -> str | None:
    """None when bwrap exists and can build a sandbox here, else why not (cached per process)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap not installed (apt-get install bubblewrap)"
    probe = [exe, *_namespace_flags(), "--die-with-parent", "--ro-bind", "/", "/", "true"]
    try:
        proc = subprocess.run(probe, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap unusable: {e}"
    return None if proc.returncode == 0 else f"bwrap unusable: {proc.stderr.decode(errors='replace').strip()}"


def refusal() -> str | None:
    """Why untrusted code must not run here (bwrap missing or unusable and no opt-out), else None."""
    problem = bwrap_problem()
    return None if problem is None or os.environ.get(OPT_OUT_ENV) == "1" else problem


def require_isolation(opt_out: bool) -> None:
    """Call once at trainer start when rewards run untrusted code (code or triton tasks). Returns when bwrap
    works. Without it: opt_out=True sets RL_SANDBOX_OPT_OUT=1 (inherited by reward workers: rlimits only,
    the risk is accepted); opt_out=False raises SandboxUnavailable naming what to install."""
    problem = bwrap_problem()
    if problem is None:
        return
    if opt_out:
        os.environ[OPT_OUT_ENV] = "1"
        return
    raise SandboxUnavailable(
        f"reward sandbox unavailable: {problem}. Code and Triton rewards run model-written code and need "
        "bubblewrap: run `make install` as root (it runs `apt-get install -y bubblewrap`), or install the "
        "Debian/Ubuntu package bubblewrap yourself. Without it every such reward scores 0 (reason no_sandbox). "
        "To run with rlimits only and accept that generated code can read, write and connect wherever this "
        "user can, set sandbox_opt_out: true.")


def _namespace_flags() -> tuple:
    # root keeps the init user namespace (see module doc); anyone else needs a user namespace for the rest
    return _NAMESPACES if os.geteuid() == 0 else ("--unshare-all",)


def _interpreter_paths() -> list:
    """The paths the interpreter needs: its install prefix and, in a venv, pyvenv.cfg, the executable and
    site-packages; never the rest of the venv's parent (the repository)."""
    paths = [sys.base_prefix, sys.base_exec_prefix]
    if sys.prefix != sys.base_prefix:
        paths += [os.path.join(sys.prefix, "pyvenv.cfg"), sys.executable, *site.getsitepackages()]
    return [p for p in paths if os.path.exists(p)]


def _bwrap_argv(host_dir: str, names_ro: tuple, names_rw: tuple, gpu: bool, tmp_mb: int, disk_mb: int) -> list:
    """bwrap arguments up to (not including) the command; binds each path once, parents created 0755.
    host_dir/<name> is bound read-only (names_ro) or writable (names_rw) at /scratch/<name>."""
    argv = [shutil.which("bwrap"), *_namespace_flags(), "--die-with-parent", "--new-session"]
    # the tmpfs mounts first: binds below go on top of them, so an interpreter that lives under /tmp
    # (a venv in a CI checkout there) stays visible instead of being hidden by the tmpfs
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmp_mb << 20), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(disk_mb << 20), "--tmpfs", _SCRATCH]
    bound, made = [], set()

    def covered(path):
        return any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound)

    def bind(flag, path, src=None):
        if covered(path):
            return
        parents = []
        parent = os.path.dirname(path)
        while parent != "/" and parent not in made and not covered(parent):
            parents.append(parent)
            parent = os.path.dirname(parent)
        for p in reversed(parents):
            argv.extend(["--perms", "0755", "--dir", p])
            made.add(p)
        argv.extend([flag, src or path, path])
        bound.append(path)

    for path in _SYSTEM_DIRS:
        if os.path.exists(path):
            bind("--ro-bind", path)
    for path in _interpreter_paths():       # a symlinked venv executable is bound as the file it points to
        bind("--ro-bind", path, os.path.realpath(path))
    if gpu:
        for path in _GPU_PATHS:
            if os.path.exists(path):
                bind("--dev-bind" if path.startswith("/dev/") else "--ro-bind", path)
        for path in _gpu_dirs():
            bind("--ro-bind", path, os.path.realpath(path))
    for flag, names in (("--ro-bind", names_ro), ("--bind", names_rw)):
        for name in names:
            argv += [flag, os.path.join(host_dir, name), f"{_SCRATCH}/{name}"]
    argv += ["--chdir", _SCRATCH]
    return argv


def _gpu_dirs(env=os.environ) -> list:
    """The existing directories _GPU_ENV's variables name (a file's directory for a file), but never the cwd, an
    ancestor of it or anything inside it (the repository and its reference solutions stay out of the sandbox)."""
    here, out = os.path.realpath(os.getcwd()), []
    for name in _GPU_ENV:
        for path in env.get(name, "").split(os.pathsep):
            path = os.path.realpath(path) if path else ""
            path = path if os.path.isdir(path) else os.path.dirname(path) if os.path.isfile(path) else ""
            if path and os.path.commonpath([path, here]) not in (path, here) and path not in out:
                out.append(path)
    return out


def gpu_problem(env=os.environ) -> str | None:
    """Why this rank's GPU sandboxes cannot run beside it, or None: an MPS server (its pipe directory: one client's
    fault can end every client of the GPU, the trainer's context included, and the sandbox's private /tmp hides the
    default pipe) or a GPU in EXCLUSIVE_PROCESS mode (the rank's own context takes the one process it admits)."""
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    if os.path.exists(os.path.join(pipe, "control")):
        return (f"an NVIDIA MPS server runs ({pipe}/control): sandboxed Triton rewards are not run under MPS (a "
                f"candidate's fault can end the trainer's context); stop it (echo quit | nvidia-cuda-mps-control)")
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    try:
        mode = subprocess.run([smi, "--query-gpu=compute_mode", "--format=csv,noheader", "-i",
                               rank_gpu_env(env)["CUDA_VISIBLE_DEVICES"]], capture_output=True, text=True,
                              timeout=30).stdout if smi else ""
    except (OSError, subprocess.TimeoutExpired):
        mode = ""
    if "exclusive_process" in mode.lower():
        return ("the GPU is in EXCLUSIVE_PROCESS compute mode: the trainer's context leaves none for the Triton "
                "reward's sandboxes; set it to DEFAULT (nvidia-smi -c DEFAULT) or score Triton rewards elsewhere")
    return None


def rank_gpu_env(env=os.environ) -> dict:
    """The environment that shows a GPU sandbox exactly this rank's device, as the CUDA runtime numbers it here:
    rank LOCAL_RANK runs on cuda:LOCAL_RANK (model.init_distributed; torchrun sets LOCAL_RANK, not
    CUDA_VISIBLE_DEVICES), which is entry LOCAL_RANK of a CUDA_VISIBLE_DEVICES the user set (an index or a UUID) and
    index LOCAL_RANK without one; CUDA_DEVICE_ORDER, which decides that numbering, goes along when set."""
    local = int(env.get("LOCAL_RANK", "0"))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    out = {"CUDA_VISIBLE_DEVICES": str(local) if visible is None else visible.split(",")[local].strip()}
    if "CUDA_DEVICE_ORDER" in env:
        out["CUDA_DEVICE_ORDER"] = env["CUDA_DEVICE_ORDER"]
    return out


def _passed_gpu_env(env=os.environ) -> dict:
    """A GPU sandbox's part of the environment: the rank's device alone (rank_gpu_env) and _GPU_ENV as set here."""
    return {**{k: env[k] for k in _GPU_ENV if k in env}, **rank_gpu_env(env)}


def inner_limit(timeout_s: float) -> float:
    """The wall limit a sandbox may take: timeout_s, cut to the time the pool job running this call has left minus
    CLEANUP_S (rewards/deadline.py's time_left; none outside a pool job), never below 0. Each limit below the pool's
    is derived from it this way, so the innermost fires first and cleans up after itself."""
    left = time_left()
    return timeout_s if left is None else max(0.0, min(timeout_s, left - CLEANUP_S))


def running_sandboxes(wait_s: float = 0.0) -> list:
    """Pids of processes on this machine (any pid namespace) still running a sandboxed script, polled for up
    to wait_s until there are none (the kernel tears a dead pid namespace down asynchronously). [] when every
    sandbox is gone, which is what the tests check after hostile code."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:      # the process ended while we looked
                continue
            if _MAIN.encode() in argv:
                pids.append(int(pid))
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


def _pids_of_uid(uid: int) -> list:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                pids.append(int(pid))
        except OSError:      # the process ended while we looked
            continue
    return pids


def _tasks_of_uid(uid: int) -> int:
    """How many threads/processes the uid runs now: RLIMIT_NPROC counts them all, not just ours."""
    n = 0
    for pid in _pids_of_uid(uid):
        try:
            n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:      # the process ended while we looked
            continue
    return n


def _kill_all(list_pids) -> None:
    """SIGKILL every pid list_pids() returns until it returns none (at most _KILL_WAIT_S)."""
    deadline = time.monotonic() + _KILL_WAIT_S
    while (pids := list_pids()) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


# ---- memory cgroup per sandbox ----
@functools.cache
def _cgroup_parent() -> tuple | None:
    """(version 1 | 2, dir) of a memory cgroup this process may create children in (this process's own memory
    cgroup), or None. Probed once by creating and removing a child."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    own = {ctrl: path for _, ctrls, path in lines for ctrl in ctrls.split(",")}
    candidates = []
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and "" in own:
        candidates.append((2, "/sys/fs/cgroup" + own[""]))
    if "memory" in own:
        candidates.append((1, "/sys/fs/cgroup/memory" + own["memory"]))
    for version, parent in candidates:
        probe = os.path.join(parent, f"rl-sandbox-probe-{os.getpid()}")
        try:
            if version == 2:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    if "memory" not in f.read().split():
                        continue
            os.mkdir(probe)
            _write(probe, "memory.max" if version == 2 else "memory.limit_in_bytes", str(1 << 30))
            os.rmdir(probe)
            _remove_stale_cgroups(parent)
            return version, parent
        except OSError:
            _rmdir_cgroup(probe)
            continue
    return None


def _remove_stale_cgroups(parent: str) -> None:
    """rmdir the sandbox cgroups of processes that died mid-run (a reward worker killed on its timeout: bwrap
    and the sandbox die with it, the empty cgroup stays)."""
    for name in os.listdir(parent):
        parts = name.split("-")
        if name.startswith("rl-sandbox-") and len(parts) == 4 and parts[2].isdigit() and \
                not os.path.exists(f"/proc/{parts[2]}"):
            _rmdir_cgroup(os.path.join(parent, name))


def _write(cg: str, name: str, value: str) -> None:
    with open(os.path.join(cg, name), "w") as f:
        f.write(value)


def _rmdir_cgroup(cg: str) -> None:
    try:
        os.rmdir(cg)
    except OSError:       # already gone, or a member still exiting: the kernel frees it with its last member
        pass


def _make_cgroup(mem_mb: int) -> tuple | None:
    """(version, dir) of a fresh memory cgroup limited to mem_mb (no swap), or None where there is none."""
    base = _cgroup_parent()
    if base is None:
        return None
    version, parent = base
    cg = os.path.join(parent, f"rl-sandbox-{os.getpid()}-{secrets.token_hex(6)}")
    try:
        os.mkdir(cg)
        if version == 2:
            _write(cg, "memory.max", str(mem_mb << 20))
            if os.path.exists(os.path.join(cg, "memory.swap.max")):
                _write(cg, "memory.swap.max", "0")
        else:
            _write(cg, "memory.limit_in_bytes", str(mem_mb << 20))
    except OSError:
        _rmdir_cgroup(cg)
        return None
    return version, cg


def _cgroup_pids(cg: str) -> list:
    try:
        with open(os.path.join(cg, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _cgroup_oom_kills(version: int, cg: str) -> int:
    name, key = ("memory.events", "oom_kill") if version == 2 else ("memory.oom_control", "oom_kill")
    try:
        with open(os.path.join(cg, name)) as f:
            fields = dict(line.split() for line in f if len(line.split()) == 2)
    except OSError:
        return 0
    return int(fields.get(key, 0))


# ---- process setup ----
def _limiter(cpu_s: int, mem_mb: int, nproc: int | None, fsize_mb: int, gpu: bool, cgroup_procs: str | None):
    """preexec_fn for Popen: join the sandbox's cgroup, then rlimits (inherited by bwrap and everything it
    starts). nproc None: leave as is."""
    mem = resource.RLIMIT_DATA if gpu else resource.RLIMIT_AS
    limits = [(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)), (mem, (mem_mb << 20,) * 2),
              (resource.RLIMIT_FSIZE, (fsize_mb << 20,) * 2), (resource.RLIMIT_CORE, (0, 0))]
    if nproc is not None:
        limits.append((resource.RLIMIT_NPROC, (nproc, nproc)))

    def apply():
        if cgroup_procs is not None:
            with open(cgroup_procs, "w") as f:
                f.write(str(os.getpid()))
        for which, value in limits:
            resource.setrlimit(which, value)
    return apply


@functools.cache
def _others_can_run_python() -> bool:
    """Whether an unprivileged uid can start this interpreter outside bwrap (probed once, as root)."""
    uid = _UID_BASE + secrets.randbelow(1 << 20)
    try:
        return subprocess.run([sys.executable, "-c", _DROP_AND_RUN.replace("runpy.run_path(sys.argv[0], "
                               "run_name='__main__')", "import pkgutil"), str(uid)], capture_output=True,
                              timeout=30, cwd="/").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _check_name(name: str, taken) -> None:
    if os.path.basename(name) != name or name in ("", ".", "..", _MAIN) or name in taken:
        raise ValueError(f"file name {name!r} is not a free plain name in the scratch dir")


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:        # real-time signals have no name of their own
        return f"SIG{n}"


def _read_regular(path: str, cap: int) -> bytes | None:
    """At most cap bytes of path if it is a regular file; None for anything else (missing, a symlink planted by
    the script, a FIFO that would block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(cap)
    finally:
        os.close(fd)


def _read_capped(path: str, cap: int) -> tuple:
    """(text of at most cap bytes, whether the file was longer)."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode(errors="replace"), len(data) > cap


def remove_tree(path: str) -> None:
    """Delete the directory path and everything in it; never raises. Iterative and fd-relative, so a tree of
    any depth (thousands of nested dirs, paths longer than PATH_MAX) goes without recursion; directories the
    script made unreadable are made searchable first. Only the fallback leaves the script's files on the host."""
    try:
        cur = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    stack = []      # [(name of cur in its parent, names of subdirs of the parent still to remove)]
    todo = None     # subdirs of cur, once its files are gone
    try:
        while True:
            if todo is None:
                todo = []
                with os.scandir(cur) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.name)
                        else:
                            os.unlink(entry.name, dir_fd=cur)
            if todo:
                name = todo.pop()
                os.chmod(name, 0o700, dir_fd=cur)      # a plain dir (not a link): nothing runs here any more
                nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=cur)
                stack.append((name, todo))
                os.close(cur)
                cur, todo = nxt, None
                continue
            if not stack:
                break
            name, todo = stack.pop()
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            os.close(cur)
            cur = parent
            os.rmdir(name, dir_fd=cur)
    except OSError:
        pass
    finally:
        os.close(cur)
    try:
        os.rmdir(path)
    except OSError:
        pass


def run_python(script: str, files: dict | None = None, *, timeout_s: float = 60.0, cpu_s: int | None = None,
               mem_mb: int = 4096, nproc: int = 64, fsize_mb: int = 64, tmp_mb: int = 64, disk_mb: int = 128,
               max_output: int = 1 << 16, read_back: tuple = (), env: dict | None = None, stdin: bytes | str = "",
               pass_fds: tuple = (), gpu: bool = False, use_bwrap: bool = True, wrapper: tuple = ()) -> SandboxResult:
    """Run `script` (Python source) with the current interpreter in a fresh scratch directory (its cwd).

    files: {plain file name: str | bytes} the script can read (read-only under bwrap); a name with a "/"
        raises ValueError (a caller bug, unlike anything the script does);
    timeout_s: wall clock, cut by inner_limit inside a pool job; cpu_s: CPU seconds (default timeout_s + 1,
        threads add up); mem_mb: memory of the whole sandbox (cgroup) and address space of each process;
        nproc: processes + threads it may add;
    fsize_mb: largest file it may write (Python ignores SIGXFSZ: a larger write fails with OSError "File too
        large"); tmp_mb: its /tmp; disk_mb: its scratch dir (a tmpfs under bwrap);
    max_output: bytes kept of stdout and of stderr (more is status output_too_large);
    read_back: names the script may write in its cwd, returned in .files unless left empty; env: extra
        environment variables; stdin: its input; pass_fds: open fds it inherits (pipes to a peer), closed
        here once it has them, so the peer sees EOF when the script ends;
    gpu: expose /dev/nvidia* (nvidia-caps: MIG) and /sys, limit the data segment instead of the address space, show
        CUDA only this rank's device (rank_gpu_env: its "cuda" is the rank's GPU, not GPU 0), and pass the loader
        variables _GPU_ENV with the directories they name (_gpu_dirs);
    use_bwrap: False forces the fallback without bwrap (tests use it); wrapper: a trusted program (and its
        arguments) the interpreter runs under, inside the sandbox (compute-sanitizer)."""
    t0 = time.monotonic()
    timeout_s = inner_limit(timeout_s)
    problem = bwrap_problem() if use_bwrap else "bwrap disabled by the caller"
    root = os.geteuid() == 0
    enforced = ["own process group killed on wall timeout", "rlimit cpu", "rlimit " + ("data" if gpu else "as"),
                "rlimit fsize", "rlimit nproc", "scrubbed env"]
    not_enforced = []
    cgroup = _make_cgroup(mem_mb)
    if cgroup:
        enforced.append("memory cgroup for the whole sandbox, all its processes killed after the run")
    else:
        not_enforced.append(f"memory per sandbox (no writable memory cgroup: {mem_mb} MiB per process only)")
    outdir = tempfile.mkdtemp(prefix="sandbox-")
    host = os.path.join(outdir, "scratch")
    os.mkdir(host, 0o755)
    # a fresh uid needs bwrap's binds or an interpreter every user can read (not one under /root)
    uid = _UID_BASE + secrets.randbelow(1 << 20) if root and (problem is None or _others_can_run_python()) else None
    try:
        for name, content in (files or {}).items():
            _check_name(name, read_back)
            with open(os.path.join(host, name), "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
        with open(os.path.join(host, _MAIN), "w") as f:
            f.write(script)
        for name in read_back:
            _check_name(name, ())
            open(os.path.join(host, name), "wb").close()
            if uid is not None:
                os.chown(os.path.join(host, name), uid, uid)
        if problem is None:
            enforced += ["bwrap: no network, private pid/ipc/uts/mount namespaces, read-only interpreter "
                         "and system dirs only, private /tmp", "scratch dir: private size-capped tmpfs, "
                         "only the read_back files reach the host"]
            cmd = _bwrap_argv(host, tuple(files or ()) + (_MAIN,), tuple(read_back), gpu, tmp_mb, disk_mb)
            home = _SCRATCH
        else:
            not_enforced += [problem, "filesystem isolation (the script can read what this user can, write "
                             "where this user can)", "network isolation", "private /tmp",
                             "total disk use of the scratch dir (only the per-file size)"]
            if uid is None and cgroup is None:
                not_enforced.append("pid namespace (a child that calls setsid escapes the group kill; "
                                    "RLIMIT_CPU still ends it)")
            cmd, home = [], host
            if uid is not None:
                os.chown(host, uid, uid)
        if root and uid is None:
            not_enforced.append("fresh uid (the interpreter is not readable by other users): the script runs "
                                "as root, RLIMIT_NPROC does not bind it")
        if uid is not None:     # fresh uid: RLIMIT_NPROC counts only this sandbox, nothing outside is writable
            enforced.append("fresh uid, all its processes killed after the run")
            cmd += [*wrapper, sys.executable, "-c", _DROP_AND_RUN, str(uid), _MAIN]
            limit = nproc
        else:
            cmd += [*wrapper, sys.executable, _MAIN]
            limit = _tasks_of_uid(os.getuid()) + nproc
        run_env = {"PATH": "/usr/bin:/bin", "HOME": home, "USER": "sandbox", "LANG": "C.UTF-8",
                   "TMPDIR": "/tmp" if problem is None else host, "PYTHONDONTWRITEBYTECODE": "1",
                   "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "OPENBLAS_NUM_THREADS": "1", **(_passed_gpu_env() if gpu else {}), **(env or {})}
        cpu = cpu_s if cpu_s is not None else int(timeout_s) + 1
        with open(os.path.join(outdir, "stdin"), "wb") as f:
            f.write(stdin.encode() if isinstance(stdin, str) else stdin)
        preexec = _limiter(cpu, mem_mb, limit, fsize_mb, gpu,
                           os.path.join(cgroup[1], "cgroup.procs") if cgroup else None)
        try:
            status, rc = _run(cmd, host, run_env, outdir, timeout_s, preexec, pass_fds)
        finally:
            if cgroup:
                _kill_all(lambda: _cgroup_pids(cgroup[1]))
            if uid is not None:
                _kill_all(lambda: _pids_of_uid(uid))
        stdout, big_out = _read_capped(os.path.join(outdir, "stdout"), max_output)
        stderr, big_err = _read_capped(os.path.join(outdir, "stderr"), max_output)
        if problem is None and rc is not None and 128 < rc < 128 + signal.NSIG:
            rc = 128 - rc       # bwrap exits 128+N when its child dies of signal N (so does a real exit 128+N)
        sig = _signal_name(-rc) if rc is not None and rc < 0 else None
        if status == "ok":
            status = ("oom" if cgroup and _cgroup_oom_kills(*cgroup) else "signal" if sig else
                      "output_too_large" if big_out or big_err else "ok" if rc == 0 else "exit_nonzero")
        read = {name: data for name in read_back
                if (data := _read_regular(os.path.join(host, name), fsize_mb << 20))}
        return SandboxResult(status, rc, sig, stdout, stderr, time.monotonic() - t0, read,
                             tuple(enforced), tuple(not_enforced))
    except (OSError, subprocess.SubprocessError) as e:     # SubprocessError: joining the cgroup failed
        return SandboxResult("sandbox_error", None, None, "", repr(e), time.monotonic() - t0, {},
                             tuple(enforced), tuple(not_enforced))
    finally:
        for fd in pass_fds:     # the script owns them now: a peer sees EOF once the script is gone
            os.close(fd)
        remove_tree(outdir)
        if cgroup:
            _rmdir_cgroup(cgroup[1])


def _run(cmd, cwd, env, outdir, timeout_s, preexec, pass_fds) -> tuple:
    """Start cmd in its own session, wait at most timeout_s, then SIGKILL its process group.
    Returns (status "ok"|"timeout", returncode)."""
    with open(os.path.join(outdir, "stdin"), "rb") as inp, open(os.path.join(outdir, "stdout"), "wb") as out, \
            open(os.path.join(outdir, "stderr"), "wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=inp, stdout=out, stderr=err, pass_fds=pass_fds,
                                start_new_session=True, preexec_fn=preexec, close_fds=True)
        try:
            proc.wait(timeout=timeout_s)
            status = "ok"
        except subprocess.TimeoutExpired:
            status = "timeout"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:      # the group is already gone
            pass
        proc.wait()
    return status, proc.returncode
