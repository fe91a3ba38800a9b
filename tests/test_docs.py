"""The docs stay honest: every command in a code block of README.md and docs/*.md that runs python, make or
torchrun names a script, module, make target, config file and config keys that exist; every backticked name in
the prose that looks like a config key is one; and every docs/ page is linked from the README. A renamed key,
script or target fails here."""
import ast
import dataclasses
import json
import os
import re
import shlex
import subprocess
import typing
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LAUNCHER = {"nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "standalone", "config", "plot",
            "help", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "max_restarts"}  # and torchrun's flags


def commands(text: str) -> list[str]:
    """Lines of fenced code blocks that run python, make or torchrun (continuation lines joined; comments cut)."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if re.match(r"(\.venv/bin/)?(python3?|make|torchrun)\b", line):
                out.append(line)
    return out


def config_keys() -> set[str]:
    """Every key trainer.Config accepts, sections dotted (lora.rank, tools.max_turns, ...)."""
    return set(config_fields())


def config_fields() -> dict:
    """Every key trainer.Config accepts -> its type."""
    import trainer

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name], f"{prefix}{f.name}.")
            else:
                yield prefix + f.name, hints[f.name]
    return dict(walk(trainer.Config, ""))


PRODUCT = ("trainer.py", "config.py", "launch.py", "report.py", "model.py", "tasks.py", "data", "rewards",
           "rollout", "kernels")  # not tests/ or benchmarks/: a stale key in a test or a benchmark's command must not excuse one


def code_names() -> set[str]:
    """Every name the product code uses (identifiers, attributes, arguments, keywords) or writes in a string: metric
    keys, reasons, task names, row fields, vLLM's and the model's argument names. Docs name these too. Attributes
    of a config (`cfg.x`, `cfg.tools.x`) and the values of config.OTHER_NAMES (ours for TRL's and verl's names) are
    left out: those are config keys, and a key renamed in the dataclass alone must not pass for a name the code uses."""
    out = set()
    for part in PRODUCT:
        for path in [ROOT / part] if part.endswith(".py") else sorted((ROOT / part).rglob("*.py")):
            tree = ast.parse(path.read_text())
            ours = {id(v) for a in ast.walk(tree) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Dict) and
                    any(getattr(t, "id", None) == "OTHER_NAMES" for t in a.targets) for v in a.value.values}
            for node in ast.walk(tree):
                if id(node) in ours:
                    continue
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.update(re.findall(r"\w+", node.value))
                elif isinstance(node, ast.Attribute) and re.search(r"\bcfg(\.\w+)?$", ast.unparse(node.value)):
                    continue
                else:
                    out.update(v for f in ("id", "attr", "arg", "name") if isinstance(v := getattr(node, f, None), str))
    return out


NOT_KEYS = {  # backticked names in the docs that look like config keys and are not, each with its reason
    "copris.concurency": "running.md quotes the error a misspelt key gives",
    "base_model_name_or_path": "a field of PEFT's adapter_config.json (lora.md: the export)",
    **dict.fromkeys(("step_vs_plain", "update_vs_plain_fwd_bwd", "padding_frac", "shared_prompt_frac",
                     "old_logprob_share"), "a figure benchmarks/bench_step.py prints (speed.md)"),
    "one_vs_ranks_busy": "a figure benchmarks/bench_load.py prints (speed.md)",
}
FOREIGN = re.compile(r"(?:TRL|verl|slime|vLLM|PEFT)(?:'s)? $")  # `name` right after these is that tool's name


def prose_names(text: str) -> list[tuple[str, str | None]]:
    """(name, value) for each backticked span outside code blocks that looks like a config key: a word with an
    underscore or a dotted `section.key` (also `section.*`), alone or as `name: value` / `--name=value`. Spans
    attributed to another tool ("TRL's `num_generations`") and the cells of a table's TRL / verl columns are
    theirs, not ours."""
    sections = {k.split(".")[0] for k in config_fields() if "." in k}
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out, previous = [], ""
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and not previous.startswith("|"):  # a table's header row
            foreign = [i for i, c in enumerate(cells) if c.strip().startswith(("TRL", "verl"))]
        previous = line
        if line.startswith("|"):
            line = "|".join(c for i, c in enumerate(cells) if i not in foreign)
        for m in re.finditer(r"`([^`]+)`", line):
            k = re.fullmatch(r"(?:--)?([a-z][a-z0-9_]*(?:\.(?:[a-z][a-z0-9_]*|\*))?)(?:(?:: |=)(\S+))?", m.group(1))
            if not k or FOREIGN.search(line[:m.start()]):
                continue
            name = k.group(1)
            if name.split(".")[0] in sections if "." in name else "_" in name:
                out.append((name, k.group(2)))
    return out


def prose_problems(text: str, fields: dict, names: set[str]) -> list[str]:
    """Names in prose_names that are neither a config key (with a valid value, when one is given), a section, a
    name the code uses nor one of NOT_KEYS."""
    from config import ConfigError, _convert
    bad = []
    for name, value in prose_names(text):
        if name.endswith(".*"):
            bad += [] if any(k.startswith(name[:-1]) for k in fields) else [f"section {name}"]
        elif name in fields and value is not None:
            try:
                _convert(value, fields[name], name, from_cli=True)
            except ConfigError as e:
                bad.append(str(e))
        elif name not in fields and name not in NOT_KEYS and (name not in names or "." in name):
            bad.append(f"config key {name}")
    return bad


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-zA-Z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def problems(cmd: str, keys: set[str], targets: set[str]) -> list[str]:
    """What in one command does not exist in the repository."""
    words = shlex.split(cmd.replace("<", "").replace(">", ""))
    bad = []
    if words[0] == "make":
        bad += [f"make target {w!r}" for w in words[1:] if "=" not in w and w not in targets]
        return bad
    for i, w in enumerate(words):
        if w == "-m" and i + 1 < len(words):
            mod = words[i + 1]
            if mod.split(".")[0] in {"data", "rewards", "rollout", "kernels", "benchmarks", "tests"}:
                path = ROOT / (mod.replace(".", "/") + ".py")
                if not path.is_file() and not (ROOT / mod.replace(".", "/") / "__init__.py").is_file():
                    bad.append(f"module {mod}")
        elif re.fullmatch(r"[\w./-]+\.(py|yaml|sh)", w) and not w.startswith(("runs/", "/")):
            if not (ROOT / w).is_file() and "SOLUTION" not in w and "category" not in w:
                bad.append(f"file {w}")
    if any(w.endswith("trainer.py") for w in words):
        for w in words:
            m = re.match(r"--([\w.]+)=", w) or re.fullmatch(r"--([\w.]+)", w)
            if m and m.group(1) not in LAUNCHER and m.group(1) not in keys:
                bad.append(f"config key {m.group(1)}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_commands_name_what_exists(doc):
    keys, targets = config_keys(), make_targets()
    cmds = commands(doc.read_text())
    found = {c: problems(c, keys, targets) for c in cmds}
    assert not {c: b for c, b in found.items() if b}, f"{doc.name}: commands naming what does not exist"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_names_in_prose_are_config_keys(doc):
    bad = prose_problems(doc.read_text(), config_fields(), code_names())
    assert not bad, f"{doc.name}: backticked names that look like config keys and are not: {bad}"


def test_the_prose_check_catches_a_renamed_key_and_a_bad_value():
    fields, names = config_fields(), code_names() - {"eval_every"}
    del fields["eval_every"]  # as if the key had been renamed (its old name then appears nowhere in the code)
    text = ("Evaluate every `eval_every` steps; `copris.concurrenzy` is misspelt, `correction.mode: token_trunc`\n"
            "and `--copris.enabled=maybe` are not values; TRL's `num_generations` and `lora.*` are fine.\n"
            "| TRL | verl | here |\n|---|---|---|\n| `beta` | `kl_loss_coef` | `kl_coef` |\n"
            "| `num_iterations` | `actor.ppo_epochs` | `lora.rank: 8`, `copris.*`, `tools.max_turnz` |\n")
    assert prose_problems(text, fields, names) == [
        "config key eval_every", "config key copris.concurrenzy",
        "correction.mode: must be one of ['none', 'token_truncate', 'token_mask', 'sequence_truncate', "
        "'sequence_mask', 'sequence_geo_mask'], got 'token_trunc'",
        "copris.enabled: expected true/false, got 'maybe'", "config key tools.max_turnz"]


def test_every_docs_page_is_linked_from_the_readme_and_the_readme_is_short():
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in DOCS[1:] if f"docs/{p.name}" not in readme]
    assert not missing, f"docs pages the README does not link: {missing}"
    assert len(readme.splitlines()) <= 160, "the README is the five-minute read; the rest goes in docs/"


def test_the_check_catches_a_renamed_key_script_and_target():
    keys, targets = config_keys(), make_targets()
    assert problems("python trainer.py --config configs/demo.yaml --copris.concurrency=4", keys, targets) == []
    assert problems("python trainer.py --copris.concurency=4", keys, targets) == ["config key copris.concurency"]
    assert problems("python benchmarks/bench_nothing.py", keys, targets) == ["file benchmarks/bench_nothing.py"]
    assert problems("make demo-tool", keys, targets) == ["make target 'demo-tool'"]
    assert problems("python -m data.arithmetics --out x", keys, targets) == ["module data.arithmetics"]
    assert commands("```\nmake test   # the suite\n.venv/bin/python trainer.py \\\n  --lr=1\n```") == \
        ["make test", ".venv/bin/python trainer.py    --lr=1"]


def test_pointers_to_the_docs_name_files_and_sections_that_exist():
    """configs/, the Makefile and the code cite docs as `docs/X.md` or `README.md`, optionally with a "Section": the
    file (from the root or the citing folder) and the section heading exist (README sections that moved to docs/
    left stale pointers)."""
    bad = []
    for path in [ROOT / "Makefile", *ROOT.glob("configs/*.yaml"), *(p for part in PRODUCT + ("benchmarks",)
                 for p in ([ROOT / part] if part.endswith(".py") else (ROOT / part).rglob("*.py")))]:
        for m in re.finditer(r'\b(README|DESIGN|docs/[\w-]+)\b(?:\.md)?(?!\.\w)(?:, "([^"]+)")?', path.read_text()):
            target = next((d / f"{m.group(1)}.md" for d in (path.parent, ROOT) if (d / f"{m.group(1)}.md").is_file()),
                          None)
            heads = re.findall(r"^#+ (.*)", target.read_text(), re.M) if target else []
            if not target or (m.group(2) and not any(h.startswith(m.group(2)) for h in heads)):
                bad.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert not bad, bad


def running_a_job() -> tuple[str, list[str]]:
    """README's "Running a job": (the venv activation it asks for, the commands of its first code block)."""
    section = (ROOT / "README.md").read_text().split("## Running a job", 1)[1].split("\n## ", 1)[0]
    activate = re.search(r"`(source \.venv/bin/activate)`", section.split("```", 1)[0])
    assert activate, "README's Running a job must say, before its first command, how to use the venv"
    return activate.group(1), commands(section)


