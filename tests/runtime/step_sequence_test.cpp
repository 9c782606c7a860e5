// The step's sections and their one sequencer (graph/program.hpp's SectionKind,
// Executor::run_step), on a hand-made program whose every op's effect is known in closed
// form: micro (x3) adds x into y, sync sets s, optimizer adds x into z. Checked: the order
// and counts of run_step, what an UpdateGate sees when it is asked (all micro-steps and sync
// done) and that a "no" skips exactly the optimizer section; the names and per-step counts of
// the kinds; and that a program may not hold two sections of one kind.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "runtime/compile.hpp"
#include "runtime/executor.hpp"

namespace memfit {
namespace {

constexpr int kMicro = 3;
constexpr int kN = 16;

struct SequenceProgram {
  Program p;
  TensorId x, y, s, z;
};

TensorId persistent(Program& p, const char* name) {
  TensorDesc d;
  d.name = name;
  d.shape = Shape{kN};
  d.lifetime = Lifetime::persistent;
  return p.add_tensor(d);
}

Op add_into(const char* name, TensorId from, TensorId to) {
  Op op;
  op.kind = OpKind::accumulate;
  op.name = name;
  op.inputs = {from};
  op.outputs = {to};
  op.modes = {WriteMode::accumulate};
  return op;
}

SequenceProgram sequence_program() {
  SequenceProgram sp;
  Program& p = sp.p;
  sp.x = persistent(p, "x");
  sp.y = persistent(p, "y");
  sp.s = persistent(p, "s");
  sp.z = persistent(p, "z");
  p.begin_section(SectionKind::micro, kMicro);
  p.add_op(add_into("y_plus_x", sp.x, sp.y));
  p.end_section();
  p.begin_section(SectionKind::sync);
  Op fill;
  fill.kind = OpKind::fill;
  fill.name = "s_is_seven";
  fill.outputs = {sp.s};
  fill.modes = {WriteMode::overwrite};
  fill.attrs = FillAttrs{7.0f};
  p.add_op(fill);
  p.end_section();
  p.begin_section(SectionKind::optimizer);
  p.add_op(add_into("z_plus_x", sp.x, sp.z));
  p.end_section();
  return sp;
}

struct RecordingGate : UpdateGate {
  bool answer = true;
  int asked = 0;
  int micro_count = 0;
  float y_seen = 0, s_seen = 0;
  const Executor* ex = nullptr;
  TensorId y = kNoTensor, s = kNoTensor;
  bool apply_update(const StepContext& ctx) override {
    ++asked;
    micro_count = ctx.micro_count;
    // Element 0 of each, read without allocating (the gate runs inside a step).
    ex->read_as<float>(y, 0, std::span<float>(&y_seen, 1));
    ex->read_as<float>(s, 0, std::span<float>(&s_seen, 1));
    return answer;
  }
};

class StepSequence : public ::testing::Test {
 protected:
  void SetUp() override {
    SequenceProgram sp = sequence_program();
    x_ = sp.x, y_ = sp.y, s_ = sp.s, z_ = sp.z;
    backend_ = make_cpu_backend();
    compiled_ = std::make_unique<CompiledProgram>(compile_program(std::move(sp.p), *backend_));
    ex_ = std::make_unique<Executor>(*compiled_, *backend_);
    std::vector<float> x(kN), zeros(kN, 0.0f), hundreds(kN, 100.0f);
    for (int i = 0; i < kN; ++i) x[size_t(i)] = float(i + 1);
    ex_->write_as<float>(x_, std::span<const float>(x));
    ex_->write_as<float>(y_, std::span<const float>(zeros));
    ex_->write_as<float>(s_, std::span<const float>(zeros));
    ex_->write_as<float>(z_, std::span<const float>(hundreds));
    gate_.ex = ex_.get();
    gate_.y = y_;
    gate_.s = s_;
  }
  float at(TensorId id, int i) const {
    float value = 0;
    ex_->read_as<float>(id, i, std::span<float>(&value, 1));
    return value;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CompiledProgram> compiled_;
  std::unique_ptr<Executor> ex_;
  TensorId x_ = kNoTensor, y_ = kNoTensor, s_ = kNoTensor, z_ = kNoTensor;
  RecordingGate gate_;
};

TEST_F(StepSequence, RunsMicroRepeatTimesThenSyncThenOptimizer) {
  EXPECT_TRUE(ex_->run_step(StepContext{}));
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(at(y_, i), float(kMicro * (i + 1))) << i;
    ASSERT_EQ(at(s_, i), 7.0f) << i;
    ASSERT_EQ(at(z_, i), 100.0f + float(i + 1)) << i;
  }
}

TEST_F(StepSequence, TheGateIsAskedOnceAfterSyncAndANoSkipsOnlyTheOptimizer) {
  gate_.answer = false;
  EXPECT_FALSE(ex_->run_step(StepContext{}, &gate_));
  EXPECT_EQ(gate_.asked, 1);
  EXPECT_EQ(gate_.micro_count, kMicro);
  EXPECT_EQ(gate_.y_seen, float(kMicro));  // every micro-step ran before the question
  EXPECT_EQ(gate_.s_seen, 7.0f);           // and the sync section
  for (int i = 0; i < kN; ++i) ASSERT_EQ(at(z_, i), 100.0f) << i;

  gate_.answer = true;
  EXPECT_TRUE(ex_->run_step(StepContext{}, &gate_));
  EXPECT_EQ(gate_.asked, 2);
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(at(y_, i), float(2 * kMicro * (i + 1))) << i;
    ASSERT_EQ(at(z_, i), 100.0f + float(i + 1)) << i;
  }
}

TEST_F(StepSequence, RunSectionRunsOneSectionOnceAndRefusesAMissingOne) {
  ex_->run_section(SectionKind::optimizer, StepContext{});
  for (int i = 0; i < kN; ++i) ASSERT_EQ(at(z_, i), 100.0f + float(i + 1)) << i;
  EXPECT_EQ(at(y_, 0), 0.0f);
  EXPECT_THROW(ex_->run_section(SectionKind::eval, StepContext{}), Error);
}

TEST(SectionKinds, NamesAndRunsPerStep) {
  const std::pair<SectionKind, std::string_view> names[] = {
      {SectionKind::micro, "micro"}, {SectionKind::sync, "sync"}, {SectionKind::optimizer, "optimizer"},
      {SectionKind::eval, "eval"}};
  for (const auto& [kind, name] : names) EXPECT_EQ(section_name(kind), name);
  EXPECT_EQ((Section{SectionKind::micro, 0, 1, 4}.runs_per_step()), 4);
  EXPECT_EQ((Section{SectionKind::sync, 0, 1, 1}.runs_per_step()), 1);
  EXPECT_EQ((Section{SectionKind::optimizer, 0, 1, 1}.runs_per_step()), 1);
  EXPECT_EQ((Section{SectionKind::eval, 0, 1, 1}.runs_per_step()), 0);
}

TEST(SectionKinds, AProgramHoldsEachKindAtMostOnce) {
  Program p;
  const TensorId y = persistent(p, "y");
  for (int twice = 0; twice < 2; ++twice) {
    p.begin_section(SectionKind::micro);
    Op fill;
    fill.kind = OpKind::fill;
    fill.name = "fill" + std::to_string(twice);
    fill.outputs = {y};
    fill.modes = {WriteMode::overwrite};
    fill.attrs = FillAttrs{1.0f};
    p.add_op(fill);
    p.end_section();
  }
  try {
    p.validate();
    FAIL() << "two micro sections validated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two 'micro' sections"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit
