#!/usr/bin/env python3
"""Regenerate tests/fixtures/qwen2_tiny_sharded/: the tiny Qwen2 model of
tests/fixtures/qwen2_tiny_torch/, saved by transformers' own save_pretrained as a sharded
checkpoint (model-0000k-of-0000N.safetensors + model.safetensors.index.json), as models are
published on the hub. Its loss is the one recorded in qwen2_tiny_torch/expected.safetensors; the
script checks that the reloaded shards give that loss before writing the README.

Run from the repository root with the tools venv (never needed to build or test):
  /work/venv/bin/python tools/make_sharded_fixture.py
"""

import json
import shutil
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests/fixtures/qwen2_tiny_torch"
OUT = ROOT / "tests/fixtures/qwen2_tiny_sharded"
SHARD = "40KB"  # the 115 KB model in 3 shards


def loss_of(model, batch):
    logits = model(input_ids=batch["tokens"].long()).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].long().reshape(-1))


def main():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(SOURCE, dtype=torch.float32, attn_implementation="eager")
    if OUT.exists():
        shutil.rmtree(OUT)
    model.save_pretrained(OUT, max_shard_size=SHARD, safe_serialization=True)
    (OUT / "generation_config.json").unlink(missing_ok=True)
    index = json.loads((OUT / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1, shards

    batch = load_file(SOURCE / "batch.safetensors")
    expected = load_file(SOURCE / "expected.safetensors")["loss"].item()
    reloaded = AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        got = loss_of(reloaded, batch).item()
    assert abs(got - expected) < 1e-6, (got, expected)

    (OUT / "README.md").write_text(
        "# qwen2_tiny_sharded\n\n"
        f"The model of `qwen2_tiny_torch/` saved by transformers {transformers.__version__} "
        f"(torch {torch.__version__}) with `save_pretrained(max_shard_size=\"{SHARD}\")`: "
        f"{len(shards)} shards and `model.safetensors.index.json`, as hub checkpoints are published. "
        f"Reloaded by transformers its loss on `qwen2_tiny_torch/batch.safetensors` is {got:.8f} "
        f"(recorded: {expected:.8f}).\n"
        "Regenerate from the repository root: `/work/venv/bin/python tools/make_sharded_fixture.py`.\n")
    print(f"wrote {OUT}: {shards}, loss {got:.8f} (recorded {expected:.8f})")


if __name__ == "__main__":
    main()
