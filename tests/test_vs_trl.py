"""benchmarks/vs_trl.py's pieces that run without TRL's venv: TRL's reward function (the last boxed answer against
the row's, as the math task scores) and the make target's commands."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vs_trl  # noqa: E402


def test_boxed_reward_reads_the_last_boxed_answer():
    texts = ["3+4=7. \\boxed{7}", "\\boxed{6} no, \\boxed{7}", "\\boxed{7} no, \\boxed{6}", "7", "\\boxed{ 7 }",
             "\\boxed{7"]
    assert vs_trl.boxed_reward(texts, ["7"] * len(texts)) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_make_target_runs_the_documented_jobs():
    out = subprocess.run(["make", "-n", "bench-vs-trl"], cwd=ROOT, capture_output=True, text=True).stdout
    for job in ("--shape demo", "--shape demo --copris", "--shape 0.5b --response_len 32",
                "--shape 0.5b --response_len 256"):
        assert f"benchmarks/vs_trl.py {job}" in out, out
    assert "trl==" in (ROOT / "Makefile").read_text() and "trl" not in (ROOT / "requirements.txt").read_text() \
        and "trl" not in (ROOT / "requirements-cpu.txt").read_text()
