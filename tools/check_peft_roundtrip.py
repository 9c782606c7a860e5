#!/usr/bin/env python3
"""By-hand round trip of memfit's LoRA files through PEFT and transformers (needs PyTorch, so
it is not a test; tests/train/lora_parity_test.cpp checks memfit's side).

For each LoRA fixture (tools/make_lora_fixtures.py, and make_lora_start_fixtures.py's OLoRA and
PiSSA starts, which PEFT and memfit both take again from the base on loading):
 1. memfit train loads the HF base (--load) and PEFT's adapter (--load-adapter), trains 3 AdamW
    steps on the fixture's batch (its B*T+1 tokens as the whole data set, so every step sees the
    same batch, as the fixture's PyTorch run does) and saves the adapter (--save);
 2. peft.PeftModel.from_pretrained loads that adapter onto the transformers base: its loss on
    the batch is compared with PyTorch's loss after the same 3 steps (losses_adamw[3]);
 3. memfit merge-lora writes merged weights; transformers loads them and its loss is compared
    with the PEFT model's.
Run from the repository root after building memfit:
  /work/venv/bin/python tools/check_peft_roundtrip.py [--memfit build/memfit]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_common import loss_of  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def write_tokens(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def check(family, memfit, work):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # llama_extras (rsLoRA, modules_to_save), llama_select (exclude_modules, layers_to_transform) and
    # llama_patterns (rank_pattern, alpha_pattern), llama_dora (use_dora): llama's base; gpt2_dora: gpt2's.
    # start_*: tools/make_lora_start_fixtures.py's (olora, pissa): both sides rewrite the base on loading.
    base = family.removeprefix("start_").split("_")[0]
    base_dir, adapter_dir = FIXTURES / f"{base}_tiny_torch", FIXTURES / f"lora_{family}_tiny_torch"
    batch = load_file(str(base_dir / "batch.safetensors"))
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    B, T = tokens.shape
    flat = torch.cat([tokens.reshape(-1), targets.reshape(-1)[-1:]]).tolist()
    data, saved, merged = work / f"{family}.bin", work / f"{family}_adapter", work / f"{family}_merged"
    write_tokens(data, flat)
    run = [memfit, "train", "--model", str(base_dir), "--load", str(base_dir), "--load-adapter", str(adapter_dir),
           "--data", str(data), "--val-fraction", "0", "--batch", str(B), "--seq", str(T), "--steps", "3",
           "--lr", "1e-3", "--weight-decay", "0.1", "--save", str(saved)]
    out = subprocess.run(run, check=True, capture_output=True, text=True).stdout
    print(f"{family}: memfit train: " + " | ".join(l for l in out.splitlines() if l.startswith("step")))
    expected = load_file(str(adapter_dir / "expected.safetensors"))["losses_adamw"]

    base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, saved).eval()
    with torch.no_grad():
        peft_loss = loss_of(peft_model, tokens, targets)[1].item()
    print(f"{family}: PEFT loads memfit's adapter: loss {peft_loss:.7f}, PyTorch after the same 3 steps "
          f"{expected[3].item():.7f} (rel. diff {abs(peft_loss - expected[3].item()) / expected[3].item():.2e})")

    subprocess.run([memfit, "merge-lora", "--model", str(base_dir), "--load", str(base_dir), "--adapter", str(saved),
                    "--out", str(merged)], check=True)
    merged_model = AutoModelForCausalLM.from_pretrained(merged, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        merged_loss = loss_of(merged_model.eval(), tokens, targets)[1].item()
    print(f"{family}: transformers loads merge-lora's weights: loss {merged_loss:.7f}, base + adapter in PEFT "
          f"{peft_loss:.7f} (rel. diff {abs(merged_loss - peft_loss) / peft_loss:.2e})")
    ok = abs(peft_loss - expected[3].item()) <= 1e-5 * expected[3].item() and abs(merged_loss - peft_loss) <= 1e-5 * peft_loss
    if family.startswith("start_"):
        # memfit convert-lora: the same model as a plain rank-2r LoRA of the untouched base.
        converted = work / f"{family}_converted"
        subprocess.run([memfit, "convert-lora", "--model", str(base_dir), "--load", str(base_dir), "--adapter",
                        str(saved), "--out", str(converted)], check=True)
        base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", dtype=torch.float32)
        plain = PeftModel.from_pretrained(base, converted).eval()
        if plain.peft_config["default"].init_lora_weights is not True:
            sys.exit(f"{family}: the converted adapter's init_lora_weights is not true")
        with torch.no_grad():
            plain_loss = loss_of(plain, tokens, targets)[1].item()
        print(f"{family}: PEFT loads convert-lora's rank-{plain.peft_config['default'].r} LoRA on the untouched base: "
              f"loss {plain_loss:.7f} (rel. diff to the started adapter's {abs(plain_loss - peft_loss) / peft_loss:.2e})")
        ok = ok and abs(plain_loss - peft_loss) <= 1e-5 * peft_loss
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memfit", default=str(ROOT / "build" / "memfit"))
    p.add_argument("families", nargs="*", default=["llama", "gpt2", "llama_extras", "llama_select", "llama_patterns", "llama_dora",
                                                       "gpt2_dora", "start_llama_olora", "start_llama_pissa",
                                                       "start_gpt2_pissa"])
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work:
        results = [check(f, args.memfit, Path(work)) for f in args.families]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
