"""rewards/sandbox.py: limits, isolation and the rlimits-only fallback, with plain-Python scripts (no torch).

The bwrap tests are skipped where bubblewrap is missing or unusable; the fallback tests always run.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewards import sandbox
from rewards.sandbox import (OPT_OUT_ENV, SandboxUnavailable, _cgroup_parent, bwrap_problem, refusal, remove_tree,
                             require_isolation, run_python, running_sandboxes)

ROOT = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")
needs_cgroup = pytest.mark.skipif(_cgroup_parent() is None, reason="no writable memory cgroup here")
BOTH = [pytest.param(True, marks=needs_bwrap), False]
# a process that sleeps 300 s with the marker in its argv (GNU sleep would reject the marker and exit at once);
# pasted into scripts, which define SLEEPER first
SLEEPER_DEF = f"SLEEPER = [{sys.executable!r}, '-c', 'import time; time.sleep(300)']\n"


def _processes_with(marker: str, wait_s: float = 10.0) -> list:
    """Host processes whose command line contains marker, polled until there are none or wait_s passed (a
    dead pid namespace is torn down asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        found = [line for line in out.splitlines() if marker in line and "ps -eo" not in line]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.parametrize("use_bwrap", [pytest.param(True, marks=needs_bwrap), False])
def test_runs_script_in_scratch_and_reads_back(use_bwrap):
    res = run_python("import sys\nprint('hi', sys.stdin.read())\nopen('out.txt', 'w').write(open('in.txt').read() * 2)",
                     files={"in.txt": "ab"}, stdin="there", read_back=("out.txt", "missing.txt"), use_bwrap=use_bwrap)
    assert res.status == "ok", res
    assert res.stdout == "hi there\n" and res.files == {"out.txt": b"abab"}
    assert res.returncode == 0 and res.signal is None


@pytest.mark.parametrize("use_bwrap", [pytest.param(True, marks=needs_bwrap), False])
@pytest.mark.parametrize("script, status, signal", [
    ("import sys; sys.exit(3)", "exit_nonzero", None),
    ("raise ValueError('boom')", "exit_nonzero", None),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "signal", "SIGSEGV"),
    ("print('x' * 200000)", "output_too_large", None),
    ("open('big', 'wb').write(b'x' * (3 << 20))", "exit_nonzero", None),
])
def test_status_codes(use_bwrap, script, status, signal):
    res = run_python(script, fsize_mb=2, use_bwrap=use_bwrap)
    assert (res.status, res.signal) == (status, signal), res
    assert len(res.stdout) <= 1 << 16
    if "big" in script:
        assert "File too large" in res.stderr


@pytest.mark.parametrize("use_bwrap", [pytest.param(True, marks=needs_bwrap), False])
def test_wall_timeout_kills_the_whole_group(use_bwrap):
    marker = f"sbx-timeout-{os.getpid()}-{use_bwrap}"
    script = SLEEPER_DEF + (f"import subprocess, time\nsubprocess.Popen(SLEEPER + ['{marker}'])\n"
              "while True: pass")
    t0 = time.monotonic()
    res = run_python(script, timeout_s=2, use_bwrap=use_bwrap)
    assert res.status == "timeout" and res.signal == "SIGKILL", res
    assert time.monotonic() - t0 < 10
    assert _processes_with(marker) == []


@needs_bwrap
def test_setsid_child_does_not_outlive_the_sandbox():
    """A child in its own session leaves the process group; the pid namespace still takes it down."""
    marker = f"sbx-setsid-{os.getpid()}"
    script = SLEEPER_DEF + f"import subprocess\nsubprocess.Popen(SLEEPER + ['{marker}'], start_new_session=True)\n"
    res = run_python(script, timeout_s=5)
    assert res.status == "ok", res
    assert _processes_with(marker) == []


@pytest.mark.parametrize("use_bwrap", [pytest.param(True, marks=needs_bwrap), False])
def test_cpu_time_limit(use_bwrap):
    res = run_python("while True: pass", timeout_s=30, cpu_s=1, use_bwrap=use_bwrap)
    assert res.status == "signal" and res.signal in ("SIGXCPU", "SIGKILL"), res
    assert res.wall_s < 20


@pytest.mark.parametrize("use_bwrap", [pytest.param(True, marks=needs_bwrap), False])
def test_memory_bomb_fails_inside(use_bwrap):
    res = run_python("x = bytearray(8 << 30)", mem_mb=1024, use_bwrap=use_bwrap)
    assert res.status == "exit_nonzero" and "MemoryError" in res.stderr, res


@needs_bwrap
def test_fork_bomb_is_bounded():
    """Forks stop at the process limit (counted per sandbox: its own uid when run as root) and none survive."""
    marker = f"sbx-fork-{os.getpid()}"
    script = f"""
import os, time
n = 0
while n < 500:
    try:
        if os.fork() == 0:
            time.sleep(300)   # {marker}
            os._exit(0)
    except OSError:
        break
    n += 1
print(n)
"""
    res = run_python(script, nproc=16, timeout_s=20)
    assert res.status == "ok", res
    assert int(res.stdout) < 20
    assert running_sandboxes(wait_s=10) == []


