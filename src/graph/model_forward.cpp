#include "graph/model_forward.hpp"

namespace memfit {

ModelParams declare_model_parameters(GraphBuilder& b, const ModelSpec& spec) {
  ModelParams p;
  p.arch = spec.arch;
  if (spec.arch == Arch::gpt2) {
    p.gpt2 = declare_gpt2_parameters(b, spec);
    p.classifier_weight = p.gpt2.wte;
  } else {
    p.llama = declare_llama_parameters(b, spec);
    p.classifier_weight = p.llama.lm_head;
  }
  return p;
}

TensorId model_forward(GraphBuilder& b, const ModelSpec& spec, const ModelParams& params, TensorId tokens,
                       const std::string& prefix, AttentionKind attention) {
  if (spec.arch == Arch::gpt2) return gpt2_forward(b, spec, params.gpt2, tokens, prefix, attention);
  return llama_forward(b, spec, params.llama, tokens, prefix, attention);
}

}  // namespace memfit
