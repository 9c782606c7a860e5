#!/usr/bin/env python3
"""Writes the small seed corpora of the fuzz targets (fuzz/corpus/<target>/). Run from the
repository root; the checkpoint manifest seed is copied from a checkpoint memfit wrote
(pass its manifest path as the first argument)."""
import json, os, shutil, struct, sys

root = "fuzz/corpus"

def put(target, name, data):
    os.makedirs(f"{root}/{target}", exist_ok=True)
    with open(f"{root}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def safetensors(entries, data, pad=True, metadata=None):
    header = {} if metadata is None else {"__metadata__": metadata}
    header.update(entries)
    text = json.dumps(header, separators=(",", ":"))
    if pad:
        text += " " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data

f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
put("safetensors", "mixed", safetensors({
    "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
    "b": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]},
    "h": {"dtype": "F16", "shape": [3], "data_offsets": [28, 34]},
    "s": {"dtype": "I32", "shape": [], "data_offsets": [34, 38]},
    "e": {"dtype": "U8", "shape": [0, 4], "data_offsets": [38, 38]},
    "pos": {"dtype": "I64", "shape": [2], "data_offsets": [38, 54]}},
    f32(1, 2, 3, 4, 5, 6) + struct.pack("<2H", 0x3F80, 0xC2F7) + struct.pack("<3H", 0x3C00, 1, 0xFC00) +
    struct.pack("<i", -7) + struct.pack("<2q", 0, 1), metadata={"format": "pt"}))
put("safetensors", "gpt2_names", safetensors({
    "transformer.wte.weight": {"dtype": "F32", "shape": [4, 2], "data_offsets": [0, 32]},
    "transformer.h.0.attn.c_attn.weight": {"dtype": "F32", "shape": [2, 6], "data_offsets": [32, 80]}},
    f32(*range(8)) + f32(*range(12))))
put("safetensors", "unpadded", safetensors({"x": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}},
                                           b"\x00\x3c", pad=False))

for name, src in [("gpt2_tiny", "tests/fixtures/gpt2_tiny_torch/config.json"),
                  ("llama_tiny", "tests/fixtures/llama_tiny_torch/config.json"),
                  ("qwen2_tiny", "tests/fixtures/qwen2_tiny_torch/config.json")]:
    os.makedirs(f"{root}/hf_config", exist_ok=True)
    shutil.copy(src, f"{root}/hf_config/{name}.json")
put("hf_config", "mistral_scaled.json", json.dumps({
    "model_type": "mistral", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_size": 64, "intermediate_size": 172, "vocab_size": 256, "max_position_embeddings": 256,
    "sliding_window": 128, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
    "tie_word_embeddings": True}))

put("run_config", "memfit.json", json.dumps({
    "model": "gpt2-tiny", "steps": 10, "batch": 4, "seq": 64, "lr": 3e-4, "lr_schedule": "cosine",
    "warmup_steps": 2, "precision": "bf16", "val_fraction": 0.1, "eval_every": 5, "keep_checkpoints": 2}))
put("run_config", "deepspeed.json", json.dumps({
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_batch_size": 4,
    "gradient_clipping": 1.0, "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                                       "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "zero_optimization": {"stage": 1, "overlap_comm": True, "offload_optimizer": {"device": "cpu"}},
    "data_types": {"grad_accum_dtype": "fp32"}}))

def llmc(magic, version, tokens, fmt):
    header = struct.pack("<3i", magic, version, len(tokens)) + bytes(1012)
    return header + struct.pack(f"<{len(tokens)}{fmt}", *tokens)
# The first byte picks the format: 0 auto, 1 llmc, 2 nanogpt, 3 text.
put("token_file", "llmc_gpt2", b"\x00" + llmc(20240520, 1, [50256, 464, 3290, 11], "H"))
put("token_file", "llmc_llama3", b"\x01" + llmc(20240801, 7, [128000, 791, 4062], "I"))
put("token_file", "nanogpt", b"\x02" + struct.pack("<6H", 1, 2, 3, 65535, 0, 7))
put("token_file", "text", b"\x03First Citizen:\nBefore we proceed any further, hear me speak.\n")

if len(sys.argv) > 1:
    os.makedirs(f"{root}/checkpoint_manifest", exist_ok=True)
    shutil.copy(sys.argv[1], f"{root}/checkpoint_manifest/manifest.json")
