#!/usr/bin/env python3
"""Measure the CPU tensor-byte peak of one HF transformers + PyTorch training step.

Writes tests/fixtures/pytorch_memory/fixtures.json, the reference that
src/fit/framework_pytorch.cpp (`memfit plan --framework pytorch`) is checked against.

The step: a randomly initialised HF model (GPT2Config / LlamaConfig, nothing downloaded) in
train() mode; model(input_ids, labels=labels) under torch.autocast('cpu', bfloat16) when
autocast is on -> loss.backward() -> torch.optim.AdamW(foreach=True).step() ->
zero_grad(set_to_none=True). Step 1 runs unrecorded: it creates AdamW's exp_avg / exp_avg_sq,
a one-off. Step 2 is recorded: the steady state a training run repeats, optimizer state included.

Method: torch.profiler with profile_memory=True records every CPU allocator allocation (+bytes)
and free (-bytes) as a [memory] event. Live bytes are the bytes live before the step
(parameters, buffers, AdamW state: counted from the tensors themselves) plus the running sum of
the signed deltas in time order; the peak is its maximum. This is what torch's memory timeline
computes, without its categorisation. Each phase (forward with loss, backward, optimizer step
with zero_grad) is recorded in its own profiler session so the fixture also carries per-phase
peaks; the running sum continues across sessions, so a tensor freed in a later phase than it was
allocated in is still counted. Sizes are the bytes requested from the allocator (no rounding).

Usage: /work/venv/bin/python tools/make_pytorch_memory_fixtures.py [--only N] [--out PATH]
       /work/venv/bin/python tools/make_pytorch_memory_fixtures.py --random 10
  --random K: K random small shapes for each of the 16 (architecture, attention, checkpointing,
  autocast) combinations, peaks only, to random_shapes.json (a check on shapes nobody chose).
"""
import argparse
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
import transformers

torch.set_num_threads(1)  # a shared 2-core machine; the bytes do not depend on threads

GPT2_S = dict(arch="gpt2", n_layer=2, n_embd=128, n_head=4, vocab_size=2000, n_positions=1024)
GPT2_M = dict(arch="gpt2", n_layer=3, n_embd=192, n_head=6, vocab_size=5000, n_positions=1024)
GPT2_L = dict(arch="gpt2", n_layer=4, n_embd=256, n_head=8, vocab_size=8000, n_positions=1024)
LLAMA_S = dict(arch="llama", num_hidden_layers=2, hidden_size=128, intermediate_size=352, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=2000, max_position_embeddings=1024)
LLAMA_M = dict(arch="llama", num_hidden_layers=3, hidden_size=256, intermediate_size=688, num_attention_heads=8,
               num_key_value_heads=2, vocab_size=4000, max_position_embeddings=1024)
LLAMA_T = dict(arch="llama", num_hidden_layers=2, hidden_size=192, intermediate_size=512, num_attention_heads=6,
               num_key_value_heads=6, vocab_size=3000, max_position_embeddings=1024, tie_word_embeddings=True)

# (model, batch, seq, attention, checkpointing, autocast)
CONFIGS = [
    (GPT2_S, 1, 64, "sdpa", False, False),
    (GPT2_S, 1, 64, "eager", False, False),
    (GPT2_S, 4, 512, "sdpa", False, False),
    (GPT2_S, 4, 512, "eager", False, False),
    (GPT2_S, 4, 512, "sdpa", True, False),
    (GPT2_S, 4, 512, "eager", False, True),
    (GPT2_S, 8, 1024, "sdpa", False, False),
    (GPT2_S, 8, 1024, "eager", True, False),
    (GPT2_M, 2, 128, "eager", False, False),
    (GPT2_M, 4, 512, "sdpa", False, True),
    (GPT2_M, 8, 1024, "sdpa", True, True),
    (GPT2_M, 2, 256, "eager", True, True),
    (GPT2_L, 4, 512, "sdpa", False, False),
    (GPT2_L, 1, 1024, "eager", False, False),
    (LLAMA_S, 1, 64, "sdpa", False, False),
    (LLAMA_S, 4, 512, "sdpa", False, False),
    (LLAMA_S, 4, 512, "eager", False, False),
    (LLAMA_S, 4, 512, "sdpa", True, False),
    (LLAMA_S, 4, 512, "sdpa", False, True),
    (LLAMA_S, 8, 1024, "sdpa", False, False),
    (LLAMA_S, 8, 1024, "eager", True, True),
    (LLAMA_M, 2, 128, "eager", False, False),
    (LLAMA_M, 4, 512, "sdpa", False, False),
    (LLAMA_M, 4, 512, "eager", True, False),
    (LLAMA_M, 8, 1024, "sdpa", True, True),
    (LLAMA_M, 2, 256, "eager", False, True),
    (LLAMA_T, 4, 512, "sdpa", False, False),
    (LLAMA_T, 2, 512, "eager", False, True),
]


def hf_config(model):
    kw = {k: v for k, v in model.items() if k != "arch"}
    if model["arch"] == "gpt2":
        return transformers.GPT2Config(**kw)
    return transformers.LlamaConfig(**kw)


class Timeline:
    """The running sum of the allocator's signed byte deltas, over several profiler sessions."""

    def __init__(self, base):
        self.live = base

    def record(self, fn):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
        events = [e for e in prof.profiler.kineto_results.events()
                  if e.name() == "[memory]" and str(e.device_type()) == "DeviceType.CPU"]
        events.sort(key=lambda e: e.start_ns())
        peak = self.live
        for e in events:
            self.live += e.nbytes()
            peak = max(peak, self.live)
        return out, peak


