// The communicator of a world of one: reductions are identities and gathers are copies; every
// split of it is a world of one again.
#include <cstring>

#include "core/error.hpp"
#include "dist/communicator.hpp"

namespace memfit {

namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  explicit SingleProcessCommunicator(int world_rank) : world_rank_(world_rank) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  CommTicket start_all_reduce(void*, int64_t, DType, ReduceOp) override { return 0; }
  CommTicket start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp) override {
    if (send != recv) std::memmove(recv, send, dtype_bytes(dtype, count));
    return 0;
  }
  CommTicket start_all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (send != recv) std::memmove(recv, send, dtype_bytes(dtype, count));
    return 0;
  }
  CommTicket start_broadcast(void*, int64_t, DType, int root) override {
    MEMFIT_ASSERT(root == 0, "broadcast from rank {} in a world of one", root);
    return 0;
  }
  CommTicket start_all_to_all(const void* send, void* recv, int64_t count, DType dtype) override {
    std::memmove(recv, send, dtype_bytes(dtype, count));
    return 0;
  }
  void wait(CommTicket) override {}
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SingleProcessCommunicator>(world_rank_);
  }
  int world_rank(int) const override { return world_rank_; }

 private:
  int world_rank_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator(int world_rank) {
  return std::make_unique<SingleProcessCommunicator>(world_rank);
}

}  // namespace memfit
