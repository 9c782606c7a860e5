#include "io/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/half.hpp"
#include "io/float_convert.hpp"
#include "io/json_errors.hpp"

namespace memfit {

namespace {

using nlohmann::json;

constexpr std::string_view kPiece = "safetensors";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // HF's own limit; guards the JSON parse
constexpr std::string_view kMetadataKey = "__metadata__";

struct FileDType {
  std::string_view name;
  int bits;
  std::optional<DType> dtype;  // empty: valid safetensors dtype memfit cannot hold
};

// Every dtype the safetensors format defines, with its element size in bits.
constexpr FileDType kFileDTypes[] = {
    {"F32", 32, DType::f32},   {"BF16", 16, DType::bf16}, {"F16", 16, DType::f16},
    {"I32", 32, DType::i32},   {"I8", 8, DType::i8},      {"U8", 8, DType::u8},
    {"F64", 64, std::nullopt}, {"I64", 64, std::nullopt}, {"U64", 64, std::nullopt},
    {"U32", 32, std::nullopt}, {"I16", 16, std::nullopt}, {"U16", 16, std::nullopt},
    {"BOOL", 8, std::nullopt}, {"F8_E5M2", 8, std::nullopt}, {"F8_E4M3", 8, std::nullopt},
    {"F8_E8M0", 8, std::nullopt}, {"C64", 64, std::nullopt}, {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt}, {"F4", 4, std::nullopt},
};

const FileDType* find_file_dtype(std::string_view name) {
  for (const FileDType& d : kFileDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

std::string_view file_dtype_name(DType t) {
  for (const FileDType& d : kFileDTypes)
    if (d.dtype == t) return d.name;
  return {};
}

uint64_t read_le_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian host asserted in float_convert.cpp
  return v;
}

std::string json_type(const json& j) { return j.type_name(); }

Shape parse_shape(const json& j, const std::string& where) {
  MEMFIT_CHECK(j.is_array(), kPiece, "{}: 'shape' must be an array of non-negative integers, got {}", where,
               json_type(j));
  std::vector<int64_t> dims;
  uint64_t nonzero_product = 1;
  for (const json& d : j) {
    // nlohmann keeps non-negative integers as unsigned; negative ones and 2.0 are other types.
    MEMFIT_CHECK(d.is_number_unsigned(), kPiece, "{}: shape {} holds {}, not a non-negative integer", where,
                 j.dump(), d.dump());
    const uint64_t v = d.get<uint64_t>();
    // Every partial product must fit in int64 so that Shape::numel() cannot overflow.
    if (v != 0) {
      MEMFIT_CHECK(!__builtin_mul_overflow(nonzero_product, v, &nonzero_product) &&
                       nonzero_product <= uint64_t(std::numeric_limits<int64_t>::max()),
                   kPiece, "{}: shape {} has more elements than fit in 64 bits", where, j.dump());
    }
    dims.push_back(int64_t(v));
  }
  return Shape(std::move(dims));
}

std::map<std::string, std::string> parse_metadata(const json& j, const std::string& path) {
  MEMFIT_CHECK(j.is_object(), kPiece, "{}: '__metadata__' must be an object of strings, got {}", path,
               json_type(j));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : j.items()) {
    MEMFIT_CHECK(value.is_string(), kPiece, "{}: '__metadata__' value of '{}' must be a string, got {}", path, key,
                 json_type(value));
    metadata.emplace(key, value.get<std::string>());
  }
  return metadata;
}

SafetensorsEntry parse_entry(const std::string& name, const json& j, uint64_t data_size, const std::string& path) {
  const std::string where = fmt::format("{}: tensor '{}'", path, name);
  MEMFIT_CHECK(j.is_object(), kPiece, "{}: must be an object with dtype, shape and data_offsets, got {}", where,
               json_type(j));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    MEMFIT_CHECK(j.contains(key), kPiece, "{}: missing '{}'", where, key);

  SafetensorsEntry e;
  e.name = name;
  const json& dtype = j["dtype"];
  MEMFIT_CHECK(dtype.is_string(), kPiece, "{}: 'dtype' must be a string, got {}", where, json_type(dtype));
  e.file_dtype = dtype.get<std::string>();
  const FileDType* file_dtype = find_file_dtype(e.file_dtype);
  MEMFIT_CHECK(file_dtype, kPiece, "{}: unknown dtype '{}'", where, e.file_dtype);
  e.supported = file_dtype->dtype.has_value();
  e.dtype = file_dtype->dtype.value_or(DType::u8);
  e.shape = parse_shape(j["shape"], where);

  const json& offsets = j["data_offsets"];
  MEMFIT_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                   offsets[1].is_number_unsigned(),
               kPiece, "{}: 'data_offsets' must be [begin, end] with non-negative integers, got {}", where,
               offsets.dump());
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  MEMFIT_CHECK(e.begin <= e.end, kPiece, "{}: data_offsets [{}, {}] end before they begin", where, e.begin, e.end);
  MEMFIT_CHECK(e.end <= data_size, kPiece,
               "{}: data_offsets [{}, {}] run past the end of the data section ({} bytes; file truncated?)", where,
               e.begin, e.end, data_size);

