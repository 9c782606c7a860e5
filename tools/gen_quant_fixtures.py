"""Writes tests/fixtures/quant/: bitsandbytes' blockwise NF4 / FP4 / int8 quantisation of small
weight matrices with awkward values, the oracle of memfit's kernels/quant codecs and products.

Run from the repository root: /work/venv/bin/python tools/gen_quant_fixtures.py
(bitsandbytes 0.50, CPU path; torch with one thread, because torch's float sum, which makes the
double-quantisation offset, splits large tensors over threads).

Every case <c> of bnb.safetensors holds
  <c>.w                  the weight (bf16 or f32), 2-D
  <c>.<q>.codes          bnb's packed 4-bit codes (uint8, two per byte, first element high)
  <c>.<q>.absmax         fp32 absmax per block
  <c>.<q>.dequant        bnb.functional.dequantize_4bit in the weight's dtype (not for "random",
                         whose fp4 .dq.dequant is left out too)
  <c>.<q>.dq.absmax_codes / .dq.absmax2 / .dq.offset / .dq.dequant
                         the same with compress_statistics=True (double quantisation; the
                         4-bit codes are the same)
for <q> in nf4, fp4 (bnb dequantises an odd last dimension or blocks >= 2048 with torch, a
last dimension that is a multiple of 16 with its AVX-512 kernel, others with its scalar C++
kernel: "awkward" is [23, 37], "awkward32" [24, 38], "avx512_path" [16, 64]); the block size is
in the metadata (<c>.block). The int8 cases hold bnb's row-wise int8 (int8_vectorwise_quant /
_dequant), which is blockwise absmax with one row per block.
blockwise8.values / .codes / .absmax: bnb.functional.quantize_blockwise (blocks of 256).
mean<n>.values / .mean hold torch's fp32 mean of n values; mean_hashed<n>.threads<t> the mean of a
hashed sequence the test rebuilds, with torch on t threads.
The matmul cases hold x, y = F.linear(x, dequant(W)) and dy, dx = dy @ dequant(W) in bf16
(dequant(W) of the double-quantised "random" weight for mm_random_*).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import bitsandbytes.functional as bnbf
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "quant")


def bf16(a):
    return torch.tensor(np.asarray(a, dtype=np.float32)).to(torch.bfloat16)


def awkward_weight(rows, cols, seed):
    """Zeros, a block of equal values, subnormals, +-absmax ties, values next to the code
    midpoints, negative zeros; the rest normal noise."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows * cols, generator=gen) * 0.05
    w[0:64] = 0.0                                   # an all-zero block
    w[64:128] = 0.3                                 # all equal
    w[128:192] = torch.randn(64, generator=gen) * 1e-39  # subnormal block (absmax subnormal)
    w[192:256] = torch.randn(64, generator=gen)
    w[200] = 2.0
    w[201] = -2.0                                   # absmax tie of opposite signs
    w[202:210] = torch.tensor([-0.0, 1e-40, -1e-40, 0.0, 1e-38, -1e-38, 3e-39, 0.0])
    # Just above / below / on the NF4 and FP4 midpoints, scaled by the block's absmax 2.0.
    nf4 = sorted(bnbf.get_4bit_type("nf4", device="cpu").tolist())
    fp4 = sorted(bnbf.get_4bit_type("fp4", device="cpu").tolist())
    mids = [(a + b) / 2 for a, b in zip(nf4[:-1], nf4[1:])] + [(a + b) / 2 for a, b in zip(fp4[:-1], fp4[1:])]
    near = []
    for m in mids:
        x = np.float32(2.0 * m)
        near += [x, np.nextafter(x, np.float32(9)), np.nextafter(x, np.float32(-9))]
    w[210:210 + len(near)] = torch.tensor(np.array(near, dtype=np.float32))
    tail = rows * cols - (rows * cols) % 64
    w[tail:] = torch.randn(rows * cols - tail, generator=gen) * 1e-39  # partial last block, subnormal
    return w.reshape(rows, cols)


