// Sharded checkpoints (see checkpoint.hpp). A rank file is "MEMFITCK", a little-endian u64
// header length, a JSON header [{name, offset, bytes}], then the tensors' bytes back to back.
#include "train/checkpoint.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace memfit {

namespace {

constexpr char kMagic[8] = {'M', 'E', 'M', 'F', 'I', 'T', 'C', 'K'};
constexpr const char* kFormat = "memfit-checkpoint-1";

bool checkpointed(const TensorDesc& t) {
  return !t.is_view() && t.lifetime == Lifetime::persistent && t.bytes() > 0 &&
         (t.category == Category::parameters || t.category == Category::master_weights ||
          t.category == Category::optimizer_state);
}

uint64_t fnv1a(uint64_t h, const std::byte* data, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) h = (h ^ uint64_t(data[i])) * 0x100000001b3ull;
  return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

std::string rank_file(int rank, int world) { return fmt::format("rank-{}-of-{}.bin", rank, world); }

void write_atomically(const std::filesystem::path& path, const std::string& header, const Executor& ex,
                      const std::vector<TensorId>& ids) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MEMFIT_CHECK(out.good(), "checkpoint", "cannot write '{}'", tmp.string());
    out.write(kMagic, sizeof kMagic);
    const uint64_t len = header.size();
    out.write(reinterpret_cast<const char*>(&len), sizeof len);
    out.write(header.data(), std::streamsize(header.size()));
    for (TensorId id : ids)
      out.write(reinterpret_cast<const char*>(ex.data(id)), std::streamsize(ex.program().tensor(id).bytes()));
    out.flush();
    MEMFIT_CHECK(out.good(), "checkpoint", "writing '{}' failed (disk full?)", tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

nlohmann::json scaler_json(const std::optional<LossScaler::State>& s) {
  if (!s) return nullptr;
  return {{"scale", s->scale}, {"clean", s->clean}, {"skipped", s->skipped}, {"hysteresis", s->hysteresis}};
}

}  // namespace

void save_checkpoint(const std::string& dir, const Executor& ex, const std::string& model, const Policy& policy,
                     const TrainingPosition& at, Communicator& comm) {
  const Program& p = ex.program();
  const int rank = comm.rank(), world = comm.size();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MEMFIT_CHECK(std::filesystem::is_directory(dir), "checkpoint", "cannot create the directory '{}'", dir);
  std::vector<TensorId> ids;
  nlohmann::json header = nlohmann::json::array();
  uint64_t offset = 0, hash = kFnvBasis;
  for (size_t id = 0; id < p.tensors().size(); ++id) {
    const TensorDesc& t = p.tensors()[id];
    if (!checkpointed(t)) continue;
    ids.push_back(TensorId(id));
    header.push_back({{"name", t.name}, {"offset", offset}, {"bytes", t.bytes()}});
    offset += t.bytes();
    hash = fnv1a(hash, ex.data(TensorId(id)), t.bytes());
  }
  write_atomically(std::filesystem::path(dir) / rank_file(rank, world), header.dump(), ex, ids);

  // Every rank's file is in place before the manifest names them.
  int32_t mine[4] = {int32_t(hash & 0xffffffffu), int32_t(hash >> 32), int32_t(offset & 0xffffffffu),
                     int32_t(offset >> 32)};
  std::vector<int32_t> all(size_t(4 * world));
  comm.all_gather(mine, all.data(), 4, DType::i32);
  if (rank == 0) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      auto u64 = [&](int i) { return uint64_t(uint32_t(all[size_t(4 * r + i)])) | uint64_t(uint32_t(all[size_t(4 * r + i + 1)])) << 32; };
      ranks.push_back({{"file", rank_file(r, world)}, {"fnv1a", u64(0)}, {"data_bytes", u64(2)}});
    }
    const nlohmann::json manifest = {{"format", kFormat},
                                     {"model", model},
                                     {"world_size", world},
                                     {"zero_stage", policy.zero_stage},
                                     {"step", at.step},
                                     {"applied", at.applied},
                                     {"loader", {{"epoch", at.loader_epoch}, {"cursor", at.loader_cursor}}},
                                     {"loss_scaler", scaler_json(at.scaler)},
                                     {"ranks", ranks}};
    const std::filesystem::path path = std::filesystem::path(dir) / "manifest.json";
    const std::string tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << manifest.dump(2) << "\n";
      MEMFIT_CHECK(out.good(), "checkpoint", "cannot write '{}'", tmp);
    }
    std::filesystem::rename(tmp, path);
  }
  comm.barrier();  // nobody goes on (or reads the checkpoint) before the manifest exists
}

