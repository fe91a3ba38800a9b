"""Config loading: yaml + overrides, type checks, unknown keys, impossible combinations."""
import subprocess
import sys

import pytest

from trainer import Config, ConfigError, load_config
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def base(tiny):
    return [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            "--max_prompt_len=128", "--max_response_len=128"]


def test_defaults_and_overrides(base, tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("lr: 1\nn_samples: 4\ncopris:\n  concurrency: 8\n  enabled: true\n")
    cfg = load_config(["--config", str(y), *base, "--copris.enabled=false", "--dual_clip=3", "--lr=2e-5"])
    assert cfg.lr == 2e-5 and isinstance(cfg.lr, float)
    assert cfg.n_samples == 4 and cfg.copris.concurrency == 8 and cfg.copris.enabled is False
    assert cfg.dual_clip == 3.0
    assert load_config([*base, "--dual_clip=null"]).dual_clip is None
    assert Config().engine.max_num_seqs >= Config().copris.concurrency
    y.write_text("lora:\n  rank: 16\n  target_modules: [q_proj, v_proj]\n")
    assert load_config(["--config", str(y), *base]).lora.target_modules == ["q_proj", "v_proj"]
    cfg = load_config([*base, "--lora.rank=8", "--lora.target_modules=q_proj,k_proj"])
    assert (cfg.lora.rank, cfg.lora.target_modules) == (8, ["q_proj", "k_proj"])
    assert Config().lora.rank == 0 and "down_proj" in Config().lora.target_modules  # off; all projections when on


@pytest.mark.parametrize("args, needle", [
    (["--learning_rate=1"], "unknown config key 'learning_rate' (TRL's / verl's name; here it is 'lr'"),
    (["--lr=0"], "lr and prime.lr must be > 0, got lr=0.0"),
    (["--lr=-1e-5"], "lr and prime.lr must be > 0, got lr=-1e-05"),
    (["--prime.enabled=true", "--prime.lr=0"], "prime.lr=0.0"),
    (["--temperature=0"], "temperature must be > 0, got 0.0"),
    (["--temperature=-1"], "temperature must be > 0"),
    (["--copris.concurency=3"], "unknown config key 'copris.concurency' (did you mean 'copris.concurrency'?)"),
    (["--n_samples=four"], "n_samples: expected int, got 'four'"),
    (["--copris.enabled=maybe"], "copris.enabled: expected true/false"),
    (["--advantage=ppo"], "advantage: must be one of"),
    (["--lr"], "bad argument '--lr'"),
    (["--n_samples=0"], "n_samples must be >= 1"),
    (["--copris.concurrency=512"], "exceeds engine.max_num_seqs"),
    (["--token_budget=100"], "token_budget=100 is below one full row"),
    (["--max_response_len=500"], "max_prompt_len + max_response_len = 628 exceeds the model's max_position_embeddings=512"),
    (["--lr.x=1"], "lr has no sub-keys"),
    (["--lora.rank=1024"], "lora: rank must be in 0..512"),
    (["--lora.dropout=1"], "dropout in [0, 1)"),
    (["--dist_timeout_s=0"], "dist_timeout_s must be > 0"),
])
def test_bad_overrides_name_the_problem(base, args, needle):
    with pytest.raises(ConfigError) as e:
        load_config([*base, *args])
    assert needle in str(e.value)


def test_yaml_type_errors_and_missing_paths(base, tmp_path, tiny):
    y = tmp_path / "c.yaml"
    y.write_text("n_samples: '8'\n")
    with pytest.raises(ConfigError, match="c.yaml: n_samples: expected int, got str"):  # the file is named
        load_config(["--config", str(y), *base])
    y.write_text("copris: 3\n")
    with pytest.raises(ConfigError, match="copris: expected a mapping"):
        load_config(["--config", str(y), *base])
    with pytest.raises(ConfigError, match="model_path 'nowhere': no config.json"):
        load_config([*base, "--model_path=nowhere"])
    with pytest.raises(ConfigError, match="train_data 'missing.jsonl': no such file"):
        load_config([*base, "--train_data=missing.jsonl"])


def test_batch_not_divisible_by_ranks(base, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="batch_groups=5 is not divisible by the 2 ranks"):
        load_config([*base, "--batch_groups=5"])


def test_tensor_parallel_size_must_divide_ranks_and_heads(base, tmp_path):
    from trainer import check_run_dir
    with pytest.raises(ConfigError, match="engine.tensor_parallel_size=3 does not divide the 4 ranks"):
        load_config([*base, "--engine.tensor_parallel_size=3"], world=4)
    with pytest.raises(ConfigError, match="tensor_parallel_size=4 does not divide the model's 2 attention heads"):
        load_config([*base, "--engine.tensor_parallel_size=4", "--batch_groups=4"], world=4)
    cfg = load_config([*base, "--engine.tensor_parallel_size=2", "--batch_groups=4"], world=4)
    assert cfg.engine.tensor_parallel_size == 2
    ckpt = tmp_path / "checkpoints" / "step_000001"  # written with t=1: a t=2 run must not resume from it
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text('{"world": 4, "step": 1, "policy_version": 1}')
    cfg = load_config([*base, "--engine.tensor_parallel_size=2", "--batch_groups=4", f"--resume={ckpt}"], world=4)
    with pytest.raises(ConfigError, match=r"by 4 ranks \(engine.tensor_parallel_size=1\); this run has 4 \(2\)"):
        check_run_dir(cfg, 4)


def test_cli_exits_nonzero_without_traceback(base):
    p = subprocess.run([sys.executable, "trainer.py", *base, "--clip_hgih=0.3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "unknown config key 'clip_hgih' (did you mean 'clip_high'?)" in p.stderr
    assert "Traceback" not in p.stderr


def test_malformed_rows_name_file_and_line(tmp_path):
    from data.rows import load_rows
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:2: missing key 'answer'"):
        load_rows(str(f), "rl")
    f.write_text('{"prompt": "a", "answer": "1"}\n\n{not json}\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:3: not valid JSON \(Expecting property name enclosed in double "
                                          r"quotes at column 2\)"):
        load_rows(str(f), "rl")
    f.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "a cut-off ro\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:2: not valid JSON \(Unterminated string starting at column 12; "
                                          r"the line ends before its object does \(cut off\?\)\)"):
        load_rows(str(f), "rl")
    f.write_text('{"prompt": "a", "task": "poetry"}\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:1: unknown task 'poetry'"):
        load_rows(str(f), "rl")
    f.write_text("")
    with pytest.raises(ConfigError, match="no rows"):
        load_rows(str(f), "rl")


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_preset_parses(preset):
    """Each shipped preset names only real keys with values of the right type (its paths need not exist here)."""
    import config
    cfg = Config()
    for k, v in config.read_yaml(str(ROOT / "configs" / preset)).items():
        config._apply(cfg, str(k), v, from_cli=False)
    assert cfg.copris.concurrency <= cfg.engine.max_num_seqs or not cfg.copris.enabled, preset


def test_the_collective_timeout_reaches_the_process_group(monkeypatch):
    """dist_timeout_s sets how long a rank waits at a collective, on gloo and NCCL alike (NCCL's own default, 10 min,
    would kill a rank waiting for a long Triton scoring or a big export)."""
    import datetime
    import model
    seen = {}
    monkeypatch.setattr(model.dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend, **kw))
    monkeypatch.setattr(model.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(model.dist, "get_world_size", lambda: 1)
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT="29999").items():  # as torchrun sets them (restored after the test)
        monkeypatch.setenv(k, v)
    model.init_distributed(1234.0)
    assert seen["timeout"] == datetime.timedelta(seconds=1234) and seen["backend"] == "gloo"
    monkeypatch.setattr(model.torch.cuda, "is_available", lambda: True)  # NCCL: same timeout, and one rank per GPU
    monkeypatch.setattr(model.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(model.torch.cuda, "set_device", lambda d: None)
    model.init_distributed(99.0)
    assert seen["timeout"] == datetime.timedelta(seconds=99) and seen["backend"] == "nccl"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="2 ranks per node but 1 GPU.*--nproc_per_node=1"):
        model.init_distributed()


def test_the_launcher_refuses_more_ranks_than_gpus(monkeypatch, capsys):
    import launch
    monkeypatch.setattr(launch.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 1)
    ran = []
    assert launch.run(["--nproc_per_node=2", "--config", "x.yaml"], lambda *a: ran.append(a)) == 2
    assert "2 ranks per node but 1 GPU(s) visible" in capsys.readouterr().err and not ran, "refused before preflight"


def test_yaml_numbers_in_exponent_form_are_floats(base, tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-5 as a string; the loader takes YAML 1.2's floats, as the command line does."""
    y = tmp_path / "c.yaml"
    y.write_text("lr: 1e-5\nweight_decay: 1E+1\nprime:\n  lr: -5e-7\n  beta: 5.0e-2\nseed: 3\nrun_dir: 1e3x\n")
    cfg = load_config(["--config", str(y), *base])
    assert (cfg.lr, cfg.weight_decay, cfg.prime.lr, cfg.prime.beta) == (1e-5, 10.0, -5e-7, 0.05)
    assert isinstance(cfg.lr, float) and cfg.seed == 3 and cfg.run_dir == "1e3x"
    y.write_text("seed: 1e3\n")  # a float where an int belongs stays an error, naming the file
    with pytest.raises(ConfigError, match="c.yaml: seed: expected int, got float 1000.0"):
        load_config(["--config", str(y), *base])


def mapping_rows() -> dict[str, list[str]]:
    """docs/from-trl-and-verl.md's tables: every TRL / verl name a user types (backticked in the first two columns:
    `key` or `key: value`; verl's `ar.` written out as actor_rollout_ref.; class names and commands left out) ->
    the backticked names of our column in its first row."""
    import re
    out = {}
    for line in (ROOT / "docs" / "from-trl-and-verl.md").read_text().splitlines():
        cells = line.split("|")[1:4]
        if not line.startswith("| ") or cells[0].strip() == "TRL":
            continue
        for name in re.findall(r"`([^`]+)`", cells[0] + cells[1]):
            name = name.split(":")[0].strip().replace("ar.", "actor_rollout_ref.", 1 if name.startswith("ar.") else 0)
            if " " not in name and name.islower():
                out.setdefault(name, [k.split(":")[0] for k in re.findall(r"`([^`]+)`", cells[2])])
    return out


def test_every_name_of_the_mapping_page_is_answered_with_ours(base):
    """Each TRL / verl name in docs/from-trl-and-verl.md's tables that is not one of our keys stops the run with a
    hint naming a key of our column (a row pairs several names with several keys: temperature, top_p), or where the
    column has none, saying there is no such key here; no hint is a did-you-mean."""
    import config
    from tests.test_docs import config_keys
    rows = mapping_rows()
    assert len(rows) > 80 and "num_iterations" in rows and "actor_rollout_ref.actor.optim.lr" in rows, sorted(rows)
    for name, ours in rows.items():
        if name in config_keys():
            continue
        with pytest.raises(ConfigError) as e:
            load_config([*base, f"--{name}=1"])
        said, keys = str(e.value), [k for k in ours if k in config_keys()]
        assert "TRL's / verl's name" in said and "did you mean" not in said, (name, said)
        assert any(repr(k) in said for k in keys) if keys else "not a key here" in said, (name, ours, said)
    assert all(k in config_keys() for v in config.OTHER_NAMES.values() for k in ((v,) if isinstance(v, str) else v))


def test_help_survives_a_closed_pipe_and_names_plot_and_the_launcher_flags():
    """`python trainer.py --help | head` ends quietly (exit 0, no BrokenPipeError) and the text names --plot and
    the launcher's flags."""
    p = subprocess.Popen([sys.executable, "trainer.py", "--help"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # the reader is gone before the first write
    assert p.wait(timeout=120) == 0 and p.stderr.read() == ""
    out = subprocess.run([sys.executable, "trainer.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    for flag in ("--plot RUN_DIR", "--nproc_per_node=N", "--nnodes=M", "--node_rank=R", "--master_addr=A",
                 "--master_port=P"):
        assert flag in out, flag