@needs_bwrap
def test_filesystem_is_isolated(tmp_path):
    """/work (the repo) is absent, system dirs are read-only, /tmp is private, only the scratch dir is writable."""
    host_tmp = Path("/tmp") / f"sbx-leak-{os.getpid()}"
    script = f"""
import os
found = {{p: os.path.exists(p) for p in ["{ROOT}/rewards", "{ROOT}/data/triton_tasks", "{tmp_path}", "/root/.ssh"]}}
writes = {{}}
for p in ["/usr/pwned", "/pwned", "{ROOT}/pwned", "/root/pwned", "{host_tmp}", "scratch_ok"]:
    try:
        open(p, "w").write("x")
        writes[p] = True
    except OSError:
        writes[p] = False
print(repr((found, writes, sorted(os.listdir("{ROOT}")), os.getuid())))
"""
    res = run_python(script)
    assert res.status == "ok", res
    found, writes, repo_listing, uid = eval(res.stdout)
    assert not any(found.values()), found
    assert repo_listing == [".venv"]                       # only the interpreter's parents are made
    assert writes == {"/usr/pwned": False, "/pwned": False, f"{ROOT}/pwned": False, "/root/pwned": False,
                      str(host_tmp): True, "scratch_ok": True}, writes
    assert not host_tmp.exists() and not (ROOT / "pwned").exists()
    assert uid != 0 if os.geteuid() == 0 else uid == os.getuid()


@needs_bwrap
def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    script = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("connected")
except OSError as e:
    print("refused", type(e).__name__)
"""
    res = run_python(script)
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()
    assert res.status == "ok" and res.stdout.startswith("refused"), res


@pytest.mark.parametrize("use_bwrap", [pytest.param(True, marks=needs_bwrap), False])
def test_environment_is_scrubbed(monkeypatch, use_bwrap):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    res = run_python("import os; print(sorted(os.environ))", env={"EXTRA": "1"}, use_bwrap=use_bwrap)
    names = eval(res.stdout)
    assert "SECRET_TOKEN" not in names and "EXTRA" in names and "PATH" in names


def test_fallback_says_what_is_not_enforced():
    res = run_python("print(1)", use_bwrap=False)
    assert res.status == "ok"
    missing = " ".join(res.not_enforced)
    for what in ("network", "filesystem", "private /tmp", "bwrap disabled"):
        assert what in missing, missing
    assert "rlimit cpu" in res.enforced


@needs_bwrap
def test_bwrap_enforced_list():
    res = run_python("print(1)")
    assert any("no network" in e for e in res.enforced) and "rlimit nproc" in res.enforced
    assert not any("network" in n for n in res.not_enforced)


def test_nonsense_script_is_a_result_and_bad_file_names_a_caller_error():
    res = run_python("\x00 this is not python")
    assert res.status == "exit_nonzero" and "null bytes" in res.stderr, res
    with pytest.raises(ValueError):
        run_python("print(1)", files={"../escape.txt": "x"})


def test_read_back_takes_only_regular_files():
    """Without bwrap the script can replace a read_back file by a link or a FIFO: neither is read."""
    script = ("import os\nfor n in ('link', 'fifo', 'dir'):\n    os.remove(n)\nos.symlink('/etc/passwd', 'link')\n"
              "os.mkfifo('fifo')\nos.mkdir('dir')\nopen('ok', 'w').write('1')")
    res = run_python(script, read_back=("link", "fifo", "dir", "ok"), use_bwrap=False)
    assert res.status == "ok" and res.files == {"ok": b"1"}, res


@needs_bwrap
def test_files_are_read_only_and_read_back_files_stay_put():
    """Under bwrap the script's files are read-only binds and each read_back name is a bind it can write but
    not replace; everything else it writes stays in its tmpfs."""
    script = """
import os
for what, act in [("write input", lambda: open("in.txt", "w").write("x")),
                  ("remove input", lambda: os.remove("in.txt")),
                  ("replace result", lambda: os.replace("other", "out.txt")),
                  ("link result", lambda: (os.remove("out.txt"), os.symlink("/etc/passwd", "out.txt")))]:
    open("other", "w").write("y")
    try:
        act()
        print(what, "done")
    except OSError as e:
        print(what, "refused")
