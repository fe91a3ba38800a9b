"""Run untrusted Python in a throw-away sandbox and report what happened; never raises on hostile code.

    res = run_python(script, files={"candidate.py": code}, timeout_s=60, read_back=("result.pt",))
    res.status    # ok | exit_nonzero | timeout | signal | output_too_large | sandbox_error
    res.files     # {"result.pt": b"..."} for the read_back names the script wrote (absent if not written)

Layers, outermost first (rewards/README.md has the full table of what is and is not enforced):
- own session / process group, SIGKILLed as a whole on the wall timeout and again after a normal exit;
- rlimits: CPU seconds, address space (data segment when gpu=True, CUDA reserves huge virtual ranges),
  process count, file size, no core dumps;
- scrubbed environment (PATH, HOME, LANG, single-threaded BLAS/OpenMP, plus the caller's `env`);
- a fresh scratch directory as cwd, deleted afterwards;
- bubblewrap (`bwrap`, Debian package bubblewrap), when it exists and works: new mount, pid, net, ipc, uts
  and cgroup namespaces, --die-with-parent, read-only binds of only the interpreter, its site-packages and
  the system library dirs (so /work, the repository and its reference solutions do not exist inside),
  a private size-capped /tmp, the scratch dir as /scratch. Run as root, bwrap gets no user namespace (root
  would bypass RLIMIT_NPROC there); instead the script drops to a fresh unused uid before any untrusted
  code runs, so the process limit counts only this sandbox's processes and nothing outside is writable.
Without a usable bwrap only the rlimits, process group, environment and cwd apply; `not_enforced` says so.
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

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/ld.so.conf",
                "/etc/ld.so.conf.d", "/etc/alternatives")
_GPU_PATHS = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1",
              "/dev/nvidia2", "/dev/nvidia3", "/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia6", "/dev/nvidia7",
              "/dev/dri", "/sys")
_NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
_UID_BASE = 1_000_000      # sandbox uids are drawn from [_UID_BASE, _UID_BASE + 2**20): unused by real accounts
_SCRATCH = "/scratch"      # where the scratch dir appears inside bwrap
_MAIN = "sandbox_main.py"  # the script's file name in the scratch dir: every sandbox process has it in its argv
# The first statement the sandboxed interpreter runs when started as root under bwrap: drop to the
# sandbox uid (no groups, no capabilities left), then run the script as __main__.
_DROP_AND_RUN = ("import os, runpy, sys; u = int(sys.argv[1]); os.setgroups([]); os.setresgid(u, u, u); "
                 "os.setresuid(u, u, u); sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


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


def _bwrap_argv(scratch: str, gpu: bool, tmp_mb: int) -> list:
    """bwrap arguments up to (not including) the command; binds each path once, parents created 0755."""
    argv = [shutil.which("bwrap"), *_namespace_flags(), "--die-with-parent", "--new-session"]
    # the private /tmp first: binds below go on top of it, so an interpreter that lives under /tmp
    # (a venv in a CI checkout there) stays visible instead of being hidden by the tmpfs
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(tmp_mb << 20), "--tmpfs", "/tmp"]
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
    argv += ["--bind", scratch, _SCRATCH, "--chdir", _SCRATCH]
    return argv


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


def _tasks_of_uid(uid: int) -> int:
    """How many threads/processes the uid runs now: RLIMIT_NPROC counts them all, not just ours."""
    n = 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:      # the process ended while we looked
            continue
    return n


def _limiter(cpu_s: int, mem_mb: int, nproc: int | None, fsize_mb: int, gpu: bool):
    """preexec_fn for Popen: rlimits (inherited by bwrap and everything it starts). nproc None: leave as is."""
    mem = resource.RLIMIT_DATA if gpu else resource.RLIMIT_AS
    limits = [(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)), (mem, (mem_mb << 20,) * 2),
              (resource.RLIMIT_FSIZE, (fsize_mb << 20,) * 2), (resource.RLIMIT_CORE, (0, 0))]
    if nproc is not None:
        limits.append((resource.RLIMIT_NPROC, (nproc, nproc)))

    def apply():
        for which, value in limits:
            resource.setrlimit(which, value)
    return apply


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


def run_python(script: str, files: dict | None = None, *, timeout_s: float = 60.0, cpu_s: int | None = None,
               mem_mb: int = 4096, nproc: int = 64, fsize_mb: int = 64, tmp_mb: int = 64,
               max_output: int = 1 << 16, read_back: tuple = (), env: dict | None = None, stdin: str = "",
               gpu: bool = False, use_bwrap: bool = True) -> SandboxResult:
    """Run `script` (Python source) with the current interpreter inside a fresh scratch directory.

    files: {plain file name: str | bytes} written to the scratch dir first (the script's cwd); a name with
        a "/" raises ValueError (a caller bug, unlike anything the script does).
    timeout_s: wall clock; cpu_s: CPU seconds (default timeout_s + 1, threads add up); mem_mb: address space;
    nproc: processes + threads the sandbox may add; fsize_mb: largest file it may write (Python ignores
        SIGXFSZ, so a larger write fails with OSError "File too large"); tmp_mb: its /tmp;
    max_output: bytes kept of stdout and of stderr (more is status output_too_large);
    read_back: scratch-relative names returned in .files; env: extra environment variables; stdin: its input;
    gpu: expose /dev/nvidia* and /sys, limit the data segment instead of the address space;
    use_bwrap: False forces the rlimits-only fallback (tests use it)."""
    t0 = time.monotonic()
    problem = bwrap_problem() if use_bwrap else "bwrap disabled by the caller"
    root = os.geteuid() == 0
    enforced = ["own process group killed on wall timeout", "rlimit cpu", "rlimit " + ("data" if gpu else "as"),
                "rlimit fsize", "scrubbed env", "scratch cwd"]
    not_enforced = ["total disk use of the scratch dir (only the per-file size)"]
    outdir = tempfile.mkdtemp(prefix="sandbox-")
    scratch = os.path.join(outdir, "scratch")
    os.mkdir(scratch, 0o700)
    try:
        for name, content in (files or {}).items():
            if os.path.basename(name) != name or name in ("", ".", ".."):
                raise ValueError(f"file name {name!r} is not a plain name in the scratch dir")
            with open(os.path.join(scratch, name), "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
        with open(os.path.join(scratch, _MAIN), "w") as f:
            f.write(script)
        home = _SCRATCH if problem is None else scratch
        run_env = {"PATH": "/usr/bin:/bin", "HOME": home, "USER": "sandbox", "LANG": "C.UTF-8",
                   "TMPDIR": "/tmp" if problem is None else scratch, "PYTHONDONTWRITEBYTECODE": "1",
                   "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "OPENBLAS_NUM_THREADS": "1", **(env or {})}
        if problem is None:
            enforced += ["bwrap: no network, private pid/ipc/uts/mount namespaces, read-only interpreter "
                         "and system dirs only, private /tmp", "rlimit nproc"]
            cmd = _bwrap_argv(scratch, gpu, tmp_mb)
            if root:     # fresh uid: RLIMIT_NPROC counts only this sandbox, nothing outside is writable
                uid = _UID_BASE + secrets.randbelow(1 << 20)
                os.chown(scratch, uid, uid)
                cmd += [sys.executable, "-c", _DROP_AND_RUN, str(uid), _MAIN]
                limit = nproc
            else:
                cmd += [sys.executable, _MAIN]
                limit = _tasks_of_uid(os.getuid()) + nproc
        else:
            not_enforced += [problem, "filesystem isolation (the script can read what this user can, write "
                             "where this user can)", "network isolation", "private /tmp", "pid namespace "
                             "(a child that calls setsid escapes the group kill; RLIMIT_CPU still ends it)"]
            cmd = [sys.executable, _MAIN]
            if root:
                not_enforced.append("rlimit nproc (ignored for root)")
                limit = None
            else:
                enforced.append("rlimit nproc")
                limit = _tasks_of_uid(os.getuid()) + nproc
        cpu = cpu_s if cpu_s is not None else int(timeout_s) + 1
        with open(os.path.join(outdir, "stdin"), "w") as f:
            f.write(stdin)
        status, rc = _run(cmd, scratch, run_env, outdir, timeout_s, _limiter(cpu, mem_mb, limit, fsize_mb, gpu))
        stdout, big_out = _read_capped(os.path.join(outdir, "stdout"), max_output)
        stderr, big_err = _read_capped(os.path.join(outdir, "stderr"), max_output)
        if problem is None and rc is not None and 128 < rc < 128 + signal.NSIG:
            rc = 128 - rc       # bwrap exits 128+N when its child dies of signal N (so does a real exit 128+N)
        sig = _signal_name(-rc) if rc is not None and rc < 0 else None
        if status == "ok":
            status = ("signal" if sig else "output_too_large" if big_out or big_err else
                      "ok" if rc == 0 else "exit_nonzero")
        read = {name: data for name in read_back
                if (data := _read_regular(os.path.join(scratch, name), fsize_mb << 20)) is not None}
        return SandboxResult(status, rc, sig, stdout, stderr, time.monotonic() - t0, read,
                             tuple(enforced), tuple(not_enforced))
    except OSError as e:
        return SandboxResult("sandbox_error", None, None, "", repr(e), time.monotonic() - t0, {},
                             tuple(enforced), tuple(not_enforced))
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


def _run(cmd, cwd, env, outdir, timeout_s, preexec) -> tuple:
    """Start cmd in its own session, wait at most timeout_s, then SIGKILL its process group.
    Returns (status "ok"|"timeout", returncode)."""
    with open(os.path.join(outdir, "stdin"), "rb") as inp, open(os.path.join(outdir, "stdout"), "wb") as out, \
            open(os.path.join(outdir, "stderr"), "wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=inp, stdout=out, stderr=err,
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
