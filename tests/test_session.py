"""session.py: a plain one-process `python trainer.py` runs in a session of its own (as torchrun starts every rank), so
that Linux's autogroup scheduler gives it a session's CPU share, not a thread's share of its shell's session
(docs/speed.md); the parent passes signals on and ends as the child did."""
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import ENV, ROOT, alive, descendants, metrics, rl_args, trainer_cmd
from launch import complete_checkpoints
from session import FLAG, autogroup_on, wanted

# A stand-in for trainer.py's top: own_session first, then report the session and wait to be stopped.
PROBE = (f"import os, signal, sys, time; sys.path.insert(0, {str(ROOT)!r}); import session; "
         "session.own_session(sys.argv[1:]); signal.signal(signal.SIGINT, lambda *a: sys.exit(5)); "
         "print(os.getpid(), os.getsid(0), os.environ.get('RL_OWN_SESSION'), flush=True); "
         "[time.sleep(0.05) for _ in range(int(sys.argv[1]) * 20)]; sys.exit(7)")
needs_autogroup = pytest.mark.skipif(not autogroup_on(), reason="the kernel does not schedule by session here")


@pytest.mark.parametrize("argv, env, leads, autogroup, expected", [
    (["--config", "c.yaml"], {}, False, True, True),  # python trainer.py --config ...: a thread of its shell's session
    (["--config", "c.yaml"], {}, True, True, False),  # started with setsid: leads its session already
    (["--config", "c.yaml"], {}, False, False, False),  # no autogroup: sessions do not matter to the scheduler
    (["--config", "c.yaml"], {"RANK": "0"}, False, True, False),  # a torchrun rank (torchrun gave it a session)
    (["--nproc_per_node=2", "--config", "c.yaml"], {}, False, True, False),  # the launcher: its ranks have theirs
    (["--nproc_per_node", "1"], {}, False, True, False),
    (["--config", "c.yaml"], {FLAG: "1"}, False, True, False),  # the re-run child
    (["--config", "c.yaml"], {FLAG: "0"}, False, True, False),  # switched off by the user
])
def test_wanted_only_for_a_plain_run_sharing_its_session(argv, env, leads, autogroup, expected):
    assert wanted(argv, env, leads, autogroup) is expected


def test_autogroup_read_from_the_kernel_setting(tmp_path):
    (tmp_path / "on").write_text("1\n")
    (tmp_path / "off").write_text("0\n")
    assert autogroup_on(str(tmp_path / "on")) and not autogroup_on(str(tmp_path / "off"))
    assert not autogroup_on(str(tmp_path / "missing"))


def probe(seconds: int, **kw) -> subprocess.Popen:
    """PROBE started as a shell starts a job: a process group of its own inside the caller's session."""
    return subprocess.Popen([sys.executable, "-c", PROBE, str(seconds)],
                            env={k: v for k, v in ENV.items() if k != FLAG}, stdout=subprocess.PIPE, text=True,
                            **({"process_group": 0} | kw))


@needs_autogroup
def test_child_leads_a_new_session_and_its_exit_code_comes_back():
    p = probe(0)
    out, _ = p.communicate(timeout=60)
    pid, sid, flag = out.split()
    assert pid == sid and int(sid) != os.getsid(0) and flag == "1", out  # the child leads a session of its own
    assert p.returncode == 7


@needs_autogroup
def test_ctrl_c_reaches_the_child_and_a_killed_parent_takes_it_along():
    p = probe(60)
    child = int(p.stdout.readline().split()[0])
    assert child != p.pid and os.getsid(child) == child
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the terminal's foreground process group, which the child has left
    assert p.wait(timeout=60) == 5  # the child's handler ran and its exit code came back
    p = probe(60)
    child = int(p.stdout.readline().split()[0])
    p.kill()
    p.wait(timeout=60)
    assert not alive([child], wait_s=10), "the child outlived its SIGKILLed parent"


def test_started_with_setsid_runs_in_place():
    p = probe(0, start_new_session=True, process_group=None)
    out, _ = p.communicate(timeout=60)
    pid, sid, flag = out.split()
    assert int(pid) == p.pid == int(sid) and flag == "None", out


@pytest.mark.slow
@needs_autogroup
def test_plain_trainer_runs_in_its_own_session_and_stops_on_ctrl_c(tiny, tmp_path):
    """python trainer.py (one process, started as a shell starts a job): the training runs in a child that leads a
    session of its own; Ctrl-C reaches it (checkpoint, exit 0) and nothing is left running."""
    proc = subprocess.Popen(trainer_cmd(None, *rl_args(tiny, tmp_path, "--steps=50", "--save_every=0")), cwd=ROOT,
                            env={k: v for k, v in ENV.items() if k != FLAG}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, process_group=0)
    deadline = time.time() + 600
    while not (tmp_path / "metrics.jsonl").exists() or len((tmp_path / "metrics.jsonl").read_text().splitlines()) < 2:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:] if proc.poll() else "slow"
        time.sleep(0.2)
    tree = descendants(proc.pid)
    (trainer,) = [p for p in tree if open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(proc.pid)]
    assert os.getsid(trainer) == trainer != os.getsid(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "stopped by signal after step" in out and "Traceback" not in err, err[-3000:]
    (ckpt,) = complete_checkpoints(tmp_path / "checkpoints")
    assert metrics(tmp_path)
    assert not alive(tree, wait_s=10), f"processes left running after the run ended: {alive(tree)}"
