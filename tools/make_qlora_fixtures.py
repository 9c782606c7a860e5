#!/usr/bin/env python3
"""Regenerate tests/fixtures/qlora_llama_tiny_torch/: QLoRA as transformers + bitsandbytes + PEFT
run it on the committed llama_tiny_torch base (its model.safetensors, fp32, and batch) with the
committed PEFT adapter of lora_llama_tiny_torch (neither is copied).

For each compute dtype <d> in bf16, fp16, fp32 the base is loaded with
  AutoModelForCausalLM.from_pretrained(base, dtype=<d>, quantization_config=BitsAndBytesConfig(
      load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
      bnb_4bit_compute_dtype=<d>))
(the QLoRA recipe: the model in its compute dtype, so bnb quantises the weight rounded to <d>;
bnb leaves lm_head, the embeddings and the norms unquantised, in <d>), then
PeftModel.from_pretrained(model, adapter, is_trainable=True) (PEFT keeps the adapters in fp32).
prepare_model_for_kbit_training is not called: it would cast the norms and the head to fp32.

expected.safetensors holds, for <d>:
  <d>.loss                                mean cross-entropy of the fixture batch, on the logits
                                          widened to fp32 (as transformers' causal-LM loss does)
  <d>.dora_loss                           the same with lora_llama_dora_tiny_torch's DoRA adapter (QDoRA)
  <d>.<hf weight>.codes                   the packed NF4 codes of every quantised weight (uint8)
  <d>.<hf weight>.absmax_codes / .absmax2 / .offset
                                          its double-quantised absmax (uint8 per block, fp32 per
                                          256 blocks, fp32 [1])
The metadata lists the quantised weights ("quantised", comma-separated) and the block size.

Run from the repository root: /work/venv/bin/python tools/make_qlora_fixtures.py
(bitsandbytes' CPU path; torch on one thread: torch's fp32 mean, the double-quantisation offset,
depends on the thread count above 32768 blocks, which these weights do not reach).
"""

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
BASE, ADAPTER, OUT = FIXTURES / "llama_tiny_torch", FIXTURES / "lora_llama_tiny_torch", FIXTURES / "qlora_llama_tiny_torch"
DORA_ADAPTER = FIXTURES / "lora_llama_dora_tiny_torch"  # QDoRA: use_dora on the same quantised base
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def qlora_model(dtype, adapter=ADAPTER):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=dtype)
    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=dtype, quantization_config=config, device_map="cpu",
                                                attn_implementation="eager")
    return base, PeftModel.from_pretrained(base, adapter, is_trainable=True)


def batch_loss(model, tokens, targets):
    """The batch's mean cross-entropy in training mode, on the logits widened to fp32."""
    model.train()
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1)).detach().reshape(()).float()


def quantised_weights(base):
    import bitsandbytes as bnb

    for name, module in base.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            yield name.replace(".base_layer", "") + ".weight", module.weight  # PEFT wraps the layer


def make():
    import bitsandbytes
    import peft
    import transformers

    batch = load_file(str(BASE / "batch.safetensors"))
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    expected, names, block = {}, None, None
    for key, dtype in DTYPES.items():
        base, model = qlora_model(dtype)
        found = []
        for name, w in quantised_weights(base):
            qs = w.quant_state
            if qs.quant_type != "nf4" or not qs.nested or qs.dtype != dtype:
                sys.exit(f"{name}: not double-quantised nf4 of {dtype}: {qs.quant_type} nested={qs.nested} {qs.dtype}")
            block = qs.blocksize
            expected[f"{key}.{name}.codes"] = w.detach().reshape(-1).contiguous()
            expected[f"{key}.{name}.absmax_codes"] = qs.absmax.reshape(-1).contiguous()
            expected[f"{key}.{name}.absmax2"] = qs.state2.absmax.float().reshape(-1).contiguous()
            expected[f"{key}.{name}.offset"] = qs.offset.float().reshape(1).contiguous()
            found.append(name)
        if names is not None and names != found:
            sys.exit(f"the quantised weights differ between compute dtypes: {names} {found}")
        names = found
        expected[f"{key}.loss"] = batch_loss(model, tokens, targets)
        print(f"{key}: loss {expected[f'{key}.loss'].item():.7f}, {len(found)} quantised weights")
        expected[f"{key}.dora_loss"] = batch_loss(qlora_model(dtype, DORA_ADAPTER)[1], tokens, targets)
        print(f"{key}: QDoRA loss {expected[f'{key}.dora_loss'].item():.7f}")
    OUT.mkdir(parents=True, exist_ok=True)
    meta = {"source": f"tools/make_qlora_fixtures.py torch={torch.__version__} transformers={transformers.__version__} "
                      f"peft={peft.__version__} bitsandbytes={bitsandbytes.__version__}",
            "quantised": ",".join(names), "block": str(block)}
    save_file(expected, str(OUT / "expected.safetensors"), metadata=meta)
    (OUT / "README.md").write_text(f"""# qlora_llama_tiny_torch

QLoRA by transformers {transformers.__version__} + bitsandbytes {bitsandbytes.__version__} (CPU path) + PEFT {peft.__version__}
(PyTorch {torch.__version__}, one thread) on `tests/fixtures/llama_tiny_torch` (model, fp32 file, and batch) with the
adapter of `tests/fixtures/lora_llama_tiny_torch`, made by `tools/make_qlora_fixtures.py`.
For compute dtype bf16, fp16 and fp32: the base loaded in that dtype with BitsAndBytesConfig(load_in_4bit, nf4, double
quantisation, block {block}), PEFT's adapter on it; `expected.safetensors` holds `<dtype>.loss` (fp32 cross-entropy of
the batch), `<dtype>.dora_loss` (the same with the DoRA adapter of `tests/fixtures/lora_llama_dora_tiny_torch`) and, for each of the {len(names)} quantised weights, bnb's `codes`, `absmax_codes`, `absmax2`, `offset`.
Regenerate from the repository root: `/work/venv/bin/python tools/make_qlora_fixtures.py`.
""")
    total = sum((OUT / n).stat().st_size for n in os.listdir(OUT))
    print(f"{total:,d} bytes in {OUT}")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    make()


if __name__ == "__main__":
    main()
