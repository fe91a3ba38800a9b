"""Every input surface with hostile cases: the yaml preset, CLI overrides, jsonl and parquet rows of each task,
the model folder and its tokenizer, a checkpoint folder. Each stops with exit code 2, one message naming the file
(and row or line) and the problem, and no traceback."""
import json
import shutil

import pytest

from config import ConfigError
from helpers import rl_args, run, trainer_cmd
from trainer import load_config, preflight

TRITON_REF = "import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    return []\n"


@pytest.fixture
def base(tiny):
    return [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
            "--max_prompt_len=128", "--max_response_len=128"]


@pytest.mark.parametrize("text, needle", [
    ("lr: 1e-5\ncopris:\n  concurrency: [8\n", "c.yaml:4: not valid YAML"),
    ("- lr: 1\n", "c.yaml: expected a mapping of config keys, got list"),
    (b"lr: 1e-5  # \xff\xfe\n", "--config {path}: cannot be read"),
    ("copris:\n  concurency: 8\n", "unknown config key 'copris.concurency' (did you mean 'copris.concurrency'?)"),
    ("mode: train\n", "mode: must be one of ['rl', 'sft', 'eval'], got 'train'"),
    ("correction:\n  mode: tis\n", "correction.mode: must be one of"),
])
def test_bad_yaml(base, tmp_path, text, needle):
    y = tmp_path / "c.yaml"
    y.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as e:
        load_config(["--config", str(y), *base])
    assert needle.format(path=y) in str(e.value)


@pytest.mark.parametrize("args, needle", [
    (["--lr=fast"], "lr: expected float, got 'fast'"),
    (["--prime.update=sometimes"], "prime.update: must be one of ['after', 'before']"),
    (["--top_p=0.9", "--correction.mode=token_truncate"], "top_p < 1 truncates the sampler's distribution"),
    (["--correction.mode=token_mask", "--copris.old_logprob_source=rollout"], "correction.mode needs"),
    (["--mode=sft", "--eval_data=x.jsonl"], "eval_data 'x.jsonl': no such file"),
])
def test_bad_overrides(base, args, needle):
    with pytest.raises(ConfigError) as e:
        load_config([*base, *args])
    assert needle in str(e.value)


ROWS = {  # (file content: str for jsonl, bytes for a raw file) -> message
    "bad_utf8": (b'{"prompt": "a", "answer": "1"}\n{"prompt": "\xc3\x28", "answer": "2"}\n', "d.jsonl:2: not valid UTF-8"),
    "not_object": ('[1, 2]\n', "d.jsonl:1: expected an object, got list"),
    "empty_prompt": ('{"prompt": "", "answer": "1"}\n', "d.jsonl:1: 'prompt' must be a non-empty string"),
    "bad_messages": ('{"prompt": [{"role": "user"}], "answer": "1"}\n', "d.jsonl:1: 'prompt' must be"),
    "answer_type": ('{"prompt": "a", "answer": {"x": 1}}\n', "d.jsonl:1: 'answer' must be a non-empty string or a number"),
    "verl_no_truth": ('{"prompt": "a", "reward_model": {"style": "rule"}}\n', "d.jsonl:1: reward_model must be"),
    "task_type": ('{"prompt": "a", "task": ["math"]}\n', "d.jsonl:1: unknown task ['math']"),
    "code_tests": ('{"prompt": "a", "task": "code", "tests": "assert f(1) == 2"}\n', "d.jsonl:1: 'tests' must be"),
    "code_io_len": ('{"prompt": "a", "task": "code", "tests": {"inputs": ["1"], "outputs": []}}\n', "'tests' must be"),
    "triton_syntax": (json.dumps({"prompt": "a", "task": "triton", "reference_code": "def f(:\n"}) + "\n",
                      "d.jsonl:1: 'reference_code' does not parse (its line 1"),
    "triton_missing": (json.dumps({"prompt": "a", "task": "triton", "reference_code": TRITON_REF}) + "\n",
                       "d.jsonl:1: 'reference_code' does not define ['get_init_inputs']"),
    "chars_empty": ('{"prompt": "a", "task": "char_share", "chars": ""}\n', "d.jsonl:1: 'chars' must be"),
}


@pytest.mark.parametrize("case", list(ROWS))
def test_bad_rows_name_file_row_and_problem(tiny, tmp_path, case):
    content, needle = ROWS[case]
    data = tmp_path / "d.jsonl"
    data.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as e:
        preflight(rl_args(tiny, tmp_path / "run", f"--train_data={data}"), 1)
    assert needle in str(e.value) and str(data) in str(e.value)