  // numel < 2^63 (parse_shape) and bits <= 64: the product fits in 128 bits, not always in 64.
  const unsigned __int128 bits = (unsigned __int128)uint64_t(e.shape.numel()) * unsigned(file_dtype->bits);
  MEMFIT_CHECK(bits / 8 <= data_size, kPiece, "{}: shape {} of {} needs more bytes than the data section holds ({})",
               where, e.shape.to_string(), e.file_dtype, data_size);
  MEMFIT_CHECK(bits % 8 == 0, kPiece, "{}: {} elements of {} do not fill whole bytes", where, e.shape.numel(),
               e.file_dtype);
  MEMFIT_CHECK(bits / 8 == e.bytes(), kPiece,
               "{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {} bytes", where,
               e.shape.to_string(), e.file_dtype, uint64_t(bits / 8), e.begin,
               e.end, e.bytes());
  return e;
}

template <DType From>
float load_f32(const std::byte* src, int64_t i) {
  if constexpr (From == DType::f32) {
    float v;
    std::memcpy(&v, src + 4 * i, 4);
    return v;
  } else {
    typename StorageOf<From>::type x;
    std::memcpy(&x, src + 2 * i, 2);
    return widen(x);
  }
}

// dst[j, i] = src[i, j] for src [rows, cols]; tiled so that both sides stay in cache.
// rows_done(r) is told after source rows [0, r) have been read.
template <DType From, class RowsDone>
void transpose_to_f32(const std::byte* src, int64_t rows, int64_t cols, float* dst, RowsDone&& rows_done) {
  constexpr int64_t kTile = 64;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[j * rows + i] = load_f32<From>(src, i * cols + j);
    }
    rows_done(i1);
  }
}

// Elements widened between two releases of the file's pages: small enough that the mapped
// pages add little to RSS, large enough that madvise costs nothing next to the copy.
constexpr int64_t kReleaseChunkElements = int64_t(1) << 20;

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : file_(MappedFile::open(path, kPiece)) {
  const uint64_t size = file_.size();
  MEMFIT_CHECK(size >= 8, kPiece, "{}: {} bytes is too short for a safetensors file (8-byte header length missing)",
               path, size);
  const uint64_t header_bytes = read_le_u64(file_.data());
  MEMFIT_CHECK(header_bytes <= size - 8, kPiece,
               "{}: header length {} runs past the end of the file ({} bytes after the length; truncated or "
               "not a safetensors file)",
               path, header_bytes, size - 8);
  MEMFIT_CHECK(header_bytes <= kMaxHeaderBytes, kPiece, "{}: header length {} exceeds the limit of {} bytes", path,
               header_bytes, kMaxHeaderBytes);
  data_start_ = 8 + header_bytes;
  const uint64_t data_size = size - data_start_;

  // The header is at most three levels deep (root, tensor, shape); refusing anything deeper
  // keeps a hostile header from building a deep tree. Duplicate names are refused here
  // because the parsed object keeps only the last one.
  std::set<std::string> names;
  const auto guard = [&](int depth, json::parse_event_t event, json& parsed) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth > 2)
      throw Error(kPiece, fmt::format("{}: header nests deeper than a safetensors header can", path));
    if (event == json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second)
      throw Error(kPiece, fmt::format("{}: header names tensor '{}' twice", path, parsed.get<std::string>()));
    return true;
  };
  const char* header_text = reinterpret_cast<const char*>(file_.data() + 8);
  // The format requires the JSON to start at once; HF pads only at the end, with spaces.
  MEMFIT_CHECK(header_bytes > 0 && header_text[0] == '{', kPiece,
               "{}: header does not start with '{{' (header length field {}; not a safetensors file?)", path,
               header_bytes);
  json header;
  try {
    header = json::parse(header_text, header_text + header_bytes, guard);
  } catch (const json::exception& e) {
    throw Error(kPiece, fmt::format("{}: header is not valid JSON: {}", path, printable_error_text(e)));
  }
  MEMFIT_CHECK(header.is_object(), kPiece, "{}: header must be a JSON object, got {}", path, json_type(header));

  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      metadata_ = parse_metadata(value, path);
      continue;
    }
    entries_.push_back(parse_entry(name, value, data_size, path));
  }
  std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
  check_data_fully_indexed(path, data_size);
}

