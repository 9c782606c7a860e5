#!/usr/bin/env python3
"""Regenerate tests/fixtures/deepspeed/schedules.json: the learning rate DeepSpeed's own
schedulers (deepspeed.runtime.lr_schedules) give each optimizer step, driven as the DeepSpeed
engine drives them (the optimizer steps with the current lr, then scheduler.step()), for the
scheduler blocks of a DeepSpeed config. memfit's LrSchedule must give the same numbers.

Run from the repository root with the tools venv (never needed to build or test):
  /work/venv/bin/python tools/make_deepspeed_schedule_fixture.py
"""

import json
from pathlib import Path

import deepspeed
import torch
from deepspeed.runtime import lr_schedules

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/deepspeed/schedules.json"
STEPS = 40
CASES = [
    ("WarmupLR", 1e-3, {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10}),
    ("WarmupLR", 1e-3, {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 8,
                        "warmup_type": "linear"}),
    ("WarmupLR", 2e-4, {"warmup_num_steps": 1}),
    ("WarmupDecayLR", 1e-3, {"total_num_steps": 30, "warmup_min_lr": 0, "warmup_max_lr": 6e-4,
                             "warmup_num_steps": 5}),
    ("WarmupDecayLR", 1e-3, {"total_num_steps": 25, "warmup_min_lr": 1e-6, "warmup_max_lr": 1e-3,
                             "warmup_num_steps": 12, "warmup_type": "linear"}),
    ("WarmupCosineLR", 5e-4, {"total_num_steps": 30, "warmup_min_ratio": 0.0, "warmup_num_steps": 6,
                              "cos_min_ratio": 0.1}),
    ("WarmupCosineLR", 5e-4, {"total_num_steps": 20, "warmup_min_ratio": 0.05, "warmup_num_steps": 4,
                              "cos_min_ratio": 0.0001, "warmup_type": "linear"}),
]


def lrs_of(kind, optimizer_lr, params):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optimizer_lr)
    sched = getattr(lr_schedules, kind)(opt, **params)
    out = []
    for _ in range(STEPS):
        out.append(float(opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
    return out


def main():
    cases = [{"scheduler": {"type": kind, "params": params}, "optimizer_lr": lr, "lrs": lrs_of(kind, lr, params)}
             for kind, lr, params in CASES]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"deepspeed": deepspeed.__version__, "steps": STEPS, "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT} ({len(cases)} schedules, DeepSpeed {deepspeed.__version__})")


if __name__ == "__main__":
    main()
