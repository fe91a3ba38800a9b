"""The trainer's reward dispatch (rewards/pool.py score_row) by the row's task field, through the pool."""
import pytest

from data.triton_tasks import task_rows
from rewards.pool import RewardPool


def test_rows_are_scored_by_their_task():
    triton_row = next(r for r in task_rows(sft=True) if r["name"] == "relu")
    math_row = {"task": "math", "prompt": "1+1?", "answer": "2"}
    code_row = {"task": "code", "prompt": "print 3", "tests": [{"input": "", "output": "3\n"}]}
    pool = RewardPool(workers=2, timeout_s=120)
    try:
        out = pool.score([(math_row, "\\boxed{2}"), (triton_row, triton_row["completion"]),
                          (triton_row, "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n"
                                       "    def forward(self, x):\n        return torch.relu(x)\n```"),
                          (code_row, "```python\nprint(3)\n```"), ({"task": "poetry"}, "x")])
    finally:
        pool.close()
    scores = [s for s, _ in out]
    assert scores == [1.0, 1.0, 0.0, 1.0, 0.0], out
    assert out[2][1]["reason"].startswith("lint_") and out[4][1]["reason"] == "unknown_task"


@pytest.mark.slow
def test_triton_eval_reads_the_trainers_eval_samples_and_checks_a_solution(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    relu = next(r for r in task_rows(sft=True) if r["name"] == "relu")
    samples = tmp_path / "eval_samples.jsonl"  # the layout evaluate() writes
    samples.write_text(json.dumps({"id": 1, "data_source": "triton", "task": "triton", "name": "relu", "kind": "sample",
                                   "completion": relu["completion"], "score": 1.0, "reason": "ok"}) + "\n" +
                       json.dumps({"id": 2, "data_source": "math", "task": "math", "name": None, "kind": "greedy",
                                   "completion": "\\boxed{2}", "score": 1.0, "reason": "ok"}) + "\n")
    p = subprocess.run([sys.executable, "-m", "rewards.triton.eval", str(samples)], cwd=root, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "skipped 1 rows" in p.stdout and json.loads(p.stdout.splitlines()[-1])["exec"] == 1.0, p.stdout
    solution = next((root / "data" / "triton_tasks" / "solutions").rglob("relu.py"))
    p = subprocess.run([sys.executable, "-m", "rewards.triton.eval", "--check", str(solution)], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "relu: score 1.0 (ok)" in p.stdout, p.stdout + p.stderr[-2000:]
    wrong = tmp_path / "relu.py"  # the same kernel with the wrong threshold: must not pass
    wrong.write_text(solution.read_text().replace("0.0", "0.5"))
    p = subprocess.run([sys.executable, "-m", "rewards.triton.eval", "--check", str(wrong)], cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "relu: score 0.0" in p.stdout, p.stdout + p.stderr[-2000:]


def test_rewards_has_no_import_circle_and_no_file_over_700_lines():
    """Every module of rewards/ (and tasks.py, which dispatches to them) imports the others without a circle:
    the pool's deadline lives in rewards/deadline.py, which imports nothing of the project."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    files = {f"rewards.{p.stem}": p for p in (root / "rewards").glob("*.py")} | {"tasks": root / "tasks.py"}
    imports = {}
    for name, path in files.items():
        text = path.read_text()
        assert len(text.splitlines()) <= 700, (path, len(text.splitlines()))
        tree = ast.parse(text)
        found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imports[name] = found & set(files)

    def circle(start, at, seen):
        return any(d == start or d not in seen and circle(start, d, seen | {d}) for d in imports[at])
    assert not [m for m in imports if circle(m, m, {m})], imports
