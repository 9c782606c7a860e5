#!/usr/bin/env python3
"""Regenerate the PEFT LoRA fixtures tests/fixtures/lora_llama_tiny_torch/,
tests/fixtures/lora_gpt2_tiny_torch/, tests/fixtures/lora_llama_extras_tiny_torch/ (rsLoRA and
modules_to_save), tests/fixtures/lora_llama_select_tiny_torch/ (exclude_modules,
layers_to_transform) and tests/fixtures/lora_llama_patterns_tiny_torch/ (rank_pattern, alpha_pattern), tests/fixtures/lora_llama_dora_tiny_torch/ and tests/fixtures/lora_gpt2_dora_tiny_torch/ (use_dora) from the committed base fixtures (llama_tiny_torch,
gpt2_tiny_torch: their model and batch are reused, not copied).

What each fixture directory holds (float32, CPU, 1 thread, deterministic):
  adapter_config.json, adapter_model.safetensors   PEFT's save_pretrained of the adapter before
                        training (LoraConfig r=4, lora_alpha=8, lora_dropout=0, every linear
                        module as a target). PEFT initialises B to zero, which would make every
                        gradient of A zero; here B is drawn from a seeded normal instead.
  expected.safetensors  loss [], grad.<PEFT tensor name> for every adapter tensor, losses_adamw [4]
                        (loss before each of 3 AdamW steps, then after the last: lr 1e-3, betas
                        (0.9, 0.999), eps 1e-8, weight_decay 0.1, which memfit applies to every
                        matrix, adapters included), after.<PEFT tensor name>: the adapter after
                        the 3 steps.
  README.md             provenance

Run from the repository root: /work/venv/bin/python tools/make_lora_fixtures.py
"""

