// Parameter offload (see offload.hpp): stage 3's parameter shards on the host tier or on disk.
#include <map>
#include <set>

#include "core/error.hpp"
#include "graph/offload.hpp"

namespace memfit {

namespace {

class ParamOffload {
 public:
  ParamOffload(Program& p, Tier tier) : p_(p), tier_(tier) {}

  void run() {
    collect_shards();
    MEMFIT_ASSERT(!shards_.empty(), "parameter offload on a program without stage-3 parameter shards");
    for (TensorId id = 0; id < TensorId(p_.tensors().size()); ++id)
      if (shards_.count(p_.root_of(id))) p_.tensor(id).tier = tier_;
    // The host tier is memory the kernels and collectives reach: the gathers read the shards
    // and the optimizer writes them where they live.
    if (tier_ == Tier::host) return;
    rebuild();
  }

 private:
  // The persistent parameter roots stage 3's gathers read (frozen buckets' shards included).
  void collect_shards() {
    for (const Op& op : p_.ops()) {
      if (op.kind != OpKind::all_gather || op.inputs.empty()) continue;
      const TensorId root = p_.root_of(op.inputs[0]);
      const TensorDesc& t = p_.tensor(root);
      if (t.category == Category::parameters && t.lifetime == Lifetime::persistent) shards_.insert(root);
    }
  }

  bool in_shard(TensorId id) const { return id != kNoTensor && shards_.count(p_.root_of(id)) > 0; }

  // A device-tier tensor of exactly `of`'s bytes, transient: the planner places it, and the
  // transfer or kernel that fills it writes every byte (so measured == planned).
  TensorId staging_for(TensorId of, const std::string& name) {
    const TensorDesc& t = p_.tensor(of);
    TensorDesc d;
    d.name = name;
    d.shape = t.shape;
    d.dtype = t.dtype;
    d.category = Category::offload_staging;
    d.tier = Tier::device;
    d.lifetime = Lifetime::transient;
    d.layer = t.layer;
    return p_.add_tensor(std::move(d));
  }

  void rebuild() {
    const std::vector<Op> old = p_.ops();
    std::vector<Op> ops;
    std::vector<int> sections, new_index(old.size(), -1);
    for (int s = 0; s < int(p_.sections().size()); ++s) {
      const Section& sec = p_.sections()[size_t(s)];
      std::vector<Op> mine(old.begin() + sec.begin, old.begin() + sec.end);
      std::vector<int> moved(mine.size(), -1);
      std::vector<Op> out;
      if (sec.kind == SectionKind::optimizer) {
        for (const Op& op : mine) MEMFIT_ASSERT(op.replays < 0, "op '{}' replays an op in the optimizer", op.name);
        out = stage_optimizer(split_updates(std::move(mine)));
      } else {
        out = fetch_gathers(std::move(mine), moved);
      }
      for (size_t i = 0; i < moved.size(); ++i)
        if (moved[i] >= 0) new_index[size_t(sec.begin) + i] = int(ops.size()) + moved[i];
      for (Op& op : out) {
        ops.push_back(std::move(op));
        sections.push_back(s);
      }
    }
    // Recomputed ops name the forward op they replay by index: the fetches moved them.
    for (Op& op : ops)
      if (op.replays >= 0) {
        MEMFIT_ASSERT(new_index[size_t(op.replays)] >= 0, "op '{}' replays an op parameter offload moved", op.name);
        op.replays = new_index[size_t(op.replays)];
      }
    p_.replace_ops(std::move(ops), sections);
  }

  // Every gather of a shard reads a device copy, fetched before the latest earlier gather that
  // compute separates from it: one gather ahead inside a pass (in flight while the previous
  // block computes), further where gathers are adjacent (the backward's first two follow the
  // forward's last compute). `moved[i]`: where op i lands in the result.
  std::vector<Op> fetch_gathers(std::vector<Op> ops, std::vector<int>& moved) {
    std::vector<size_t> gathers;
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops[i].kind == OpKind::all_gather && in_shard(ops[i].inputs[0])) gathers.push_back(i);
    std::vector<int> computes(ops.size() + 1, 0);  // compute ops before index i
    for (size_t i = 0; i < ops.size(); ++i) computes[i + 1] = computes[i] + (ops[i].queue == Queue::compute);
    std::map<size_t, std::vector<Op>> before;  // op index -> fetches emitted just before it
    for (size_t g = 0; g < gathers.size(); ++g) {
      size_t anchor = 0;
      for (size_t k = g; k-- > 0;)
        if (computes[gathers[g]] > computes[gathers[k]]) {
          anchor = k;
          break;
        }
      Op& gather = ops[gathers[g]];
      const TensorId shard = gather.inputs[0];
      MEMFIT_ASSERT(p_.tensor(shard).bytes() == p_.tensor(p_.root_of(shard)).bytes(), "gather '{}' reads part of a shard",
                    gather.name);
      const std::string tail = gather.name.substr(gather.name.find("all_gather.") == std::string::npos
                                                      ? 0
                                                      : gather.name.find("all_gather.") + 11);
      const TensorId staging = staging_for(shard, "offload.params." + tail);
      before[gathers[anchor]].push_back(
          transfer_op(p_, "offload.in.params." + tail, shard, staging, gather.layer));
      gather.inputs[0] = staging;
    }
    std::vector<Op> out;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (auto it = before.find(i); it != before.end())
        for (Op& f : it->second) out.push_back(std::move(f));
      moved[i] = int(out.size());
      out.push_back(std::move(ops[i]));
    }
    return out;
  }