// The format requires the tensors to tile the data section: sorted by offset, each begins
// where the previous ends and the last ends at the end of the file. This is what catches a
// header length a few bytes off (the JSON padding still parses, and every tensor would be
// read shifted), trailing bytes, holes, and overlaps.
void SafetensorsReader::check_data_fully_indexed(const std::string& path, uint64_t data_size) const {
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : entries_) {
    MEMFIT_CHECK(e.begin >= covered, kPiece, "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path,
                 previous ? previous->name : "", previous ? previous->begin : 0, previous ? previous->end : 0,
                 e.name, e.begin, e.end);
    MEMFIT_CHECK(e.begin == covered, kPiece,
                 "{}: tensor '{}': data_offsets [{}, {}] leave bytes [{}, {}) of the data section to no tensor "
                 "(safetensors data must be contiguous)", path, e.name, e.begin, e.end, covered, e.begin);
    covered = e.end;
    previous = &e;
  }
  MEMFIT_CHECK(covered == data_size, kPiece,
               "{}: the tensors cover {} bytes but the data section holds {}: {} bytes belong to no tensor "
               "(header length field {} is wrong, or trailing bytes follow the data)", path, covered, data_size,
               data_size - covered, data_start_ - 8);
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsReader::entry_or_throw(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  MEMFIT_CHECK(e, kPiece, "{}: no tensor named '{}'", path(), name);
  return *e;
}

const std::byte* SafetensorsReader::data(const SafetensorsEntry& entry) const {
  MEMFIT_CHECK(entry.supported, kPiece, "{}: tensor '{}' has dtype {}, which memfit does not support (supported: "
               "F32, BF16, F16, I32, I8, U8)", path(), entry.name, entry.file_dtype);
  const SafetensorsEntry* own = find(entry.name);
  MEMFIT_ASSERT(own && own->begin == entry.begin && own->end == entry.end,
                "entry '{}' does not come from {}", entry.name, path());
  return file_.data() + data_start_ + entry.begin;
}

const SafetensorsEntry& SafetensorsReader::float_entry_or_throw(std::string_view name, const Shape& expected) const {
  const SafetensorsEntry& e = entry_or_throw(name);
  MEMFIT_CHECK(e.supported && dtype_is_float(e.dtype), kPiece,
               "{}: tensor '{}' has dtype {}; only F32, BF16 and F16 can be read as fp32", path(), e.name,
               e.file_dtype);
  MEMFIT_CHECK(e.shape == expected, kPiece, "{}: tensor '{}' has shape {}, expected {}", path(), e.name,
               e.shape.to_string(), expected.to_string());
  return e;
}

void SafetensorsReader::read_f32(std::string_view name, const Shape& expected, float* dst, bool transpose2d) const {
  const SafetensorsEntry& e = float_entry_or_throw(name, expected);
  const std::byte* src = data(e);
  // The weights live on in dst: the file's pages are given back as they are copied, so that
  // loading adds at most one chunk of mapped pages to RSS, not the whole file.
  const uint64_t file_begin = data_start_ + e.begin;
  const int bytes_per_element = dtype_bits(e.dtype) / 8;
  if (!transpose2d) {
    for (int64_t done = 0; done < e.shape.numel();) {
      const int64_t n = std::min(kReleaseChunkElements, e.shape.numel() - done);
      widen_to_f32(e.dtype, src + done * bytes_per_element, dst + done, n);
      done += n;
      file_.drop_pages(file_begin, uint64_t(done * bytes_per_element));
    }
    return;
  }
  MEMFIT_CHECK(e.shape.rank() == 2, kPiece, "{}: tensor '{}' has shape {}; only 2-d tensors can be transposed",
               path(), e.name, e.shape.to_string());
  const int64_t rows = e.shape[0], cols = e.shape[1];
  const auto rows_done = [&](int64_t r) { file_.drop_pages(file_begin, uint64_t(r * cols * bytes_per_element)); };
  switch (e.dtype) {
    case DType::f32: transpose_to_f32<DType::f32>(src, rows, cols, dst, rows_done); break;
    case DType::bf16: transpose_to_f32<DType::bf16>(src, rows, cols, dst, rows_done); break;
    case DType::f16: transpose_to_f32<DType::f16>(src, rows, cols, dst, rows_done); break;
    default: MEMFIT_ASSERT(false, "non-float dtype passed the check");
  }
}

