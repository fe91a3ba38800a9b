"""Shared fixtures: a tiny model folder and demo data, built once per test session (no hub)."""
import fnmatch
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
ROOT = Path(__file__).resolve().parents[1]


def tiny_model(out: Path, **options) -> Path:
    """out/model: a BPE tokenizer trained on out/data/sft.jsonl and a random Qwen2 (head_dim 64) of the tests' size,
    with data/tiny_model.py's options (tools=True: tool-call tokens; tied=True: lm_head tied to the embedding)."""
    from data.tiny_model import build_model_folder
    import json
    rows = [json.loads(line) for line in open(out / "data" / "sft.jsonl")]
    build_model_folder(out / "model", [r["prompt"] + r["completion"] for r in rows], vocab_size=400,
                       hidden=128, layers=2, heads=2, max_len=512, **options)
    return out


def tiny_variant(tiny: Path, out: Path, **options) -> Path:
    """The tiny model's data in out/data with a model built with tiny_model's options."""
    import shutil
    shutil.copytree(tiny / "data", out / "data")
    return tiny_model(out, **options)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A folder with data/{rl_train,sft,eval}.jsonl and model/ (BPE tokenizer + random Qwen2, head_dim 64)."""
    from data.arithmetic import write_demo_data
    out = tmp_path_factory.mktemp("tiny")
    write_demo_data(out / "data", n_train=400, n_sft=400, n_eval=16, seed=0)
    return tiny_model(out)


@pytest.fixture(scope="session")
def world_of_one():
    """An in-process gloo group of one rank (FSDP2 models, the collective helpers), kept for the session."""
    import socket
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


NEEDS_SANDBOX = ("test_sandbox.py", "test_sandbox_*.py", "test_code_reward.py", "test_reward_dispatch.py",
                 "test_triton_*.py")  # files


def pytest_collection_modifyitems(config, items):
    """No silent skips: the sandbox and reward tests (NEEDS_SANDBOX) need real isolation (bubblewrap). Without it a
    session that selected any of them stops here, loudly, unless ALLOW_NO_SANDBOX_TESTS=1 says to run the rest and
    skip those; a session without them (the kernel tests on a GPU machine) runs as it is."""
    from rewards.sandbox import bwrap_problem
    needs = [i for i in items if any(fnmatch.fnmatch(i.path.name, p) for p in NEEDS_SANDBOX)]
    problem = bwrap_problem() if needs else None
    if problem is None:
        return
    if os.environ.get("ALLOW_NO_SANDBOX_TESTS") != "1":
        pytest.exit(f"the reward sandbox's isolation is unavailable ({problem}): run `make install` as root (it "
                    f"installs bubblewrap), or set ALLOW_NO_SANDBOX_TESTS=1 to skip the {len(needs)} tests that need "
                    f"it", returncode=1)
    for item in needs:
        item.add_marker(pytest.mark.skip(reason=f"no sandbox isolation ({problem})"))


@pytest.fixture(scope="session")
def tiny_tools(tiny, tmp_path_factory) -> Path:
    """The tiny model's data with a model whose tokenizer has the tool-call tokens (data/tiny_model.py --tools)."""
    return tiny_variant(tiny, tmp_path_factory.mktemp("tiny_tools"), tools=True)


@pytest.fixture(scope="session")
def tool_tok(tmp_path_factory):
    """A BPE tokenizer with the tool-call tokens and Qwen's chat markers as single tokens."""
    from transformers import PreTrainedTokenizerFast
    from data.tiny_model import train_tokenizer
    t = train_tokenizer(["Ann has 3 apples. 12+7=19. \\boxed{19} user assistant tool response"] * 20, 300, tools=True)
    t.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|endoftext|>")


@pytest.fixture(scope="session")
def tiny_tied(tiny, tmp_path_factory) -> Path:
    """The tiny model's data with a model whose lm_head is tied to its embedding (tie_word_embeddings), as the
    small Qwen2.5 and Llama-3.2 models are."""
    return tiny_variant(tiny, tmp_path_factory.mktemp("tiny_tied"), tied=True)
