// What LoRA (graph/lora.hpp) and a quantised base (graph/quantize_base.hpp) put in a planned
// program, read back from the program itself: the adapters' value, gradient, master and
// optimizer bytes, the frozen base (quantised and not), the branch's saved tensors and the
// dequantisation tiles. The estimate plans the real program; this only names its parts.
#pragma once

#include "fit/estimate.hpp"

namespace memfit {

// Whether a policy has either (the breakdown is then part of the summary and the report).
inline bool has_lora_or_quantised_base(const Policy& p) { return p.lora.enabled() || p.quantize_base.enabled(); }

LoraBreakdown lora_breakdown(const Program& p, const Policy& policy);

// The line under a --fit proposal of LoRA (fit_search.cpp's propose_lora): what it changes
// and the flags that run it.
std::string lora_proposal_note(const Policy& p);

}  // namespace memfit
