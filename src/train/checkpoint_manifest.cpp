// Writing and strictly reading checkpoint manifests (see checkpoint_manifest.hpp). Errors
// name the field by its JSON path; nothing is defaulted, nothing unknown is ignored.
#include "train/checkpoint_manifest.hpp"

#include <limits>

#include "core/error.hpp"
#include "train/checkpoint_fields.hpp"
#include "train/checkpoint_files.hpp"

namespace memfit {

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxSteps = int64_t(1) << 40;
constexpr int64_t kMaxWorld = int64_t(1) << 20;
constexpr int64_t kMaxBatches = int64_t(1) << 40;
constexpr int64_t kMaxCount = std::numeric_limits<int64_t>::max();

template <typename T, typename Parse>
T parse_name(const std::string& field, const std::string& text, Parse parse) {
  try {
    return parse(text);
  } catch (const Error&) {
    refuse_field(field, fmt::format("names an unknown value '{}'", text));
  }
}

json schedule_json(const LrSchedule& s) {
  json j = {{"kind", lr_schedule_name(s.kind)}, {"lr", s.lr}, {"warmup", s.warmup}, {"min_lr", s.min_lr},
            {"decay_steps", s.decay_steps}};
  if (s.deepspeed())  // DeepSpeed's schedulers only: checkpoints of the others stay as they were
    j.update({{"warmup_min_lr", s.warmup_min_lr}, {"warmup_min_ratio", s.warmup_min_ratio},
              {"cos_min_ratio", s.cos_min_ratio}, {"linear_warmup", s.linear_warmup ? 1 : 0}});
  return j;
}

json body_json(const CheckpointManifest& m) {
  json ranks = json::array();
  for (const RankFileEntry& r : m.ranks) {
    json entry = {{"file", r.file}, {"bytes", r.bytes}, {"xxh3", checksum_hex(r.xxh3)}};
    if (m.has_layout()) {
      std::string chunks;
      for (uint64_t c : r.chunks) chunks += checksum_hex(c);
      entry.update({{"chunk_bytes", r.chunk_bytes}, {"chunks", chunks}});
    }
    ranks.push_back(std::move(entry));
  }
  json scaler = nullptr;
  if (m.loss_scaler)
    scaler = {{"scale", m.loss_scaler->scale}, {"clean", m.loss_scaler->clean}, {"skipped", m.loss_scaler->skipped},
              {"hysteresis", m.loss_scaler->hysteresis}};
  const LrSchedule& s = m.schedule;
  json loader = {{"epoch", m.loader_epoch}, {"cursor", m.loader_cursor}, {"batches_per_epoch", m.batches_per_epoch},
                 {"batches_per_step", m.batches_per_step}};
  if (m.has_layout()) loader.update({{"rows_per_batch", m.rows_per_batch}, {"shuffle", m.shuffle ? 1 : 0}});
  json body = {{"format", m.has_layout() ? kCheckpointFormat : kCheckpointFormatWithoutLayout},
          {"step", m.step},
          {"applied", m.applied},
          {"total_steps", m.total_steps},
          {"model", m.model},
          {"model_spec", m.model_spec},
          {"world_size", m.world_size},
          {"zero_stage", m.zero_stage},
          {"precision", precision_name(m.precision)},
          {"optimizer", optimizer_name(m.optimizer)},
          {"lr_schedule", schedule_json(s)},
          {"loader", loader},
          {"loss_scaler", scaler},
          {"ranks", ranks}};
  if (m.has_layout()) body["tensors"] = tensors_json(m.tensors);
  return body;
}

void read_schedule(JsonFields f, CheckpointManifest& m) {
  LrSchedule& s = m.schedule;
  s.kind = parse_name<LrScheduleKind>(f.name("kind"), f.string("kind"), parse_lr_schedule);
  s.lr = f.number("lr", 0, false);
  s.warmup = f.integer("warmup", 0, kMaxSteps);
  s.min_lr = f.number("min_lr", 0, false);
  s.decay_steps = f.integer("decay_steps", 1, kMaxSteps);
  if (s.deepspeed()) {
    s.warmup_min_lr = f.number("warmup_min_lr", 0, false);
    s.warmup_min_ratio = f.number("warmup_min_ratio", 0, false);
    s.cos_min_ratio = f.number("cos_min_ratio", 0, false);
    s.linear_warmup = f.integer("linear_warmup", 0, 1) == 1;
  }
  f.done();
  try {
    s.validate();
  } catch (const Error& e) {
    refuse_field("lr_schedule", fmt::format("is not a valid schedule: {}", e.what()));
  }
}

void read_loader(JsonFields f, CheckpointManifest& m, bool layout) {
  m.loader_epoch = f.integer("epoch", 0, kMaxSteps);
  m.loader_cursor = f.integer("cursor", 0, kMaxBatches);
  m.batches_per_epoch = f.integer("batches_per_epoch", 1, kMaxBatches);
  m.batches_per_step = f.integer("batches_per_step", 1, 1 << 20);
  if (layout) {
    m.rows_per_batch = f.integer("rows_per_batch", 1, 1 << 30);
    m.shuffle = f.integer("shuffle", 0, 1) == 1;
  }
  f.done();
}

void read_scaler(const json& v, CheckpointManifest& m) {
  if (v.is_null()) return;
  JsonFields f(v, "loss_scaler");
  LossScaler::State s;
  s.scale = f.number("scale", 0, true);
  s.clean = f.integer("clean", 0, kMaxSteps);
  s.skipped = f.integer("skipped", 0, kMaxSteps);
  s.hysteresis = int(f.integer("hysteresis", 1, std::numeric_limits<int>::max()));
  f.done();
  m.loss_scaler = s;
}

// A format 3 entry's chunk checksums: one per chunk_bytes of the file before its trailer.
void read_chunks(JsonFields& f, RankFileEntry& e) {
  e.chunk_bytes = uint64_t(f.integer("chunk_bytes", 4096, int64_t(kMaxChunkBytes)));
  const std::string hex = f.string("chunks");
  const uint64_t count = (e.bytes - 8 + e.chunk_bytes - 1) / e.chunk_bytes;
  if (hex.size() != 16 * count)
    refuse_field(f.name("chunks"), fmt::format("holds {} hex digits; {} bytes in chunks of {} need {} checksums of 16",
                                               hex.size(), e.bytes - 8, e.chunk_bytes, count));
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t h = 0;
    if (!parse_checksum_hex(std::string_view(hex).substr(size_t(16 * k), 16), h))
      refuse_field(f.name("chunks"), "must hold lowercase hex digits only");
    e.chunks.push_back(h);
  }
}