def fresh_shell(script: str, timeout: int) -> subprocess.CompletedProcess:
    """bash -c script in ROOT with a bare environment, as a new terminal after `make install` has it."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_documented_commands_run_from_a_fresh_shell():
    """In a new shell after the README's venv activation, every program the docs' commands start (python, torchrun,
    make) is found, python and torchrun are the venv's, and `python trainer.py --help` runs."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv: run make install")
    activate, _ = running_a_job()
    programs = sorted({c.split()[0] for doc in DOCS for c in commands(doc.read_text())})
    p = fresh_shell(f"{activate} && for p in {' '.join(programs)}; do command -v $p || echo missing $p; done && "
                    f"python trainer.py --help", 120)
    assert p.returncode == 0, p.stderr[-2000:]
    found = dict(zip(programs, p.stdout.splitlines()))
    assert not [f for f in found.values() if f.startswith("missing")], found
    venv = (ROOT / ".venv" / "bin").resolve()
    for prog in ("python", "torchrun"):
        assert Path(found[prog]).parent.resolve() == venv, (prog, found[prog])
    assert "--copris.concurrency=<int>" in p.stdout


def job_run_dir(cmd: str) -> str:
    """The run_dir a documented trainer command writes: its --run_dir, else its config's."""
    words = shlex.split(cmd)
    over = [w.split("=", 1)[1] for w in words if w.startswith("--run_dir=")]
    config = words[words.index("--config") + 1] if "--config" in words else None
    return over[-1] if over else yaml.safe_load((ROOT / config).read_text())["run_dir"]


