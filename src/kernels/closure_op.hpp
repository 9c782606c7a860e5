// A PreparedOp made of a closure over the op's bound addresses: what every backend's prepare()
// returns for a kernel that needs no state of its own beyond those captures.
#pragma once

#include <memory>
#include <utility>

#include "kernels/backend.hpp"

namespace memfit {

template <class Fn>
class ClosureOp final : public PreparedOp {
 public:
  explicit ClosureOp(Fn fn) : fn_(std::move(fn)) {}
  void run(const StepContext& ctx) override { fn_(ctx); }

 private:
  Fn fn_;
};

template <class Fn>
std::unique_ptr<PreparedOp> make_op(Fn fn) {
  return std::make_unique<ClosureOp<Fn>>(std::move(fn));
}

}  // namespace memfit
