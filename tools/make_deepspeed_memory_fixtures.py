#!/usr/bin/env python3
"""Measure the per-rank CPU tensor-byte peak of one DeepSpeed ZeRO training step of an HF model.

Writes tests/fixtures/deepspeed_memory/fixtures.json, the reference that
src/fit/framework_deepspeed.cpp (`memfit plan --framework deepspeed`) is checked against.

The run: DeepSpeed 0.19.8 on its CPU accelerator (DS_ACCELERATOR=cpu, torch.distributed over
gloo and DeepSpeed's shared-memory collectives), world size 1 or 2 through torchrun, a randomly
initialised HF GPT-2 or Llama (nothing downloaded), deepspeed.initialize with the config below
(AdamW through "torch_adam": FusedAdam needs a CUDA build; zero_optimization.stage 0-3; bf16 or
fp32), then engine(input_ids, labels=ids) -> engine.backward(loss) -> engine.step(). Step 1 runs
(it creates the optimizer state and ZeRO's lazily allocated buffers); step 2 is the steady state.

Method: as tools/make_pytorch_memory_fixtures.py, torch.profiler with profile_memory=True, but
from before the model is built, so nothing is live that the profiler did not see allocated:
live bytes are the running sum of every CPU allocation and free, and the step's peak is their
largest value during step 2, recorded whole (one recording; the phases are record_function
ranges). Collectives in DeepSpeed's shared memory and gloo's own buffers are no torch tensors
and not counted (on a GPU NCCL's are not either). The profiler records the main thread only: a
tensor gloo's worker thread frees or allocates (stage 3's all-gathers) is seen on one side only.
The fixture bounds that error per rank: `over_bytes`, allocations whose free was not seen
(their address was handed out again), by which the count may be too high, and `under_bytes`,
frees of allocations never seen, by which it may be too low (both counted over the whole run,
so an upper bound on the error at the peak). Each rank
reports its own peak; the fixture keeps every rank's, and the live allocations at the peak and
before the step grouped by the op that allocated them (for the derivation, not for the test).
Python's cyclic garbage (DeepSpeed leaves some: flat gradient buffers in reference cycles) is
collected at the start of each recorded step, inside the recording, so that what a rank holds
does not depend on when the collector last ran.

Usage: /work/venv/bin/python tools/make_deepspeed_memory_fixtures.py [--only N] [--out PATH]
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

GPT2_S = dict(arch="gpt2", n_layer=2, n_embd=128, n_head=4, vocab_size=2000, n_positions=1024)
GPT2_M = dict(arch="gpt2", n_layer=3, n_embd=192, n_head=6, vocab_size=5000, n_positions=1024)
LLAMA_S = dict(arch="llama", num_hidden_layers=2, hidden_size=128, intermediate_size=352, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=2000, max_position_embeddings=1024)

# zero_optimization keys that make the buckets smaller than these models (DeepSpeed's defaults,
# 5e8 elements, would be most of every peak and hide the rest).
SB = {"reduce_bucket_size": 100000, "allgather_bucket_size": 100000}
S3 = {"reduce_bucket_size": 100000, "stage3_prefetch_bucket_size": 50000, "stage3_param_persistence_threshold": 1000,
      "stage3_max_live_parameters": 1000000}

# (model, world, stage, precision, batch, seq, extra zero_optimization keys)
CONFIGS = [
    (GPT2_S, 1, 0, "fp32", 2, 128, {}),
    (GPT2_S, 1, 0, "bf16", 2, 128, {}),
    (GPT2_S, 2, 0, "bf16", 2, 128, {}),
    (GPT2_S, 1, 1, "fp32", 2, 128, {}),
    (GPT2_S, 2, 2, "bf16", 2, 128, {}),
    (GPT2_S, 2, 3, "bf16", 2, 128, {}),
    (GPT2_S, 1, 1, "bf16", 2, 128, SB),
    (GPT2_S, 2, 1, "bf16", 2, 128, SB),
    (GPT2_S, 2, 2, "bf16", 2, 128, SB),
    (GPT2_S, 2, 2, "fp32", 2, 128, SB),
    (GPT2_S, 2, 2, "fp16", 2, 128, SB),
    (GPT2_S, 1, 3, "bf16", 2, 128, S3),
    (GPT2_S, 2, 3, "bf16", 2, 128, S3),
    (GPT2_S, 2, 3, "fp32", 2, 128, S3),
    (GPT2_M, 2, 2, "bf16", 4, 256, {"reduce_bucket_size": 200000, "overlap_comm": True}),
    (GPT2_M, 2, 3, "bf16", 4, 256, dict(S3, stage3_param_persistence_threshold=10000)),
    (LLAMA_S, 2, 2, "bf16", 2, 256, SB),
    (LLAMA_S, 2, 3, "bf16", 2, 256, S3),
    (GPT2_M, 2, 1, "fp32", 2, 256, SB),
    (GPT2_S, 2, 3, "bf16", 2, 128, {"reduce_bucket_size": 100000, "stage3_prefetch_bucket_size": 50000}),
]


def worker(spec, outdir):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch._C._profiler as P
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(1)
    model_cfg, world, stage, precision, batch, seq, zero_extra = spec

    live = {}  # ptr -> (bytes, op)
    state = {"total": 0, "peak": 0, "at_peak": None}

    def walk(node, op, phase):
        name = op if node.tag == P._EventType.Allocation else node.name
        if name.startswith("phase:"):
            phase = name[len("phase:"):]
        if node.tag == P._EventType.Allocation:
            yield node, op, phase
        for c in node.children:
            yield from walk(c, name, phase)

    def record(fn, track_peak):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
        allocs = []
        for root in prof.profiler.kineto_results.experimental_event_tree():
            for n, op, phase in walk(root, "python", None):
                if n.extra_fields.device.type == "cpu":
                    allocs.append((n.start_time_ns, n.extra_fields.ptr, n.extra_fields.alloc_size, op, phase))
        allocs.sort(key=lambda a: a[0])
        for _, ptr, size, op, phase in allocs:
            if size > 0:
                if ptr in live:  # its free was not seen: counted live since, too high by it
                    state["over"] = state.get("over", 0) + live[ptr][0]
                live[ptr] = (size, op)
            elif live.pop(ptr, None) is None:  # its allocation was not seen: too low by it
                state["under"] = state.get("under", 0) - size
            state["total"] += size
            if track_peak and state["total"] > state["peak"]:
                state["peak"] = state["total"]
                state["at_peak"] = dict(live)
                state["phase"] = phase
        return out

    def group(allocs):
        groups = {}
        for size, op in allocs.values():
            groups.setdefault(op, []).append(size)
        return {op: [sum(s), len(s), sorted(s, reverse=True)[:8]] for op, s in groups.items()}

    import transformers
    import deepspeed
    kw = {k: v for k, v in model_cfg.items() if k != "arch"}

    def build():
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(**kw) if model_cfg["arch"] == "gpt2" else transformers.LlamaConfig(**kw)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        model.train()
        ds = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
              "zero_optimization": dict({"stage": stage}, **zero_extra)}
        if precision != "fp32":
            ds[precision] = {"enabled": True}
        eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
        return eng, cfg.vocab_size

    eng, vocab = record(build, None)

    def step():
        # One recording for the whole step, so that nothing is freed between recordings; the
        # phases are marked by record_function ranges. The token ids (also the labels) are made
        # inside, as a data loader would hand them over.
        gc.collect()
        with torch.profiler.record_function("phase:forward"):
            ids = torch.randint(0, vocab, (batch, seq))
            loss = eng(input_ids=ids, labels=ids).loss
            del ids
        with torch.profiler.record_function("phase:backward"):
            eng.backward(loss)
            del loss
        with torch.profiler.record_function("phase:optimizer"):
            eng.step()

    record(step, False)
    before = state["total"]
    persistent = group(live)
    state["peak"] = before
    record(step, True)
    rank = int(os.environ.get("RANK", "0"))
    res = {"rank": rank, "optimizer": type(eng.optimizer).__name__, "persistent_bytes": before,
           "peak_bytes": state["peak"], "over_bytes": state.get("over", 0), "under_bytes": state.get("under", 0), "phase": state.get("phase", "none"),
           "live_at_peak": group(state["at_peak"] or {}), "live_before": persistent}
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)


def run_config(i, spec):
    model_cfg, world, stage, precision, batch, seq, zero_extra = spec
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port",
               str(29500 + i), __file__, "--worker", str(i), "--dir", d]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
            raise SystemExit(f"config {i} failed")
        ranks = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(world)]
    return {"model": model_cfg, "world": world, "stage": stage, "precision": precision, "batch": batch, "seq": seq,
            "zero_optimization": zero_extra, "optimizer": ranks[0]["optimizer"],
            "peak_bytes": [r["peak_bytes"] for r in ranks], "persistent_bytes": [r["persistent_bytes"] for r in ranks],
            "phase": [r["phase"] for r in ranks],
            "over_bytes": [r["over_bytes"] for r in ranks], "under_bytes": [r["under_bytes"] for r in ranks],
            "live": [{"at_peak": r["live_at_peak"], "before_step": r["live_before"]} for r in ranks]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", type=int)
    ap.add_argument("--dir")
    ap.add_argument("--only", type=int, nargs="*")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                  "deepspeed_memory", "fixtures.json"))
    a = ap.parse_args()
    if a.worker is not None:
        worker(CONFIGS[a.worker], a.dir)
        return
    import deepspeed
    import torch
    import transformers
    out = []
    for i, spec in enumerate(CONFIGS):
        if a.only and i not in a.only:
            continue
        t = time.time()
        r = run_config(i, spec)
        print(i, r["world"], r["stage"], r["precision"], r["optimizer"], r["peak_bytes"], r["persistent_bytes"],
              r["phase"], f"{time.time() - t:.0f}s", flush=True)
        out.append(r)
    with open(a.out, "w") as f:
        json.dump({"deepspeed": deepspeed.__version__, "torch": torch.__version__,
                   "transformers": transformers.__version__, "fixtures": out}, f, indent=1)


if __name__ == "__main__":
    main()