def tensor_bytes(t):
    return t.numel() * t.element_size()


def live_before(model, opt):
    seen = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += tensor_bytes(t)
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                total += tensor_bytes(v)
    return total


def measure(model_cfg, batch, seq, attention, checkpointing, autocast):
    torch.manual_seed(0)
    cfg = hf_config(model_cfg)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attention)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    vocab = cfg.vocab_size

    def step(timeline=None):
        ids = torch.randint(0, vocab, (batch, seq))

        def forward():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                return model(input_ids=ids, labels=ids).loss

        def backward():
            loss.backward()

        def optimize():
            opt.step()
            opt.zero_grad(set_to_none=True)

        if timeline is None:
            loss = forward()
            backward()
            optimize()
            return None
        loss, p_fwd = timeline.record(forward)
        after_fwd = timeline.live
        _, p_bwd = timeline.record(backward)
        after_bwd = timeline.live
        del loss
        _, p_opt = timeline.record(optimize)
        return dict(peak_forward=p_fwd, live_after_forward=after_fwd, peak_backward=p_bwd,
                    live_after_backward=after_bwd, peak_optimizer=p_opt)

    step()  # step 1: creates AdamW's state
    base = live_before(model, opt)
    params = sum(tensor_bytes(p) for p in model.parameters())
    # The input ids (also the labels) are created before the first session and freed after the
    # last: they are part of the baseline.
    tl = Timeline(base + batch * seq * 8)
    phases = step(tl)
    phases["live_after_step"] = tl.live
    phases["peak"] = max(phases["peak_forward"], phases["peak_backward"], phases["peak_optimizer"])
    return cfg, params, base, phases


def random_configs(per_combo, seed=7):
    import random
    rnd = random.Random(seed)
    out = []
    for arch in ("gpt2", "llama"):
        for att in ("sdpa", "eager"):
            for ckpt in (False, True):
                for ac in (False, True):
                    for _ in range(per_combo):
                        L, H, C = rnd.choice([1, 2, 3]), rnd.choice([2, 4]), rnd.choice([64, 96, 128])
                        V, B, T, I = rnd.choice([500, 1000, 2000]), rnd.choice([1, 2, 3]), rnd.choice([64, 128, 256]), \
                            C * rnd.choice([2, 3, 4])
                        if arch == "gpt2":
                            m = dict(arch="gpt2", n_layer=L, n_embd=C, n_head=H, vocab_size=V, n_positions=512, n_inner=I)
                        else:
                            m = dict(arch="llama", num_hidden_layers=L, hidden_size=C, intermediate_size=I,
                                     num_attention_heads=H, num_key_value_heads=rnd.choice([k for k in (1, 2, H) if H % k == 0]),
                                     vocab_size=V, max_position_embeddings=512, tie_word_embeddings=rnd.choice([True, False]))
                        out.append((m, B, T, att, ckpt, ac))
    return out


def main_random(per_combo, path):
    out = []
    for i, (m, b, t, att, ckpt, ac) in enumerate(random_configs(per_combo)):
        cfg, params, base, ph = measure(m, b, t, att, ckpt, ac)
        d = cfg.to_dict()
        hf = {"model_type": d["model_type"]}
        hf.update({k: d[k] for k in m if k != "arch"})
        out.append(dict(config=hf, batch=b, seq=t, attention=att, checkpointing=ckpt, autocast="bf16" if ac else "none",
                        peak=ph["peak"]))
        print(i, hf, b, t, att, ckpt, ac, ph["peak"], file=sys.stderr, flush=True)
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "configs": out}, f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", type=int, default=-1)
    ap.add_argument("--random", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                  "pytorch_memory", "fixtures.json"))
    args = ap.parse_args()
    if args.random:
        return main_random(args.random, os.path.join(os.path.dirname(args.out), "random_shapes.json"))
    out = []
    for i, (m, b, t, att, ckpt, ac) in enumerate(CONFIGS):
        if args.only >= 0 and i != args.only:
            continue
        t0 = time.time()
        cfg, params, base, ph = measure(m, b, t, att, ckpt, ac)
        keys = [k for k in m if k != "arch"] + ["tie_word_embeddings", "activation_function", "hidden_act",
                                                "resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout",
                                                "n_inner", "layer_norm_epsilon", "rms_norm_eps"]
        d = cfg.to_dict()
        hf = {"model_type": d["model_type"]}
        hf.update({k: d[k] for k in keys if k in d})
        rec = dict(config=hf, batch=b, seq=t, attention=att, checkpointing=ckpt,
                   autocast="bf16" if ac else "none", parameter_bytes=params, live_before_step=base, **ph)
        out.append(rec)
        print(f"{i:2d} {m['arch']} b{b} t{t} {att} ckpt={int(ckpt)} ac={int(ac)} "
              f"peak={ph['peak'] / 2**20:.1f} MiB (fwd {ph['peak_forward'] / 2**20:.1f}, "
              f"bwd {ph['peak_backward'] / 2**20:.1f}, opt {ph['peak_optimizer'] / 2**20:.1f}) "
              f"{time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    if args.only < 0:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
                       "step": "step 2 of forward(labels) -> backward -> AdamW(foreach).step -> zero_grad(None)",
                       "configs": out}, f, indent=1)
            f.write("\n")
    else:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
