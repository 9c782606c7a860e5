#!/usr/bin/env python3
"""Regenerate the PEFT fixtures of LoRA starts that rewrite the base (init_lora_weights "olora" and
"pissa"): tests/fixtures/lora_start_<case>_tiny_torch/ for llama_olora, llama_pissa and gpt2_pissa,
on the committed base fixtures (llama_tiny_torch, gpt2_tiny_torch: reused, not copied).

Each directory (float32, CPU, 1 thread, deterministic):
  adapter_config.json, adapter_model.safetensors   PEFT's save_pretrained right after
                        get_peft_model (LoraConfig r=4, lora_alpha=8, lora_dropout=0): the started
                        adapters, A and B as OLoRA's QR or PiSSA's SVD of each target weight makes them,
                        init_lora_weights kept in the config (PEFT, loading it on the original base,
                        starts again and then takes the file's A and B).
  expected.safetensors  loss [] and grad.<PEFT tensor name> of the first step (PEFT's base is then
                        W - scale B A) and losses_adamw [4], as tools/make_lora_fixtures.py's
                        (AdamW lr 1e-3, decay 0.1 on matrices, 3 steps).
  README.md             provenance

Run from the repository root: /work/venv/bin/python tools/make_lora_start_fixtures.py
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

from make_lora_fixtures import FIXTURES, reference, peft_name, trainable

CASES = {
    # q (64 x 64), v (32 x 64: fewer rows than columns) and down (64 x 172) of llama's base.
    "llama_olora": ("llama_tiny_torch", ["q_proj", "v_proj", "down_proj"], "olora", False),
    "llama_pissa": ("llama_tiny_torch", ["q_proj", "v_proj", "down_proj"], "pissa", False),
    # GPT-2's Conv1D stores [in, out]: PEFT's pissa_init transposes it (fan_in_fan_out).
    "gpt2_pissa": ("gpt2_tiny_torch", ["c_attn", "c_fc"], "pissa", True),
}
RANK, ALPHA = 4, 8


def make(case):
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir, targets, init, conv1d = CASES[case]
    out = FIXTURES / f"lora_start_{case}_tiny_torch"
    out.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(out):
        (out / name).unlink()
    base = AutoModelForCausalLM.from_pretrained(FIXTURES / base_dir, attn_implementation="eager", dtype=torch.float32)
    base.train()
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets, init_lora_weights=init,
                        task_type="CAUSAL_LM", fan_in_fan_out=conv1d)
    model = get_peft_model(base, config)
    model.base_model.model.name_or_path = base_dir
    model.peft_config["default"].base_model_name_or_path = base_dir
    model.save_pretrained(out, safe_serialization=True)
    for extra in sorted(set(os.listdir(out)) - {"adapter_config.json", "adapter_model.safetensors"}):
        (out / extra).unlink()
    cfg = json.loads((out / "adapter_config.json").read_text())
    if cfg["init_lora_weights"] != init:
        sys.exit(f"{case}: saved init_lora_weights {cfg['init_lora_weights']!r}, not {init!r}")
    cfg["target_modules"] = sorted(cfg["target_modules"])
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    batch = load_file(str(FIXTURES / base_dir / "batch.safetensors"))
    tokens, targets_ = batch["tokens"].long(), batch["targets"].long()
    expected = reference(model, tokens, targets_)
    expected = {k: v for k, v in expected.items() if not k.startswith("after.")}  # the losses hold the steps
    meta = {"source": f"tools/make_lora_start_fixtures.py torch={torch.__version__} "
                      f"transformers={transformers.__version__} peft={peft.__version__}"}
    save_file(expected, str(out / "expected.safetensors"), metadata=meta)
    (out / "README.md").write_text(f"""# {out.name}

PEFT {peft.__version__} LoRA adapter started with init_lora_weights="{init}" on `tests/fixtures/{base_dir}`
(its model.safetensors and batch.safetensors), made by `tools/make_lora_start_fixtures.py` with PyTorch
{torch.__version__} + transformers {transformers.__version__}, float32, CPU, 1 thread. LoraConfig r={RANK},
lora_alpha={ALPHA}, lora_dropout=0, target_modules {sorted(targets)}{", fan_in_fan_out (GPT-2's Conv1D)" if conv1d else ""}.
`adapter_config.json` + `adapter_model.safetensors`: PEFT's save_pretrained right after get_peft_model (the
started A and B; PEFT's base is then W - (alpha / r) B A).
`expected.safetensors`: `loss` [] and `grad.<adapter tensor>` of the first step, `losses_adamw` [4] (AdamW lr
1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1 on every trained matrix: loss before each of 3 steps, then
after the last).
Regenerate from the repository root: `/work/venv/bin/python tools/make_lora_start_fixtures.py`.
""")
    total = sum((out / n).stat().st_size for n in os.listdir(out))
    names = {peft_name(n) for n, _ in trainable(model)}
    print(f"{case}: loss {expected['loss'].item():.6f} losses_adamw "
          f"{[round(x, 6) for x in expected['losses_adamw'].tolist()]}; {len(names)} adapter tensors, "
          f"{total:,d} bytes in {out}")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for case in sys.argv[1:] or list(CASES):
        make(case)


if __name__ == "__main__":
    main()
