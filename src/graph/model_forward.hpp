// One entry point for every architecture the builder knows: declare the parameters, emit a
// forward pass, and name the weight the classifier multiplies by (the token embedding when
// tied, else lm_head). training_program.cpp uses only this, so adding an architecture never
// touches the step program's structure.
#pragma once

#include <string>

#include "graph/gpt2.hpp"
#include "graph/llama.hpp"

namespace memfit {

struct ModelParams {
  Arch arch = Arch::gpt2;
  Gpt2Params gpt2;
  LlamaParams llama;
  TensorId classifier_weight = kNoTensor;
};

ModelParams declare_model_parameters(GraphBuilder& b, const ModelSpec& spec);
TensorId model_forward(GraphBuilder& b, const ModelSpec& spec, const ModelParams& params, TensorId tokens,
                       const std::string& prefix, AttentionKind attention);

}  // namespace memfit
