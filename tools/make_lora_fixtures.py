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
                        the 3 steps. For llama_dora and gpt2_dora also dropout_p [] (0.1),
                        dropout.loss [] and dropout.grad.<PEFT tensor name>: the first loss and
                        gradients (before any step) with lora_dropout 0.1 in training mode, each
                        LoRA layer's PEFT dropout mask replaced by memfit's (src/core/dropout_mask.hpp:
                        seed 0, step 1, micro-step 0, salt FNV-1a("<memfit module>.lora_dropout")).
                        For gpt2_dora also bias_all.loss [] and bias_all.grad.<PEFT tensor name>:
                        the first step with LoraConfig bias="all" (every bias of the model trained
                        beside the same adapter), a separate PeftModel built after the rest.
  README.md             provenance

Run from the repository root: /work/venv/bin/python tools/make_lora_fixtures.py
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
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
# Families that also record a step with lora_dropout, with memfit's masks: the prefix that a
# PEFT LoRA layer's path loses to become memfit's module name ("layers.0.self_attn.q_proj").
DROPOUT = {"llama_dora": "base_model.model.model.", "gpt2_dora": "base_model.model.transformer."}
DROPOUT_P, DROPOUT_SEED, DROPOUT_STEP, DROPOUT_MICRO = 0.1, 0, 1, 0
# Families that also record the first step with LoraConfig bias="all": PEFT trains every
# parameter whose name holds "bias" (targets' base_layer.bias, the other linears', LayerNorms').
BIAS_ALL = {"gpt2_dora"}
U64 = 0xFFFFFFFFFFFFFFFF
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    """SplitMix64's finaliser (memfit::mix64) on a numpy uint64 array, wrapping mod 2^64."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def mix64_int(z):
    """mix64 on a Python int: the check of the numpy version."""
    z &= U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def check_mix64():
    inputs = [0, 1, 2, 0x9E3779B97F4A7C15, 0xDEADBEEFCAFEBABE, U64, 1 << 63, 123456789]
    got = mix64(np.array(inputs, dtype=np.uint64))
    want = [mix64_int(z) for z in inputs]
    if [int(v) for v in got] != want:
        sys.exit(f"numpy mix64 {[hex(int(v)) for v in got]} != {[hex(v) for v in want]}")


def dropout_salt(name):
    """memfit::dropout_salt: 64-bit FNV-1a of the site's name."""
    h = 0xCBF29CE484222325
    for c in name.encode("ascii"):
        h = ((h ^ c) * 0x100000001B3) & U64
    return h


def dropout_key(seed, step, micro, salt):
    """memfit::dropout_key, as a numpy uint64 scalar."""
    with np.errstate(over="ignore"):
        k = mix64(np.uint64(seed) + np.uint64(GOLDEN))
    k = mix64(k ^ np.uint64(step & U64))
    k = mix64(k ^ (np.uint64(micro & 0xFFFFFFFF) << np.uint64(32)))
    k = mix64(k ^ np.uint64(salt))
    # The same in Python ints: the numpy version must agree.
    ki = mix64_int(seed + GOLDEN)
    ki = mix64_int(ki ^ (step & U64))
    ki = mix64_int(ki ^ ((micro & 0xFFFFFFFF) << 32))
    ki = mix64_int(ki ^ salt)
    if int(k) != ki:
        sys.exit(f"dropout key {int(k):#x} != {ki:#x}")
    return k


def dropout_keep(key, n, p):
    """memfit::dropout_keeps for elements 0..n-1 of the whole tensor (row-major)."""
    threshold = np.uint64(int(float(np.float32(p)) * float(1 << 24) + 0.5))
    index = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        draw = mix64(np.uint64(key) + np.uint64(GOLDEN) * index) >> np.uint64(40)
    return draw >= threshold


class MemfitDropout(torch.nn.Module):
    """A LoRA layer's dropout with memfit's fixed mask: x * scale where kept, 0 where dropped
    (scale = float(1 / (1 - p)), as memfit's kernels). Not nn.Identity, so that PEFT's DoRA takes
    its dropout branch."""

    def __init__(self, shape, p, salt):
        super().__init__()
        self.p = float(np.float32(p))
        key = dropout_key(DROPOUT_SEED, DROPOUT_STEP, DROPOUT_MICRO, salt)
        n = int(np.prod(shape))
        keep = dropout_keep(key, n, p) if p > 0 else np.ones(n, dtype=bool)
        self.keep = torch.from_numpy(keep.reshape(shape))
        self.scale = float(np.float32(1.0 / (1.0 - self.p)))

    def forward(self, x):
        if x.shape != self.keep.shape:
            raise RuntimeError(f"dropout input {tuple(x.shape)} != mask {tuple(self.keep.shape)}")
        return torch.where(self.keep, x * torch.tensor(self.scale, dtype=x.dtype), torch.zeros((), dtype=x.dtype))


def peft_name(param_name):
    """A parameter's name in PEFT's adapter file: without the adapter name ("default"); a module
    of modules_to_save under its base model's name."""
    name = param_name.replace(".modules_to_save.default.", ".").replace(".default.", ".")
    # DoRA's magnitude is a parameter "lora_magnitude_vector.default.weight", saved without both.
    return name.replace(".lora_magnitude_vector.weight", ".lora_magnitude_vector")