def quantize_case(tensors, meta, name, w, block, plain_dequant=True):
    meta[name + ".block"] = str(block)
    tensors[name + ".w"] = w.contiguous()
    for q in ("nf4", "fp4"):
        codes, state = bnbf.quantize_4bit(w, blocksize=block, quant_type=q)
        tensors[f"{name}.{q}.codes"] = codes.reshape(-1).contiguous()
        tensors[f"{name}.{q}.absmax"] = state.absmax.contiguous()
        if plain_dequant:  # (left out of the largest case to keep the fixture small)
            tensors[f"{name}.{q}.dequant"] = bnbf.dequantize_4bit(codes, state).contiguous()
        codes2, state2 = bnbf.quantize_4bit(w, blocksize=block, quant_type=q, compress_statistics=True)
        assert torch.equal(codes2, codes)
        tensors[f"{name}.{q}.dq.absmax_codes"] = state2.absmax.contiguous()
        tensors[f"{name}.{q}.dq.absmax2"] = state2.state2.absmax.contiguous()
        tensors[f"{name}.{q}.dq.offset"] = state2.offset.reshape(1).float().contiguous()
        tensors[f"{name}.{q}.dq.dequant"] = bnbf.dequantize_4bit(codes2, state2).contiguous()


def int8_case(tensors, meta, name, w):
    """bnb's row-wise int8: absmax per row, round(x * 127 / absmax) (ties to even)."""
    import bitsandbytes  # noqa: F401  (registers the ops)
    codes, stats, _ = torch.ops.bitsandbytes.int8_vectorwise_quant.default(w)
    tensors[name + ".w"] = w.contiguous()
    tensors[name + ".int8.codes"] = codes.contiguous()
    tensors[name + ".int8.absmax"] = stats.contiguous()
    tensors[name + ".int8.dequant"] = torch.ops.bitsandbytes.int8_vectorwise_dequant.default(codes, stats).contiguous()
    meta[name + ".block"] = str(w.shape[1])


def matmul_case(tensors, name, case, q, batch, seed):
    """y = x dequant(W)^T and dx = dy dequant(W) by torch in bf16 (fp32 accumulation)."""
    gen = torch.Generator().manual_seed(seed)
    w_dq = tensors.get(f"{case}.{q}.dequant", tensors.get(f"{case}.{q}.dq.dequant"))
    rows, cols = w_dq.shape
    x = (torch.randn(batch, cols, generator=gen)).to(torch.bfloat16)
    dy = (torch.randn(batch, rows, generator=gen)).to(torch.bfloat16)
    tensors[name + ".x"] = x
    tensors[name + ".y"] = F.linear(x, w_dq)
    tensors[name + ".dy"] = dy
    tensors[name + ".dx"] = dy @ w_dq


