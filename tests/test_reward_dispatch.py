"""The trainer's reward dispatch (rewards/pool.py score_row) by the row's task field, through the pool."""
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