def test_first_example_job_uses_a_run_dir_make_demo_does_not():
    """The README's first job runs after `make demo`: its run_dir is none of the demo's (a used one is refused)."""
    _, cmds = running_a_job()
    recipe = re.search(r"^demo:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    demo = {job_run_dir(line.replace("$(PY)", "python")) for line in recipe.splitlines() if "trainer.py" in line}
    assert demo and job_run_dir(cmds[0]) not in demo, (cmds[0], demo)


@pytest.mark.slow  # about a minute: two ranks start their engines
def test_first_example_job_runs_as_written_into_a_fresh_run_dir(tiny, tmp_path):
    """The README's first job, in a new shell after its venv activation, as written; the sizes appended (later
    overrides win) make it one small step on the tests' tiny model instead of the demo's."""
    activate, cmds = running_a_job()
    small = [f"--model_path={tiny / 'model'}", f"--train_data={tiny / 'data' / 'rl_train.jsonl'}",
             f"--eval_data={tiny / 'data' / 'eval.jsonl'}", f"--run_dir={tmp_path / 'run'}", "--steps=1",
             "--n_samples=4", "--batch_groups=4", "--copris.concurrency=6", "--max_prompt_len=64",
             "--max_response_len=32", "--token_budget=1024", "--eval_samples=1"]
    p = fresh_shell(f"{activate} && {cmds[0]} {shlex.join(small)}", 600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert [json.loads(line)["step"] for line in open(tmp_path / "run" / "metrics.jsonl")] == [0, 1]
    assert "held-out accuracy" in p.stdout


def test_data_imports_nothing_above_it():
    """The house's arrows point down: data/ reads the task table (tasks.py) and config.py, never rewards/, rollout/,
    kernels/ or the trainer."""
    import ast
    above = {"rewards", "rollout", "kernels", "trainer", "model", "launch", "report", "benchmarks"}
    for path in sorted((ROOT / "data").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad = [n for n in names if n.split(".")[0] in above]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