TrainingPosition load_checkpoint(const std::string& dir, Executor& ex, const std::string& model, const Policy& policy,
                                 Communicator& comm) {
  const Program& p = ex.program();
  const int rank = comm.rank(), world = comm.size();
  const std::filesystem::path mpath = std::filesystem::path(dir) / "manifest.json";
  std::ifstream min(mpath);
  MEMFIT_CHECK(min.good(), "checkpoint", "'{}' has no manifest.json (not a checkpoint, or its save did not finish)",
               dir);
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(min);
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint", fmt::format("'{}' is not valid JSON: {}", mpath.string(), e.what()));
  }
  MEMFIT_CHECK(m.value("format", "") == kFormat, "checkpoint", "'{}' is not a {} manifest", mpath.string(), kFormat);
  MEMFIT_CHECK(m["world_size"].get<int>() == world, "checkpoint",
               "'{}' was written by {} ranks; resume it with the same world size (this run has {})", dir,
               m["world_size"].get<int>(), world);
  MEMFIT_CHECK(m["zero_stage"].get<int>() == policy.zero_stage, "checkpoint",
               "'{}' was written with ZeRO stage {}; this run uses stage {}", dir, m["zero_stage"].get<int>(),
               policy.zero_stage);
  MEMFIT_CHECK(m["model"].get<std::string>() == model, "checkpoint", "'{}' holds model '{}', not '{}'", dir,
               m["model"].get<std::string>(), model);
  const nlohmann::json& entry = m["ranks"][size_t(rank)];
  const std::filesystem::path rpath = std::filesystem::path(dir) / entry["file"].get<std::string>();
  std::ifstream in(rpath, std::ios::binary);
  char magic[8] = {};
  uint64_t len = 0;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(&len), sizeof len);
  MEMFIT_CHECK(in.good() && std::memcmp(magic, kMagic, sizeof magic) == 0 && len < (uint64_t(1) << 30), "checkpoint",
               "'{}' is not a memfit rank file", rpath.string());
  std::string htext(len, '\0');
  in.read(htext.data(), std::streamsize(len));
  const nlohmann::json header = nlohmann::json::parse(htext, nullptr, false);
  MEMFIT_CHECK(in.good() && header.is_array(), "checkpoint", "'{}' has a damaged header", rpath.string());
  size_t expected = 0;
  for (const TensorDesc& t : p.tensors()) expected += checkpointed(t) ? 1 : 0;
  MEMFIT_CHECK(header.size() == expected, "checkpoint", "'{}' holds {} tensors; this run's program has {}",
               rpath.string(), header.size(), expected);
  uint64_t hash = kFnvBasis, total = 0;
  for (const auto& h : header) {
    const std::string name = h["name"].get<std::string>();
    const TensorId id = p.find_tensor(name);
    MEMFIT_CHECK(id != kNoTensor && checkpointed(p.tensor(id)) && p.tensor(id).bytes() == h["bytes"].get<uint64_t>(),
                 "checkpoint", "'{}': tensor '{}' ({} bytes) does not match this run's program", rpath.string(), name,
                 h["bytes"].get<uint64_t>());
    in.read(reinterpret_cast<char*>(ex.data(id)), std::streamsize(p.tensor(id).bytes()));
    MEMFIT_CHECK(in.good(), "checkpoint", "'{}' ends inside tensor '{}'", rpath.string(), name);
    hash = fnv1a(hash, ex.data(id), p.tensor(id).bytes());
    total += p.tensor(id).bytes();
  }
  MEMFIT_CHECK(hash == entry["fnv1a"].get<uint64_t>() && total == entry["data_bytes"].get<uint64_t>(), "checkpoint",
               "'{}' does not match the checksum its manifest lists (damaged or from another save)", rpath.string());

  TrainingPosition at;
  at.step = m["step"].get<int64_t>();
  at.applied = m["applied"].get<int64_t>();
  at.loader_epoch = m["loader"]["epoch"].get<int64_t>();
  at.loader_cursor = m["loader"]["cursor"].get<int64_t>();
  if (!m["loss_scaler"].is_null()) {
    const auto& s = m["loss_scaler"];
    at.scaler = LossScaler::State{s["scale"].get<double>(), s["clean"].get<int64_t>(), s["skipped"].get<int64_t>(),
                                  s["hysteresis"].get<int>()};
  }
  comm.barrier();
  return at;
}

}  // namespace memfit
