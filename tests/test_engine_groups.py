"""Engine groups (engine.tensor_parallel_size t): the collective helpers on 2 gloo ranks forming one group of 2.
No engine: model.engine_group, shared_map, and the trainer's score_groups (shared scoring inside collect),
training_share (whole groups split over the group's ranks) and its lockstep check."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r'''
import json, sys, types
import launch, model, trainer
from rollout.copris import Group, Trajectory
rank, world, device = model.init_distributed()
eg, solo = model.engine_group(2), model.engine_group(1)
out = {"eg": [eg.index, eg.count, eg.member, eg.size], "solo": [solo.index, solo.count, solo.member, solo.size]}
calls = []
out["mapped"] = model.shared_map(list(range(5)), lambda part: calls.append(part) or [x * 10 for x in part], eg)
out["calls"] = calls


class Pool:  # scores a completion by its length; records what this rank scored
    jobs = []

    def score(self, jobs):
        self.jobs += jobs
        return [(float(len(job[1])), {"reason": "ok"}) for job in jobs]  # job: (row, text, context)


tok = types.SimpleNamespace(decode=lambda toks, skip_special_tokens: "x" * len(toks))
run = trainer.Run(trainer.Config(), rank, world, device, None, tok, eg=eg, pool=Pool(),
                  scheduler=types.SimpleNamespace(buffer=[]))
groups = [Group(p, {"id": p}, [Trajectory(p, i, [1], list(range(3 * p + i)), finish_reason="stop")
                                for i in range(3)]) for p in range(2)]
out["rewards"] = trainer.score_groups(run, groups, eg)[0].tolist()
out["scored"] = [job[1] for job in run.pool.jobs]
out["share"] = [g.prompt_id for g in trainer.training_share(run, groups)]
if rank == 1:  # this rank's engine produced one more token than its group's other rank
    groups[1].samples[2].tokens.append(7)
try:
    trainer.training_share(run, groups)
    out["lockstep"] = "no error"
except RuntimeError as e:
    out["lockstep"] = str(e)
open(f"{sys.argv[1]}/rank{rank}.json", "w").write(json.dumps(out))  # one file per rank: stdout lines interleave
launch.exit_process(0)
'''


def test_engine_group_helpers_on_two_ranks(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(script),
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    out = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    lengths = [3 * p + i for p in range(2) for i in range(3)]
    for r in (0, 1):
        assert out[r]["eg"] == [0, 1, r, 2], f"rank {r}: t=2 on 2 ranks is one group of both"
        assert out[r]["solo"] == [r, 2, 0, 1], f"rank {r}: t=1 makes every rank its own group"
        assert out[r]["mapped"] == [0, 10, 20, 30, 40], f"rank {r}: shared_map results out of order"
        assert out[r]["rewards"] == lengths, f"rank {r}: every rank gets every sample's score, in group order"
        assert out[r]["share"] == [r], f"rank {r} trains whole group {r} of the engine group's 2"
        assert "engine group 0 (ranks 0..1) is out of lockstep" in out[r]["lockstep"], (r, out[r]["lockstep"])
    assert out[0]["calls"] == [[0, 2, 4]] and out[1]["calls"] == [[1, 3]], "each item is computed once, by one rank"
    scored = sorted(out[0]["scored"] + out[1]["scored"], key=len)
    assert scored == ["x" * n for n in sorted(lengths)], "each sample is scored exactly once over the group"
    assert out[0]["scored"] and out[1]["scored"], "both ranks share the scoring"