import json
import os
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from fixture_common import loss_of

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CASES = {
    "llama": ("llama_tiny_torch", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "gpt2": ("gpt2_tiny_torch", ["c_attn", "c_proj", "c_fc"]),
    # rsLoRA's scale and modules trained whole beside the adapters ("norm" is every RMSNorm:
    # PEFT matches a module whose path ends with the name; o_proj, a target too, leaves the
    # targets and trains whole).
    "llama_extras": ("llama_tiny_torch", ["q_proj", "k_proj", "v_proj", "o_proj"]),
    # Which modules the adapters wrap: every linear one but k_proj and up_proj, in layer 1 only.
    "llama_select": ("llama_tiny_torch", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    # Ranks and alphas per module.
    "llama_patterns": ("llama_tiny_torch", ["q_proj", "v_proj", "down_proj"]),
    # DoRA: a magnitude per output row of each target (q and v: pieces of memfit's fused q/k/v).
    "llama_dora": ("llama_tiny_torch", ["q_proj", "v_proj", "o_proj", "down_proj"]),
    # DoRA on GPT-2's biased Conv1D layers (the bias frozen and left out of the rescaling).
    "gpt2_dora": ("gpt2_tiny_torch", ["c_attn", "c_fc"]),
}
EXTRAS = {"llama_extras": {"use_rslora": True, "modules_to_save": ["o_proj", "norm"]},
          "llama_select": {"exclude_modules": ["k_proj", "up_proj"], "layers_to_transform": [1],
                           "layers_pattern": "layers"},
          "llama_patterns": {"rank_pattern": {"q_proj": 8, "layers.1.mlp.down_proj": 2}, "alpha_pattern": {"v_proj": 32}},
          "llama_dora": {"use_dora": True}, "gpt2_dora": {"use_dora": True}}
RANK, ALPHA, B_STD, LR, DECAY, STEPS = 4, 8, 0.1, 1e-3, 0.1, 3


def peft_name(param_name):
    """A parameter's name in PEFT's adapter file: without the adapter name ("default"); a module
    of modules_to_save under its base model's name."""
    name = param_name.replace(".modules_to_save.default.", ".").replace(".default.", ".")
    # DoRA's magnitude is a parameter "lora_magnitude_vector.default.weight", saved without both.
    return name.replace(".lora_magnitude_vector.weight", ".lora_magnitude_vector")


def build(family, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir, targets = CASES[family]
    base = AutoModelForCausalLM.from_pretrained(FIXTURES / base_dir, attn_implementation="eager", dtype=torch.float32)
    base.train()
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets, bias="none",
                        task_type="CAUSAL_LM", fan_in_fan_out=family.startswith("gpt2"), **EXTRAS.get(family, {}))
    torch.manual_seed(seed)  # A: PEFT's kaiming-uniform draw
    model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * B_STD)
    model.base_model.model.name_or_path = base_dir
    model.peft_config["default"].base_model_name_or_path = base_dir
    return model


def trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def reference(model, tokens, targets):
    expected = {}
    model.zero_grad(set_to_none=True)
    _, loss = loss_of(model, tokens, targets)
    loss.backward()
    expected["loss"] = loss.detach().reshape(())
    for name, p in trainable(model):
        if "lora_" not in name and "modules_to_save" not in name:
            sys.exit(f"trainable parameter {name} is neither an adapter nor in modules_to_save")
        if p.grad is None or not p.grad.abs().max() > 0:
            sys.exit(f"no gradient for {name}")
        expected["grad." + peft_name(name)] = p.grad.detach().clone().contiguous()
    # memfit decays every matrix (adapters are matrices), not vectors (norms).
    groups = [{"params": [p for _, p in trainable(model) if p.dim() >= 2], "weight_decay": DECAY},
              {"params": [p for _, p in trainable(model) if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l = loss_of(model, tokens, targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    with torch.no_grad():
        losses.append(loss_of(model, tokens, targets)[1].item())
    if not all(losses[i + 1] < losses[i] for i in range(len(losses) - 1)):
        sys.exit(f"loss does not decrease: {losses}")
    expected["losses_adamw"] = torch.tensor(losses, dtype=torch.float32)
    for name, p in trainable(model):
        expected["after." + peft_name(name)] = p.detach().clone().contiguous()
    return expected


def make(family, seed=1234):
    import peft
    import transformers

    base_dir, _ = CASES[family]
    out = FIXTURES / f"lora_{family}_tiny_torch"
    out.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(out):
        (out / name).unlink()
    model = build(family, seed)
    model.save_pretrained(out, safe_serialization=True)
    for extra in sorted(set(os.listdir(out)) - {"adapter_config.json", "adapter_model.safetensors"}):
        (out / extra).unlink()
    # PEFT writes target_modules from a set, in hash order: sorted, the file is reproducible.
    cfg = json.loads((out / "adapter_config.json").read_text())
    cfg["target_modules"] = sorted(cfg["target_modules"])
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    saved = load_file(str(out / "adapter_model.safetensors"))
    names = {peft_name(n) for n, _ in trainable(model)}
    if set(saved) != names:
        sys.exit(f"adapter file names differ from the parameters: {sorted(set(saved) ^ names)}")
    batch = load_file(str(FIXTURES / base_dir / "batch.safetensors"))
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    expected = reference(model, tokens, targets)
    meta = {"source": f"tools/make_lora_fixtures.py torch={torch.__version__} transformers={transformers.__version__} "
                      f"peft={peft.__version__} seed={seed}"}
    save_file(expected, str(out / "expected.safetensors"), metadata=meta)
    cfg = json.loads((out / "adapter_config.json").read_text())
    (out / "README.md").write_text(f"""# {out.name}

PEFT {peft.__version__} LoRA adapter on `tests/fixtures/{base_dir}` (its model.safetensors and batch.safetensors),
made by `tools/make_lora_fixtures.py` with PyTorch {torch.__version__} + transformers {transformers.__version__}, float32,
CPU, 1 thread. LoraConfig r={RANK}, lora_alpha={ALPHA}, lora_dropout=0, bias none, target_modules {sorted(cfg["target_modules"])}{"".join(f", {k}={v}" for k, v in EXTRAS.get(family, {}).items())}
{"(fan_in_fan_out: GPT-2's Conv1D) " if family.startswith("gpt2") else ""}A as PEFT draws it (torch seed {seed}); B from N(0, {B_STD}^2) (seed {seed + 1}),
not zero, so that A's gradients are not zero.
`adapter_config.json` + `adapter_model.safetensors`: PEFT's save_pretrained of that adapter.
`expected.safetensors`: `loss` [], `grad.<adapter tensor>`, `losses_adamw` [{STEPS + 1}] (AdamW lr {LR}, betas (0.9, 0.999),
eps 1e-8, weight_decay {DECAY} on every trained matrix, none on vectors: loss before each step, then after the last) and
`after.<adapter tensor>` (the adapter after the {STEPS} steps).
Regenerate from the repository root: `/work/venv/bin/python tools/make_lora_fixtures.py`.
""")
    total = sum((out / n).stat().st_size for n in os.listdir(out))
    print(f"{family}: loss {expected['loss'].item():.6f} losses_adamw {[round(x, 6) for x in expected['losses_adamw'].tolist()]}"
          f"; {len(names)} adapter tensors, {total:,d} bytes in {out}")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for family in sys.argv[1:] or list(CASES):
        make(family)


if __name__ == "__main__":
    main()
