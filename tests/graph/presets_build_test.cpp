// Every preset builds and plans, in process and through the CLI. gpt2-xl once crashed
// `memfit plan`: builder functions held references into the tensor table across
// add_tensor, which reallocates it; whether that bites depends on the table's size and the
// heap's state, so only some models hit it (gpt2-xl in a fresh process did, every time).
#include <gtest/gtest.h>

#include "graph/training_program.hpp"
#include "plan/memory_plan.hpp"
#include "support/run_cli.hpp"
#include "kernels/backend.hpp"

namespace memfit {
namespace {

TEST(Presets, EveryPresetBuildsAndPlans) {
  for (const std::string& name : model_preset_names()) {
    const ModelSpec spec = model_preset(name);
    Policy pol;
    pol.batch = 1;
    pol.seq = 64;
    const Program p = build_training_program(spec, pol, {}, cpu_capabilities());
    EXPECT_EQ(p.parameter_count(), spec.parameter_count()) << name;
    const MemoryPlan plan = plan_memory(p);
    EXPECT_GT(plan.tier(Tier::device).peak_bytes, uint64_t(p.parameter_count()) * 12) << name;
    const auto r = test::run_memfit("plan --model " + name + " --batch 1 --seq 64");
    EXPECT_EQ(r.status, 0) << name << ": " << r.err;
  }
}

}  // namespace
}  // namespace memfit