def main():
    torch.set_num_threads(1)
    tensors, meta = {}, {}
    # The dynamic 8-bit map of double quantisation, as quantize_blockwise uses it (its CPU kernel
    # sets entry 0 to -1.0 in place, so this is the map after a first call).
    bnbf.quantize_blockwise(torch.zeros(256), blocksize=256)
    tensors["dynamic_map"] = bnbf.name2qmap["dynamic"].clone()

    quantize_case(tensors, meta, "awkward", awkward_weight(23, 37, 1).to(torch.bfloat16), 64)
    quantize_case(tensors, meta, "awkward32", awkward_weight(24, 38, 2).to(torch.bfloat16), 32)
    quantize_case(tensors, meta, "awkward_f32", awkward_weight(24, 40, 3), 64)
    # A last dimension that is a multiple of 16 takes bnb's AVX-512 dequantisation kernel.
    quantize_case(tensors, meta, "avx512_path", awkward_weight(16, 64, 4).to(torch.bfloat16), 64)
    quantize_case(tensors, meta, "avx512_path_f32", awkward_weight(8, 64, 5), 32)
    gen = torch.Generator().manual_seed(7)
    quantize_case(tensors, meta, "random", (torch.randn(72, 232, generator=gen) * 0.02).to(torch.bfloat16), 64,
                  plain_dequant=False)
    quantize_case(tensors, meta, "big_block", (torch.randn(40, 130, generator=gen)).to(torch.bfloat16), 4096)
    quantize_case(tensors, meta, "block128", (torch.randn(24, 100, generator=gen)).to(torch.bfloat16), 128)

    int8_w = torch.randn(12, 64, generator=gen) * 0.1
    int8_w[3] = 0.25                     # equal values: every code 127
    int8_w[4, 5] = 1.0                   # one outlier
    int8_w[5, :] = torch.tensor([(k + 0.5) / 127 for k in range(64)])  # near-halfway cases
    # Exact halfway cases: absmax 127 makes the scale fl(1/127) * 127 = 1, so x * scale = k + 0.5.
    int8_w[6, :] = torch.tensor([127.0] + [(k + 0.5) * (1 if k % 2 else -1) for k in range(63)])
    int8_case(tensors, meta, "int8", int8_w.to(torch.bfloat16))

    # bnb's 8-bit dynamic blockwise quantisation (the second level of double quantisation) on
    # values exactly on, and next to, the midpoints between map entries (absmax 1).
    dyn = tensors["dynamic_map"].numpy()
    probe = [np.float32(1.0)]
    for i in range(0, 255, 3):
        mid = np.float32((dyn[i] + dyn[i + 1]) / np.float32(2))
        probe += [mid, np.nextafter(mid, np.float32(2)), np.nextafter(mid, np.float32(-2))]
    probe = torch.tensor(np.array(probe, dtype=np.float32))
    values = torch.cat([probe, torch.randn(512 - probe.numel(), generator=gen)])
    codes8, state8 = bnbf.quantize_blockwise(values, blocksize=256)
    tensors["blockwise8.values"] = values
    tensors["blockwise8.codes"] = codes8
    tensors["blockwise8.absmax"] = state8.absmax

    # torch's fp32 mean (the double-quantisation offset) for sizes across its summation paths.
    for n in (3, 7, 8, 9, 15, 16, 17, 33, 64, 100, 257, 515, 1000, 2100):
        v = torch.rand(n, generator=gen) * 3.0
        tensors[f"mean{n}.values"] = v
        tensors[f"mean{n}.mean"] = v.mean().reshape(1)

    # Above 32768 values torch splits its sum over threads: the mean of a hashed sequence
    # (values_i = fl(fl(fl(u32(i * 2654435761)) * 2^-32) * 3), rebuilt by the test) for several
    # sizes and thread counts.
    for n in (32768, 40000, 70001, 262144):
        idx = np.arange(n, dtype=np.uint64)
        h = ((idx * np.uint64(2654435761)) % np.uint64(2**32)).astype(np.uint32)
        v = (h.astype(np.float32) * np.float32(2.0**-32)) * np.float32(3.0)
        for threads in (1, 2, 3, 8):
            torch.set_num_threads(threads)
            tensors[f"mean_hashed{n}.threads{threads}"] = torch.from_numpy(v).mean().reshape(1)
    torch.set_num_threads(1)

    matmul_case(tensors, "mm_awkward", "awkward", "nf4", 5, 11)
    matmul_case(tensors, "mm_random_nf4", "random", "nf4", 6, 12)
    matmul_case(tensors, "mm_random_fp4", "random", "fp4", 6, 13)
    del tensors["random.fp4.dq.dequant"]  # used above; left out to keep the fixture small

    os.makedirs(OUT, exist_ok=True)
    meta["made_by"] = "tools/gen_quant_fixtures.py"
    meta["versions"] = json.dumps({"torch": torch.__version__, "bitsandbytes": __import__("bitsandbytes").__version__})
    path = os.path.join(OUT, "bnb.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    print(f"wrote {path}: {os.path.getsize(path)} bytes, {len(tensors)} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