open("out.txt", "w").write(open("in.txt").read() * 2)
"""
    res = run_python(script, files={"in.txt": "ab"}, read_back=("out.txt",))
    assert res.status == "ok", res
    assert res.stdout.split("\n")[:4] == ["write input refused", "remove input refused", "replace result refused",
                                          "link result refused"], res.stdout
    assert res.files == {"out.txt": b"abab"}


# ---- issue 16: isolation that can't be escaped, limits per sandbox, cleanup that can't break ----
def test_no_bwrap_refuses_unless_opted_out(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap not installed (apt-get install bubblewrap)")
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    assert "bwrap not installed" in refusal()
    with pytest.raises(SandboxUnavailable, match="bubblewrap.*sandbox_opt_out"):
        require_isolation(opt_out=False)
    assert OPT_OUT_ENV not in os.environ
    require_isolation(opt_out=True)
    assert os.environ[OPT_OUT_ENV] == "1" and refusal() is None


@needs_bwrap
def test_require_isolation_passes_with_bwrap(monkeypatch):
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    assert require_isolation(opt_out=False) is None and refusal() is None and OPT_OUT_ENV not in os.environ


@pytest.mark.parametrize("use_bwrap", BOTH)
def test_daemon_grandchild_does_not_outlive_the_call(use_bwrap):
    """A double-forked, setsid'ed grandchild that sleeps (CPU limits never stop it) is gone when run_python
    returns: the pid namespace, the sandbox's cgroup or its uid are killed as a whole."""
    if not use_bwrap and _cgroup_parent() is None and os.geteuid() != 0:
        pytest.skip("without bwrap only a cgroup or a fresh uid can find a daemon")
    marker = f"sbx-daemon-{os.getpid()}-{use_bwrap}"
    script = SLEEPER_DEF + f"""
import os, subprocess
if os.fork() == 0:
    os.setsid()
    subprocess.Popen(SLEEPER + ['{marker}'])
    os._exit(0)
os.wait()
"""
    res = run_python(script, timeout_s=10, use_bwrap=use_bwrap)
    assert res.status == "ok", res
    assert _processes_with(marker, wait_s=0.5) == []


@needs_cgroup
@pytest.mark.parametrize("use_bwrap", BOTH)
def test_memory_limit_holds_for_the_whole_sandbox(use_bwrap):
    """4 processes of 200 MiB each under a 512 MiB sandbox: each is under the per-process address-space limit,
    together they are not."""
    script = """
import os, time
pids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        b = bytearray(200 << 20)
        for i in range(0, len(b), 4096):
            b[i] = 1
        time.sleep(2)
        os._exit(0)
    pids.append(pid)
print([os.waitpid(p, 0)[1] for p in pids])
"""
    res = run_python(script, mem_mb=512, timeout_s=30, use_bwrap=use_bwrap)
    assert res.status == "oom", res
    assert "memory cgroup for the whole sandbox, all its processes killed after the run" in res.enforced


@needs_bwrap
def test_scratch_disk_is_capped():
    script = """
for i in range(4):
    try:
        open(f"f{i}", "wb").write(b"x" * (40 << 20))
    except OSError as e:
        print(i, e.strerror)
        break
"""
    res = run_python(script, disk_mb=100, fsize_mb=64)
    assert res.status == "ok" and res.stdout.strip() == "2 No space left on device", res


@pytest.mark.parametrize("use_bwrap", BOTH)
def test_deep_directory_tree_is_no_problem(use_bwrap):
    script = """
import os
top = os.getcwd()
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
os.chmod(".", 0)
print(top)
"""
    res = run_python(script, use_bwrap=use_bwrap)
    assert res.status == "ok", res
    assert not os.path.exists(res.stdout.strip()) if not use_bwrap else res.stdout.strip() == "/scratch"


def test_remove_tree_handles_depth_locked_dirs_and_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for i in range(3000):       # deeper than PATH_MAX and the recursion limit
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.symlink(outside, "link", dir_fd=fd)
    os.mkdir("locked", dir_fd=fd)
    os.chmod("locked", 0, dir_fd=fd)
    os.close(fd)
    remove_tree(str(top))
    assert not top.exists() and (outside / "keep").read_text() == "x"


def test_private_tmp_is_mounted_before_the_binds():
    """Binds go on top of the sandbox's tmpfs /tmp, so an interpreter or venv that lives under /tmp
    (e.g. a CI checkout there) stays visible inside; a later tmpfs would hide it."""
    from rewards.sandbox import _bwrap_argv
    if shutil.which("bwrap") is None:
        pytest.skip("no bwrap")
    argv = _bwrap_argv("/tmp/some-scratch", ("in.txt",), ("out.bin",), gpu=False, tmp_mb=64, disk_mb=128)
    tmpfs = [i for i, a in enumerate(argv) if a == "--tmpfs"]
    binds = [i for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--dev-bind")]
    assert [argv[i + 1] for i in tmpfs] == ["/tmp", "/scratch"] and binds and min(binds) > max(tmpfs)
    assert argv[argv.index("/tmp/some-scratch/out.bin") - 1:][:3] == ["--bind", "/tmp/some-scratch/out.bin",
                                                                    "/scratch/out.bin"]


@needs_cgroup
def test_stale_sandbox_cgroups_are_removed():
    """A reward worker killed mid-run leaves an empty cgroup named after its pid: the next probe removes it."""
    parent = _cgroup_parent()[1]
    stale = os.path.join(parent, "rl-sandbox-999999999-0123456789ab")    # no such pid (above pid_max)
    os.mkdir(stale)
    _cgroup_parent.cache_clear()
    assert _cgroup_parent()[1] == parent and not os.path.exists(stale)
