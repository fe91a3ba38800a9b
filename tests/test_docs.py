"""The docs stay honest: every command in a code block of README.md and docs/*.md that runs python, make or
torchrun names a script, module, make target, config file and config keys that exist, and every docs/ page is
linked from the README. A renamed key, script or target fails here."""
import dataclasses
import re
import shlex
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LAUNCHER = {"nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "standalone", "config", "plot",
            "help"}


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
    import trainer

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from walk(hints[f.name], f"{prefix}{f.name}.")
            else:
                yield prefix + f.name
    return set(walk(trainer.Config, ""))


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