def build(family, seed, bias="none"):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir, targets = CASES[family]
    base = AutoModelForCausalLM.from_pretrained(FIXTURES / base_dir, attn_implementation="eager", dtype=torch.float32)
    base.train()
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets, bias=bias,
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


def dropout_reference(model, family, tokens, targets):
    """The first step's loss and adapter gradients with lora_dropout DROPOUT_P, memfit's masks in
    PEFT's dropout modules; also the same with p = 0 (an all-ones mask, through the same branch),
    returned apart for make()'s check against the dropout-free reference. The model is left as
    it was (its dropout modules restored, no gradients)."""
    from peft.tuners.lora import LoraLayer

    prefix = DROPOUT[family]
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    if not layers:
        sys.exit("no LoRA layers")
    if not model.training or not all(m.training for _, m in layers):
        sys.exit("the model is not in training mode")
    # Only the LoRA dropout drops: the base model's own dropout must be off.
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and m.p != 0:
            sys.exit(f"{n}: dropout {m.p}, not 0")
    for n in ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop"):
        if getattr(model.base_model.model.config, n, 0) != 0:
            sys.exit(f"base config {n} is not 0")
    originals = {}
    for n, m in layers:
        if not n.startswith(prefix):
            sys.exit(f"LoRA layer {n} not under {prefix}")
        if not isinstance(m.lora_dropout["default"], torch.nn.Identity):
            sys.exit(f"{n}: lora_dropout is not Identity")
        originals[n] = m.lora_dropout["default"]
    batch, seq = tokens.shape

    def run(p):
        kept = []
        for n, m in layers:
            site = n[len(prefix):] + ".lora_dropout"
            d = MemfitDropout((batch, seq, m.in_features), p, dropout_salt(site))
            kept.append((site, d.keep.float().mean().item()))
            m.lora_dropout["default"] = d
        model.zero_grad(set_to_none=True)
        _, loss = loss_of(model, tokens, targets)
        loss.backward()
        grads = {}
        for name, q in trainable(model):
            if q.grad is None or not q.grad.abs().max() > 0:
                sys.exit(f"dropout: no gradient for {name}")
            grads[peft_name(name)] = q.grad.detach().clone().contiguous()
        return loss.detach().reshape(()).clone(), grads, kept

    loss0, grads0, _ = run(0.0)
    loss, grads, kept = run(DROPOUT_P)
    for n, m in layers:
        m.lora_dropout["default"] = originals[n]
    model.zero_grad(set_to_none=True)
    for site, f in kept:
        print(f"  {site}: kept {f:.4f}")
    expected = {"dropout_p": torch.tensor(DROPOUT_P, dtype=torch.float32), "dropout.loss": loss}
    expected.update({"dropout.grad." + n: g for n, g in grads.items()})
    return expected, (loss0, grads0), kept


