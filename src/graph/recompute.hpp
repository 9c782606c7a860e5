// Activation recomputation as a transformation of the step program: forward ops whose outputs
// a policy does not keep are re-emitted in the backward section, just before the first op that
// needs them, and the backward ops read the re-emitted copies. The originals then die in the
// forward pass, so the planner (which only sees liveness) sees the memory saved, and the
// re-emitted copies are counted where they live.
//
// The rule, per forward activation of a transformer block (layer >= 0):
//   - a block boundary (the residual stream leaving a block) is kept when the next block
//     keeps its input (always for the input of ln_f);
//   - inside a block: nothing is kept when the block is recomputed whole, else everything
//     except the outputs of the selected cheap ops (attention probabilities, GELU output,
//     layernorm outputs).
// Everything outside the blocks (embedding, ln_f, the loss) is always kept. Recomputing a
// tensor recomputes, recursively, the non-kept tensors its producer reads, so `every:K`
// re-runs a whole segment of blocks from its kept input when the backward reaches the
// segment's last block, and later blocks of the segment reuse what that produced.
//
// Subtle point: results do not change. A re-emitted op runs the same kernel on bitwise equal
// inputs (its own inputs are kept originals or earlier re-emissions), the backward ops and
// their order of accumulation are untouched; only where bytes live changes.
#pragma once

#include <vector>

#include "graph/policy.hpp"
#include "graph/program.hpp"

namespace memfit {

// What each of `n_layer` blocks keeps under policy `r`. Throws [policy] for selective op
// names it does not know and for `auto` without a resolved choice.
std::vector<BlockRecompute> resolve_recompute(const RecomputePolicy& r, int64_t n_layer);

// K of every:sqrt: the integer nearest to sqrt(n_layer), at least 1.
int every_sqrt(int64_t n_layer);

// The program with recomputation applied to its "micro" section. Re-emitted ops have phase
// recompute, their forward op's layer and Op::replays = the forward op's index; their outputs
// are new tensors of category temporaries (they are born and die inside backward, like
// gradient temporaries; "activations" stays what forward saves for backward), named
// "<original>.rec". Other sections and all tensor ids of `program` are unchanged.
Program apply_recompute(const Program& program, const std::vector<BlockRecompute>& blocks);

// Arithmetic of the recompute ops of a program (one execution of its micro section).
double recompute_flops(const Program& program);

}  // namespace memfit
