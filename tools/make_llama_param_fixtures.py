"""Parameter names and shapes of small Llama, Mistral and Qwen2 models as HF transformers
builds them (on the meta device: no weights), for tests/graph/llama_program_test.cpp.

Writes tests/fixtures/llama_family_params/<family>.json: {"config": config.json keys,
"parameters": {name: shape}, "total": parameter count}. memfit's builder must declare the
same tensors (q, k and v concatenated into one qkv projection) and the same total.
Run: /opt/torchenv/bin/python tools/make_llama_param_fixtures.py
"""
import json
import os

import torch
import transformers

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "llama_family_params")

# Small shapes with grouped-query attention; qwen2 ties its embeddings and has q/k/v biases.
CONFIGS = {
    "llama": dict(model_type="llama", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  hidden_size=64, intermediate_size=176, vocab_size=320, max_position_embeddings=128,
                  rms_norm_eps=1e-5, tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                    hidden_size=128, intermediate_size=256, vocab_size=512, max_position_embeddings=256,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=64),
    "qwen2": dict(model_type="qwen2", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  hidden_size=64, intermediate_size=160, vocab_size=384, max_position_embeddings=128,
                  rms_norm_eps=1e-6, tie_word_embeddings=True),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for family, keys in CONFIGS.items():
        config = transformers.AutoConfig.for_model(**keys)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        params = {name: list(p.shape) for name, p in model.named_parameters()}  # tied weights once
        total = sum(p.numel() for p in model.parameters())
        with open(os.path.join(OUT, family + ".json"), "w") as f:
            json.dump({"config": keys, "parameters": params, "total": total}, f, indent=1, sort_keys=True)
        print(family, total, len(params), "tensors")


if __name__ == "__main__":
    main()
