#!/usr/bin/env python3
"""DeepSpeed's model-state estimators, called, for tests/fit/deepspeed_estimates_test.cpp.

Writes tests/fixtures/deepspeed/estimates.json: for gpt2, llama-2-7b and llama-2-70b (their HF
configs, instantiated on the meta device: no weights are made), the parameter count and the
largest layer exactly as DeepSpeed's model_to_params counts them (shared parameters once; a
layer is one module's own parameters), and the return values of
estimate_zero2_model_states_mem_needs and estimate_zero3_model_states_mem_needs at 1, 8 and 64
GPUs (8 per node beyond one), without offload, with optimizer offload and (stage 3) with
parameter offload, each with DeepSpeed's default buffer factor of 1.5.

Run from the repository root (needs torch, transformers and deepspeed, e.g. the venv):
  /work/venv/bin/python tools/make_deepspeed_estimates.py
"""

import json
import os

import deepspeed
import torch
import transformers
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "deepspeed", "estimates.json")

MODELS = {
    # memfit's presets of the same names (graph/model_spec.cpp).
    "gpt2": transformers.GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024),
    "llama-2-7b": transformers.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                           num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                                           max_position_embeddings=4096),
    "llama-2-70b": transformers.LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                            num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                                            max_position_embeddings=4096),
}


def counts(config):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    # model_to_params dedups shared parameters by data_ptr, which is 0 for every meta tensor;
    # parameters() dedups them by identity, the same set for a real model.
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def main():
    out = {"deepspeed": deepspeed.__version__, "transformers": transformers.__version__, "models": {}}
    for name, config in MODELS.items():
        total, largest = counts(config)
        rows = []
        for gpus in (1, 8, 64):
            per_node, nodes = (1, 1) if gpus == 1 else (8, gpus // 8)
            for offload in (False, True):
                cpu, gpu = estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=offload)
                rows.append({"stage": 2, "gpus": gpus, "gpus_per_node": per_node, "nodes": nodes,
                             "offload_optimizer": offload, "offload_params": False, "host": cpu, "device": gpu})
            for offload, params in ((False, False), (True, False), (True, True)):
                cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, per_node, nodes, cpu_offload=offload,
                                                                    cpu_offload_params=params)
                rows.append({"stage": 3, "gpus": gpus, "gpus_per_node": per_node, "nodes": nodes,
                             "offload_optimizer": offload, "offload_params": params, "host": cpu, "device": gpu})
        out["models"][name] = {"params": total, "largest_layer_params": largest, "estimates": rows}
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