void SafetensorsReader::read_f32_range(std::string_view name, const Shape& expected, int64_t first,
                                       std::span<float> dst) const {
  const SafetensorsEntry& e = float_entry_or_throw(name, expected);
  MEMFIT_CHECK(first >= 0 && first <= e.shape.numel() && int64_t(dst.size()) <= e.shape.numel() - first, kPiece,
               "{}: elements [{}, {}) lie outside tensor '{}' of {}", path(), first, first + int64_t(dst.size()),
               e.name, e.shape.numel());
  const int bytes_per_element = dtype_bits(e.dtype) / 8;
  widen_to_f32(e.dtype, data(e) + first * bytes_per_element, dst.data(), int64_t(dst.size()));
  file_.drop_pages(data_start_ + e.begin, uint64_t((first + int64_t(dst.size())) * bytes_per_element));
}

void write_safetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Everything is checked before the temporary file is created.
  std::set<std::string_view> names;
  for (const SafetensorsTensor& t : tensors) {
    MEMFIT_CHECK(!t.name.empty() && t.name != kMetadataKey, kPiece, "{}: invalid tensor name '{}'", path, t.name);
    MEMFIT_CHECK(names.insert(t.name).second, kPiece, "{}: tensor '{}' given twice", path, t.name);
    MEMFIT_CHECK(!file_dtype_name(t.dtype).empty(), kPiece,
                 "{}: tensor '{}' has dtype {}, which safetensors cannot store (store packed nf4 as U8)", path,
                 t.name, dtype_name(t.dtype));
    MEMFIT_CHECK(t.data || t.produce || dtype_bytes(t.dtype, t.shape.numel()) == 0, kPiece,
                 "{}: tensor '{}' {} has no data",
                 path, t.name, t.shape.to_string());
  }

  // HF order: larger elements first, then by name; with no gaps this keeps every tensor
  // aligned to its element size, given the 8-aligned start of the data section.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int bits_a = dtype_bits(tensors[a].dtype), bits_b = dtype_bits(tensors[b].dtype);
    return bits_a != bits_b ? bits_a > bits_b : tensors[a].name < tensors[b].name;
  });

  json header = json::object();
  uint64_t offset = 0;
  for (size_t i : order) {
    const SafetensorsTensor& t = tensors[i];
    const uint64_t bytes = dtype_bytes(t.dtype, t.shape.numel());
    header[t.name] = {{"dtype", file_dtype_name(t.dtype)}, {"shape", t.shape.dims()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw Error(kPiece, fmt::format("{}: a tensor name or metadata string is not valid UTF-8: {}", path,
                                    printable_error_text(e)));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  MEMFIT_CHECK(text.size() <= kMaxHeaderBytes, kPiece, "{}: header of {} bytes exceeds the limit of {} bytes", path,
               text.size(), kMaxHeaderBytes);

  AtomicFileWriter out(path, kPiece);
  const uint64_t header_bytes = text.size();
  out.write(&header_bytes, 8);
  out.write(text.data(), text.size());
  for (size_t i : order) {
    const SafetensorsTensor& t = tensors[i];
    const uint64_t bytes = dtype_bytes(t.dtype, t.shape.numel());
    if (t.data || !t.produce) {
      out.write(t.data, bytes);
      continue;
    }
    uint64_t emitted = 0;
    t.produce([&](std::span<const std::byte> piece) {
      MEMFIT_CHECK(emitted + piece.size() <= bytes, kPiece, "{}: tensor '{}' produced more than its {} bytes", path,
                   t.name, bytes);
      out.write(piece.data(), piece.size());
      emitted += piece.size();
    });
    MEMFIT_CHECK(emitted == bytes, kPiece, "{}: tensor '{}' produced {} of its {} bytes", path, t.name, emitted, bytes);
  }
  out.commit();
}

}  // namespace memfit
