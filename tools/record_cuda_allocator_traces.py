#!/usr/bin/env python3
"""Record the CUDA caching allocator's traces of HF transformers + PyTorch training steps.

Writes tests/fixtures/cuda_allocator/traces.json, against which memfit's model of PyTorch's
caching allocator (src/fit/caching_allocator.cpp) is tested: replaying each trace's requests
through the model must give torch.cuda.max_memory_reserved() within 2%.

Each configuration runs in its own process (a fresh allocator, nothing cached from another
configuration): the memory history is switched on before the model is built, then the model
goes to the GPU, and two training steps run (forward with labels, backward, AdamW foreach
step, zero_grad(set_to_none=True)). From torch.cuda.memory._snapshot()'s device trace the
fixture keeps, in order, every 'alloc' (its size) and 'free_completed' (as the index of the
alloc it frees), with the allocator's own max_memory_allocated and max_memory_reserved, and
where the allocator called cudaMalloc / cudaFree (segment_events, for diagnosis only: the model
is given the requests alone).
Encoding: one list of integers per configuration; n > 0 allocates n bytes (the k-th positive
entry is block k, from 0), n <= 0 frees block -n.

Needs a CUDA GPU (it ran on one H200 through the device tool); nothing here runs in tests.
Usage: python3 tools/record_cuda_allocator_traces.py --out traces.json
"""
import argparse
import json
import subprocess
import sys

GPT2_4L = dict(arch="gpt2", n_layer=4, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
GPT2_12L = dict(arch="gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
GPT2_TINY = dict(arch="gpt2", n_layer=2, n_embd=128, n_head=4, vocab_size=2000, n_positions=1024)
LLAMA_4L = dict(arch="llama", num_hidden_layers=4, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
                num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
LLAMA_WIDE = dict(arch="llama", num_hidden_layers=2, hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                  num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
LLAMA_TINY = dict(arch="llama", num_hidden_layers=2, hidden_size=128, intermediate_size=352, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=2000, max_position_embeddings=1024)

# (model, batch, seq, attention, checkpointing, autocast bf16)
CONFIGS = [
    (GPT2_TINY, 1, 64, "sdpa", False, False),
    (GPT2_TINY, 8, 1024, "eager", False, False),
    (GPT2_4L, 4, 512, "sdpa", False, False),
    (GPT2_4L, 4, 512, "eager", False, True),
    (GPT2_4L, 8, 1024, "sdpa", True, True),
    (GPT2_12L, 4, 512, "sdpa", False, False),
    (GPT2_12L, 2, 1024, "eager", True, False),
    (LLAMA_TINY, 2, 128, "eager", False, False),
    (LLAMA_4L, 4, 1024, "sdpa", False, True),
    (LLAMA_4L, 2, 512, "eager", False, False),
    (LLAMA_4L, 8, 1024, "sdpa", True, True),
    (LLAMA_WIDE, 4, 512, "sdpa", False, True),
]


def build(model_cfg, attention):
    import transformers
    cfg = dict(model_cfg)
    arch = cfg.pop("arch")
    if arch == "gpt2":
        c = transformers.GPT2Config(**cfg)
        c._attn_implementation = attention
        return transformers.GPT2LMHeadModel(c)
    c = transformers.LlamaConfig(**cfg)
    c._attn_implementation = attention
    return transformers.LlamaForCausalLM(c)


def one(index):
    import torch
    model_cfg, batch, seq, attention, checkpointing, autocast = CONFIGS[index]
    torch.manual_seed(0)
    # No stack capture (context=None): it is not needed here, and with it the recomputation of
    # torch.utils.checkpoint raised SystemError inside dropout on torch 2.11.
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
    model = build(model_cfg, attention).cuda().train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    vocab = model.config.vocab_size
    for step in range(2):
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, ids
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    events, block_of, unmatched, segments, reserved, peak_reserved, allocs = [], {}, 0, 0, 0, 0, 0
    seg_events = []  # [index into events at which cudaMalloc (+size) or cudaFree (-size) happened]
    for e in trace:
        a = e["action"]
        if a == "alloc":
            block_of[e["addr"]] = allocs
            allocs += 1
            events.append(int(e["size"]))
        elif a == "free_completed":
            k = block_of.pop(e["addr"], None)
            if k is None:
                unmatched += 1
            else:
                events.append(-k)
        elif a == "segment_alloc":
            seg_events.append([len(events), int(e["size"])])
            reserved += int(e["size"])
            peak_reserved = max(peak_reserved, reserved)
            segments += 1
        elif a == "segment_free":
            seg_events.append([len(events), -int(e["size"])])
            reserved -= int(e["size"])
    return {
        "model": model_cfg, "batch": batch, "seq": seq, "attention": attention, "checkpointing": checkpointing,
        "autocast_bf16": autocast, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(), "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "trace_segments": segments, "trace_peak_reserved": peak_reserved, "unmatched_frees": unmatched,
        "trace_entries": len(trace), "events": events, "segment_events": seg_events,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", type=int)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.one is not None:
        json.dump(one(args.one), sys.stdout)
        return
    results = []
    for i in range(len(CONFIGS)):
        r = subprocess.run([sys.executable, __file__, "--one", str(i)], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"config {i} failed:\n{r.stderr[-3000:]}", file=sys.stderr)
            continue
        res = json.loads(r.stdout)
        print(f"config {i}: {len(res['events'])} events, allocated {res['max_memory_allocated']}, reserved "
              f"{res['max_memory_reserved']} (trace {res['trace_peak_reserved']}), unmatched {res['unmatched_frees']}",
              file=sys.stderr, flush=True)
        results.append(res)
        with open(args.out, "w") as f:
            json.dump({"configurations": results}, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
