"""rewards/sandbox.py: limits, isolation and the rlimits-only fallback, with plain-Python scripts (no torch).

The bwrap tests are skipped where bubblewrap is missing or unusable; the fallback tests always run.
"""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from rewards.sandbox import bwrap_problem, run_python, running_sandboxes

ROOT = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"{bwrap_problem()}")


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
    script = (f"import subprocess, time\nsubprocess.Popen(['sleep', '300', '{marker}'])\n"
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
    script = f"import subprocess\nsubprocess.Popen(['sleep', '300', '{marker}'], start_new_session=True)\n"
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


@pytest.mark.parametrize("use_bwrap", [pytest.param(True, marks=needs_bwrap), False])
def test_read_back_takes_only_regular_files(use_bwrap):
    script = ("import os\nos.symlink('/etc/passwd', 'link')\nos.mkfifo('fifo')\nos.mkdir('dir')\n"
              "open('ok', 'w').write('1')")
    res = run_python(script, read_back=("link", "fifo", "dir", "ok"), use_bwrap=use_bwrap)
    assert res.status == "ok" and res.files == {"ok": b"1"}, res


def test_private_tmp_is_mounted_before_the_binds():
    """Binds go on top of the sandbox's tmpfs /tmp, so an interpreter or venv that lives under /tmp
    (e.g. a CI checkout there) stays visible inside; a later tmpfs would hide it."""
    from rewards.sandbox import _bwrap_argv
    if shutil.which("bwrap") is None:
        pytest.skip("no bwrap")
    argv = _bwrap_argv("/tmp/some-scratch", gpu=False, tmp_mb=64)
    tmpfs = argv.index("--tmpfs")
    binds = [i for i, a in enumerate(argv) if a in ("--ro-bind", "--bind", "--dev-bind")]
    assert argv[tmpfs + 1] == "/tmp" and binds and min(binds) > tmpfs