void read_ranks(const json& v, CheckpointManifest& m, bool layout) {
  if (!v.is_array()) refuse_field("ranks", "must be an array");
  if (int64_t(v.size()) != m.world_size)
    refuse_field("ranks", fmt::format("lists {} rank files for a world of {}", v.size(), m.world_size));
  for (size_t r = 0; r < v.size(); ++r) {
    JsonFields f(v[r], fmt::format("ranks[{}]", r));
    RankFileEntry e;
    e.file = f.string("file");
    if (e.file != rank_file_name(int(r), m.world_size))
      refuse_field(f.name("file"), fmt::format("is '{}', not '{}'", e.file, rank_file_name(int(r), m.world_size)));
    e.bytes = uint64_t(f.integer("bytes", layout ? 9 : 1, kMaxCount));
    if (!parse_checksum_hex(f.string("xxh3"), e.xxh3)) refuse_field(f.name("xxh3"), "must hold 16 lowercase hex digits");
    if (layout) read_chunks(f, e);
    f.done();
    m.ranks.push_back(std::move(e));
  }
}

void read_model_spec(const json& v, CheckpointManifest& m) {
  if (!v.is_object()) refuse_field("model_spec", "must be a JSON object");
  for (const auto& [key, value] : v.items())
    if (!value.is_primitive()) refuse_field("model_spec." + key, "must be a string, number or boolean");
  m.model_spec = v;
}