def test_bad_parquet_and_sft_rows(tiny, tmp_path):
    (tmp_path / "d.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ConfigError, match="d.parquet: not a readable parquet file"):
        preflight(rl_args(tiny, tmp_path / "run", f"--train_data={tmp_path / 'd.parquet'}"), 1)
    (tmp_path / "s.jsonl").write_text('{"prompt": "a", "completion": 5}\n')
    with pytest.raises(ConfigError, match="s.jsonl:1: 'completion' must be a string"):
        preflight(rl_args(tiny, tmp_path / "run", "--mode=sft", f"--train_data={tmp_path / 's.jsonl'}"), 1)


def test_bad_model_folders(tiny, tmp_path):
    broken = tmp_path / "json"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config.json: not a valid JSON model config"):
        load_config(rl_args(tiny, tmp_path / "run", f"--model_path={broken}"))


@pytest.mark.parametrize("damage, needle", [
    ("no_tokenizer", "its tokenizer does not load"),
    ("bad_weights", "the model does not load"),
])
def test_damaged_model_folder_is_a_config_error_in_the_rank(tiny, tmp_path, damage, needle):
    folder = tmp_path / "model"
    shutil.copytree(tiny / "model", folder)
    if damage == "no_tokenizer":
        for f in folder.glob("tokenizer*"):
            f.unlink()
    else:
        (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    p = run(trainer_cmd(None, *rl_args(tiny, tmp_path / "run", f"--model_path={folder}")))
    assert p.returncode == 2 and needle in p.stderr and str(folder) in p.stderr, p.stderr[-3000:]
    assert "Traceback" not in p.stderr


def test_bad_config_file_under_the_launcher_exits_2_without_traceback(tiny, tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("steps: [\n")
    p = run(trainer_cmd(2, "--config", str(y), *rl_args(tiny, tmp_path / "run")))
    assert p.returncode == 2 and p.stderr.count("config error") == 1 and "not valid YAML" in p.stderr
    assert "Traceback" not in p.stderr


def test_damaged_checkpoint_manifest(tiny, tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step_000003"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text('{"step": 3')  # cut off mid-write by something other than our rename
    with pytest.raises(ConfigError, match="manifest.json: not a readable checkpoint manifest"):
        preflight(rl_args(tiny, tmp_path / "run", "--resume=auto"), 1)


def test_say_once_prints_each_line_once_per_torchrun_agent(tmp_path, monkeypatch, capfd):
    """Ranks of one torchrun agent share its attempt folder: the first rank to say a line prints it, the others
    (same line) do not; another line, or a process outside torchrun, prints."""
    import launch
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    (tmp_path / "attempt_0" / "1").mkdir(parents=True)
    for rank in (0, 1):
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "attempt_0" / str(rank) / "error.json"))
        launch.say_once("config error: x")
    launch.say_once("config error: y")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE")
    launch.say_once("config error: x")
    assert capfd.readouterr().err == "config error: x\nconfig error: y\nconfig error: x\n"


@pytest.mark.slow
def test_config_error_survives_plain_torchrun_on_a_busy_machine(tiny, tmp_path):
    """Under plain torchrun both ranks find the typo; whichever exits first gets the other killed. The line must
    reach the user every time (10 of 10), once, with two CPU-bound processes competing for the cores."""
    import subprocess
    import sys
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for attempt in range(10):
            p = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "trainer.py",
                     *rl_args(tiny, tmp_path / "run"), "--lrr=1"], timeout=300)
            assert p.returncode != 0 and p.stderr.count("config error: unknown config key 'lrr'") == 1, \
                (attempt, p.stderr[-3000:])
    finally:
        for b in busy:
            b.kill()
            b.wait()


@pytest.mark.parametrize("where, needle", [
    ("/proc/x", "run_dir /proc/x: cannot be created (making a folder in /proc fails"),
    ("{tmp}/a_file/run", "run_dir {tmp}/a_file/run: cannot be created: {tmp}/a_file is a file, not a folder"),
])
def test_a_run_dir_that_cannot_be_created_is_refused_before_ranks_start(tiny, tmp_path, where, needle):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError) as e:
        preflight(rl_args(tiny, where.format(tmp=tmp_path)), 1)
    assert needle.format(tmp=tmp_path) in str(e.value)


def test_a_run_dir_under_proc_under_the_launcher_is_one_line_and_exit_2(tiny):
    p = run(trainer_cmd(2, *rl_args(tiny, "/proc/x")))
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "config error: run_dir /proc/x: cannot be created (making a folder in /proc fails: No such file or "
        "directory)"], p.stderr[-3000:]


@pytest.mark.parametrize("mode, key", [("rl", "batch_groups=16"), ("sft", "sft_batch_rows=64")])
def test_a_train_file_smaller_than_one_batch_is_refused(tiny, tmp_path, mode, key):
    rows = [json.loads(line) for line in open(tiny / "data" / ("sft.jsonl" if mode == "sft" else "rl_train.jsonl"))]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    args = rl_args(tiny, tmp_path / "run", f"--train_data={data}", f"--{key}", f"--mode={mode}")
    with pytest.raises(ConfigError, match=rf"train_data {data}: 3 rows, fewer than one step takes \({key}\)"):
        preflight(args, 2)


@pytest.mark.parametrize("template, said", [
    ("{% for m in messages %}{{ m.content }}\n{% if m.role == 'x' %}\n",
     "config error: chat_template_file {t}:2: not a valid jinja template (TemplateSyntaxError: Unexpected end of "
     "template"),
    ("{% for m in messages %}\n{{ m.content | nosuchfilter }}\n{% endfor %}\n",
     "config error: chat_template_file {t}:2: not a valid jinja template (TemplateAssertionError: No filter named"),
    ("{% for m in messages %}\n{{ m.content }}\n{{ raise_exception('no system role') }}\n{% endfor %}\n",
     "config error: {data}:1: the chat template ({t}:3) failed on this prompt (TemplateError: no system role)"),
])
def test_a_bad_chat_template_is_named_with_its_line_before_ranks_start(tiny, tmp_path, template, said):
    """A template that does not compile names its file and line, not a data row; one that fails while rendering a
    row names the row and the template's line; the launcher says so before any rank starts (no train.log)."""
    t = tmp_path / "bad.jinja"
    t.write_text(template)
    p = run(trainer_cmd(2, *rl_args(tiny, tmp_path / "run", f"--chat_template_file={t}", "--chat_template=true")))
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    want = said.format(t=t, data=tiny / "data" / "rl_train.jsonl")
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(want), p.stderr[-2000:]
    assert not (tmp_path / "run" / "train.log").exists()
