"""build_model and export_hf on a real FSDP2 group: what each rank holds in memory, and what the export writes.
Run: torchrun --nproc_per_node 2 tests/build_worker.py MODEL_DIR OUT_DIR; rank 0 prints RESULT {json}."""
import json
import resource
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

import launch
import model


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main(model_dir: str, out: str) -> None:
    rank, world, device = model.init_distributed()
    model.all_sum([0.0], device)  # the group's first collective allocates its buffers: not part of the build
    start = peak_mb()
    policy = model.build_model(model_dir, device, trainable=True)
    built = peak_mb()
    model.SHARD_BYTES = 4 << 20  # several files
    model.export_hf(policy, AutoTokenizer.from_pretrained(model_dir), Path(out), dtype=torch.bfloat16)
    exported = peak_mb()  # (peaks are monotonic: measured before anything else allocates)
    files = load_file(str(Path(model_dir) / "model.safetensors"))
    mismatched = [n for n, t in model.full_named_tensors(policy) if n in files and not torch.equal(files[n], t)]
    every = model.all_gather_list([{"rank": rank, "build_mb": built - start, "export_mb": exported - built,
                                    "mismatched": mismatched, "params": sorted(files)}])
    if rank == 0:
        print("RESULT " + json.dumps(every))


if __name__ == "__main__":
    main(*sys.argv[1:])
    launch.exit_process(0)