// Facts that tie fields together, checked once the checksum says the file is as written.
void check_consistency(const CheckpointManifest& m) {
  if (m.applied > m.step) refuse_field("applied", fmt::format("is {}, more optimizer steps than the {} steps run", m.applied, m.step));
  if (m.step > m.total_steps) refuse_field("step", fmt::format("is {}, beyond the run's total_steps {}", m.step, m.total_steps));
  if (m.loss_scaler && m.loss_scaler->skipped > m.step)
    refuse_field("loss_scaler.skipped", fmt::format("is {}, more skipped steps than the {} steps run", m.loss_scaler->skipped, m.step));
  if (m.step > kMaxBatches / m.batches_per_step)
    refuse_field("loader.batches_per_step", fmt::format("{} x {} steps overflows", m.batches_per_step, m.step));
  const auto [epoch, cursor] = loader_position_after(m.step * m.batches_per_step, m.batches_per_epoch);
  if (m.loader_epoch != epoch)
    refuse_field("loader.epoch", fmt::format("is {}; {} steps of {} batches over epochs of {} batches end in epoch {}",
                                       m.loader_epoch, m.step, m.batches_per_step, m.batches_per_epoch, epoch));
  if (m.loader_cursor != cursor)
    refuse_field("loader.cursor", fmt::format("is {}; {} steps of {} batches over epochs of {} batches end at batch {}",
                                        m.loader_cursor, m.step, m.batches_per_step, m.batches_per_epoch, cursor));
}

}  // namespace

std::string rank_file_name(int rank, int world_size) { return fmt::format("rank-{}-of-{}.bin", rank, world_size); }

std::pair<int64_t, int64_t> loader_position_after(int64_t batches, int64_t batches_per_epoch) {
  if (batches == 0) return {0, 0};
  return {(batches - 1) / batches_per_epoch, (batches - 1) % batches_per_epoch + 1};
}

std::string format_checkpoint_manifest(const CheckpointManifest& m) {
  json j = body_json(m);
  j["checksum"] = "xxh3:" + checksum_hex(checksum_of(j.dump()));
  return j.dump(2) + "\n";
}

CheckpointManifest parse_checkpoint_manifest(std::string_view text) {
  MEMFIT_CHECK(text.size() <= kMaxManifestBytes, "checkpoint", "the manifest is {} bytes, more than a manifest can be",
               text.size());
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  MEMFIT_CHECK(!j.is_discarded(), "checkpoint", "the manifest is not valid JSON");
  JsonFields top(j, "");
  const std::string format = top.string("format");
  if (format != kCheckpointFormat && format != kCheckpointFormatWithoutLayout)
    refuse_field("format", fmt::format("is '{}'; this build reads {} and {} checkpoints", format, kCheckpointFormat,
                                       kCheckpointFormatWithoutLayout));
  const bool layout = format == kCheckpointFormat;
  CheckpointManifest m;
  m.step = top.integer("step", 1, kMaxSteps);
  m.applied = top.integer("applied", 0, kMaxSteps);
  m.total_steps = top.integer("total_steps", 1, kMaxSteps);
  m.model = top.string("model");
  if (m.model.empty()) refuse_field("model", "is empty");
  read_model_spec(top.at("model_spec"), m);
  m.world_size = int(top.integer("world_size", 1, kMaxWorld));
  m.zero_stage = int(top.integer("zero_stage", 0, 3));
  m.precision = parse_name<Precision>("precision", top.string("precision"), parse_precision);
  m.optimizer = parse_name<OptimizerKind>("optimizer", top.string("optimizer"), parse_optimizer);
  read_schedule(JsonFields(top.at("lr_schedule"), "lr_schedule"), m);
  read_loader(JsonFields(top.at("loader"), "loader"), m, layout);
  read_scaler(top.at("loss_scaler"), m);
  read_ranks(top.at("ranks"), m, layout);
  if (layout) {
    m.tensors = read_tensors(top.at("tensors"), m.world_size);
    if (m.tensors.empty()) refuse_field("tensors", "is empty");
  }
  const std::string sum = top.string("checksum");
  top.done();

  uint64_t stored = 0;
  if (!sum.starts_with("xxh3:") || !parse_checksum_hex(std::string_view(sum).substr(5), stored))
    refuse_field("checksum", "must be 'xxh3:' and 16 lowercase hex digits");
  json body = j;
  body.erase("checksum");
  const uint64_t actual = checksum_of(body.dump());
  if (actual != stored)
    refuse_field("checksum", fmt::format("is {}, but the other fields hash to {} (edited or damaged)", checksum_hex(stored),
                                   checksum_hex(actual)));
  check_consistency(m);
  if (layout) {
    std::vector<uint64_t> data_bytes;
    for (const RankFileEntry& r : m.ranks) data_bytes.push_back(r.bytes - 8);
    check_shards(m.tensors, data_bytes);
  }
  return m;
}

}  // namespace memfit