def check_dropout(expected, p0):
    """p = 0 through the dropout branch gives the reference's loss and gradients (to rounding);
    p = 0.1 keeps about 90 % and changes the loss."""
    loss0, grads0 = p0
    worst = abs(loss0.item() - expected["loss"].item())
    if worst > 1e-5:
        sys.exit(f"dropout p=0 loss {loss0.item()} != loss {expected['loss'].item()}")
    for n, g in grads0.items():
        ref = expected["grad." + n]
        err = (g - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        if err > 1e-4:
            sys.exit(f"dropout p=0 grad {n} differs from grad by {err:.3g} (relative to its max)")
        worst = max(worst, err)
    if abs(expected["dropout.loss"].item() - expected["loss"].item()) < 1e-6:
        sys.exit("dropout.loss equals loss")
    return worst


def bias_all_reference(family, seed, saved, expected, tokens, targets):
    """The first step's loss and gradients of every trainable tensor with bias="all": a fresh
    PeftModel of the same adapter (checked bit-equal to the saved one), built after the other
    runs so that they are undisturbed. Checked against the bias="none" reference: the same loss,
    the same adapter gradients; every bias gradient nonzero."""
    model = build(family, seed, bias="all")
    params = dict(model.named_parameters())
    adapters, biases = [], []
    for name, p in trainable(model):
        if "lora_" in name:
            adapters.append(name)
        elif name.endswith(".bias"):
            biases.append(name)
        else:
            sys.exit(f"bias_all: trainable parameter {name} is neither an adapter nor a bias")
    # PEFT's bias="all": every parameter named "...bias..." trained, none left frozen.
    frozen = [n for n, p in params.items() if "bias" in n and not p.requires_grad]
    if frozen or not biases:
        sys.exit(f"bias_all: frozen biases {frozen}, trained biases {biases}")
    if {peft_name(n) for n in adapters} != set(saved):
        sys.exit(f"bias_all: adapter names differ: {sorted({peft_name(n) for n in adapters} ^ set(saved))}")
    for n in adapters:
        if not torch.equal(params[n].detach(), saved[peft_name(n)]):
            sys.exit(f"bias_all: {n} differs from the saved adapter")
    model.zero_grad(set_to_none=True)
    _, loss = loss_of(model, tokens, targets)
    loss.backward()
    out = {"bias_all.loss": loss.detach().reshape(()).clone()}
    for name, p in trainable(model):
        if p.grad is None or not p.grad.abs().max() > 0:
            sys.exit(f"bias_all: no gradient for {name}")
        out["bias_all.grad." + peft_name(name)] = p.grad.detach().clone().contiguous()
    ref = expected["loss"].item()
    if abs(loss.item() - ref) > 1e-6 * abs(ref):
        sys.exit(f"bias_all.loss {loss.item()} != loss {ref}")
    worst = 0.0
    for n in adapters:
        g, r = out["bias_all.grad." + peft_name(n)], expected["grad." + peft_name(n)]
        err = (g - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
        if err > 1e-6:
            sys.exit(f"bias_all grad {n} differs from grad by {err:.3g} (relative to its max)")
        worst = max(worst, err)
    print(f"  bias_all: loss {loss.item():.6f} (loss {ref:.6f}); adapter gradients worst difference {worst:.3g}; "
          f"{len(biases)} biases:")
    for n in biases:
        g = out["bias_all.grad." + peft_name(n)]
        print(f"    bias_all.grad.{peft_name(n)} {list(g.shape)} max|g| {g.abs().max().item():.3g}")
    return out


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
    dropout = None
    if family in DROPOUT:
        check_mix64()
        dropout, p0, kept = dropout_reference(model, family, tokens, targets)
    expected = reference(model, tokens, targets)
    if dropout is not None:
        worst = check_dropout({**expected, **dropout}, p0)
        frac = sum(f for _, f in kept) / len(kept)
        if not 0.88 < frac < 0.92:
            sys.exit(f"dropout keeps {frac:.4f} of the elements, not about {1 - DROPOUT_P}")
        print(f"  p=0 through the dropout branch: worst difference {worst:.3g}; mean kept {frac:.4f}; "
              f"dropout.loss {dropout['dropout.loss'].item():.6f}")
        expected.update(dropout)
    bias_all = None
    if family in BIAS_ALL:
        bias_all = bias_all_reference(family, seed, saved, expected, tokens, targets)
        expected.update(bias_all)
    meta = {"source": f"tools/make_lora_fixtures.py torch={torch.__version__} transformers={transformers.__version__} "
                      f"peft={peft.__version__} seed={seed}"}
    save_file(expected, str(out / "expected.safetensors"), metadata=meta)
    cfg = json.loads((out / "adapter_config.json").read_text())
    dropout_text = "" if dropout is None else (
        f"\nAlso `dropout_p` [] ({DROPOUT_P}), `dropout.loss` [] and `dropout.grad.<adapter tensor>`: the first loss and "
        f"gradients (before any step, training mode) with lora_dropout {DROPOUT_P}, PEFT's dropout mask of each LoRA layer "
        f"replaced by memfit's (`src/core/dropout_mask.hpp`: seed {DROPOUT_SEED}, step {DROPOUT_STEP}, micro-step "
        f"{DROPOUT_MICRO}, salt the FNV-1a of `<memfit module>.lora_dropout`, e.g. "
        f"`{'layers.0.self_attn.q_proj' if family.startswith('llama') else 'h.0.attn.c_attn'}.lora_dropout`, over the "
        f"flat index of the layer's whole [B, T, in] input), other dropout off.")
    if bias_all is not None:
        dropout_text += (
            "\nAlso `bias_all.loss` [] and `bias_all.grad.<tensor>`: the first step (before any step, lora_dropout 0) "
            "with LoraConfig bias=\"all\" (the same adapter, every bias of the model trained, PEFT's names, e.g. "
            "`base_model.model.transformer.h.0.attn.c_attn.base_layer.bias`).")
    (out / "README.md").write_text(f"""# {out.name}

PEFT {peft.__version__} LoRA adapter on `tests/fixtures/{base_dir}` (its model.safetensors and batch.safetensors),
made by `tools/make_lora_fixtures.py` with PyTorch {torch.__version__} + transformers {transformers.__version__}, float32,
CPU, 1 thread. LoraConfig r={RANK}, lora_alpha={ALPHA}, lora_dropout=0, bias none, target_modules {sorted(cfg["target_modules"])}{"".join(f", {k}={v}" for k, v in EXTRAS.get(family, {}).items())}
{"(fan_in_fan_out: GPT-2's Conv1D) " if family.startswith("gpt2") else ""}A as PEFT draws it (torch seed {seed}); B from N(0, {B_STD}^2) (seed {seed + 1}),
not zero, so that A's gradients are not zero.
`adapter_config.json` + `adapter_model.safetensors`: PEFT's save_pretrained of that adapter.
`expected.safetensors`: `loss` [], `grad.<adapter tensor>`, `losses_adamw` [{STEPS + 1}] (AdamW lr {LR}, betas (0.9, 0.999),
eps 1e-8, weight_decay {DECAY} on every trained matrix, none on vectors: loss before each step, then after the last) and
`after.<adapter tensor>` (the adapter after the {STEPS} steps).{dropout_text}
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