  // An update op that writes pieces of shards in place (fp32: the parameter is the update's
  // target) becomes one op per parameter, so that one piece at a time stages on the device.
  // The update is elementwise: the split computes the grouped update's bits.
  std::vector<Op> split_updates(std::vector<Op> ops) const {
    std::vector<Op> out;
    for (Op& op : ops) {
      if (!is_update_op(op)) {
        out.push_back(std::move(op));
        continue;
      }
      const UpdateSlots s = update_slots(op);
      bool names_shard = false;
      for (TensorId id : op.outputs) names_shard = names_shard || in_shard(id);
      if (!names_shard || s.n == 1) {
        out.push_back(std::move(op));
        continue;
      }
      const AdamWAttrs& group = std::get<AdamWAttrs>(op.attrs);
      double elements = 0;
      for (size_t i = 0; i < s.n; ++i) elements += double(p_.tensor(op.inputs[i]).numel());
      for (size_t i = 0; i < s.n; ++i) {
        Op one = op;
        one.name = op.name + "." + p_.tensor(op.outputs[i]).name;
        one.inputs = {op.inputs[i]};
        if (s.clips) one.inputs.push_back(op.inputs.back());
        one.outputs.clear();
        for (size_t r = 0; r < s.roles; ++r) one.outputs.push_back(op.outputs[r * s.n + i]);
        one.modes.assign(one.outputs.size(), WriteMode::update);
        AdamWAttrs& a = std::get<AdamWAttrs>(one.attrs);
        a.weight_decay = {group.weight_decay.empty() ? 0.0f : group.weight_decay[i]};
        one.flops = op.flops * double(p_.tensor(op.inputs[i]).numel()) / std::max(1.0, elements);
        one.layer = p_.tensor(op.inputs[i]).layer;
        out.push_back(std::move(one));
      }
    }
    return out;
  }

  // The optimizer's writes to shard pieces go to device staging copies: each such op's pieces
  // are read in one op ahead when the op reads them, and written out right after it.
  std::vector<Op> stage_optimizer(std::vector<Op> ops) {
    struct Staged {
      std::vector<Op> in, out;
    };
    std::vector<Staged> staged(ops.size());
    std::vector<size_t> users;  // ops naming shard pieces, in order
    std::set<TensorId> seen;
    for (size_t i = 0; i < ops.size(); ++i) {
      Op& op = ops[i];
      bool uses = false;
      auto retarget = [&](TensorId& id, bool reads) {
        if (!in_shard(id)) return;
        MEMFIT_ASSERT(seen.insert(id).second, "shard piece '{}' named by two optimizer ops", p_.tensor(id).name);
        const TensorId piece = id;
        const std::string& name = p_.tensor(piece).name;
        id = staging_for(piece, "offload.staging." + name);
        if (reads) staged[i].in.push_back(transfer_op(p_, "offload.in.params." + name, piece, id, op.layer));
        staged[i].out.push_back(transfer_op(p_, "offload.out.params." + name, id, piece, op.layer));
        uses = true;
      };
      for (TensorId& id : op.inputs) retarget(id, true);
      for (size_t j = 0; j < op.outputs.size(); ++j)
        retarget(op.outputs[j], op.modes[j] != WriteMode::overwrite);
      for (TensorId id : op.workspace) MEMFIT_ASSERT(!in_shard(id), "op '{}' uses a shard as workspace", op.name);
      if (uses) users.push_back(i);
    }
    // Op users[k]'s reads are emitted before users[k - 1] (one ahead), its writes after it.
    std::map<size_t, size_t> reads_ahead;  // op index -> the next user, whose reads go before it
    for (size_t k = 1; k < users.size(); ++k) reads_ahead[users[k - 1]] = users[k];
    std::vector<Op> out;
    auto append = [&out](std::vector<Op>& v) {
      for (Op& o : v) out.push_back(std::move(o));
    };
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!users.empty() && i == users[0]) append(staged[i].in);
      if (auto it = reads_ahead.find(i); it != reads_ahead.end()) append(staged[it->second].in);
      out.push_back(std::move(ops[i]));
      append(staged[i].out);
    }
    return out;
  }

  Program& p_;
  Tier tier_;
  std::set<TensorId> shards_;
};

}  // namespace

void apply_param_offload(Program& p, const Policy& policy) {
  if (policy.offload_params == Tier::device) return;
  const std::string why = offload_refusal(policy);
  MEMFIT_CHECK(why.empty(), "policy", "{}", why);
  ParamOffload(p, policy.offload_params).run();
}

}  // namespace memfit
