// Reading and writing HF safetensors files: an 8-byte little-endian header length N, N bytes
// of JSON mapping tensor names to {dtype, shape, data_offsets}, then the data section.
//
// Invariant of SafetensorsReader: once constructed, every entry has been checked against the
// file — a known dtype, a shape whose element count matches its byte range exactly, a byte
// range inside the data section, the ranges tiling the data section exactly (no hole, overlap or
// trailing byte, as the format requires; this also catches a wrong header length) — so data() and
// read_f32 never read outside the mapping. Any violation throws [safetensors] naming the file.
// The file is mapped read-only and stays mapped for the reader's lifetime; if another
// process truncates it meanwhile, reads fault (SIGBUS): that cannot be checked in advance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "core/shape.hpp"
#include "io/mapped_file.hpp"

namespace memfit {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::u8;   // meaningful only when `supported`
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range relative to the start of the data section
  std::string file_dtype;    // as the file spells it: "F32", "BF16", "I64", ...
  // False for valid safetensors dtypes memfit has no DType for (F64, I64, I16, BOOL, F8_*,
  // ...): such tensors are validated and listed, so a file holding one (an I64 position_ids
  // buffer, say) still opens, but data() and read_f32 refuse them.
  bool supported = true;

  uint64_t bytes() const { return end - begin; }
};

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // maps and validates; throws [safetensors]

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // by offset
  const SafetensorsEntry* find(std::string_view name) const;               // nullptr when absent
  // The tensor's bytes inside the mapping: little-endian, aligned only as the file aligned
  // them (memfit's writer and HF's keep every tensor aligned to its element size).
  const std::byte* data(const SafetensorsEntry& entry) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }
  // Gives back the resident pages of a tensor the caller has copied out (MappedFile::drop_pages).
  void release(const SafetensorsEntry& entry) const { file_.drop_pages(data_start_ + entry.begin, entry.bytes()); }

  // Copies tensor `name` into dst (numel floats) as fp32, widening BF16/F16 exactly, after
  // checking that its shape equals `expected`. With transpose2d a [r, c] tensor is written as
  // [c, r] (HF GPT-2 Conv1D weights are stored [in, out]; memfit keeps linear weights
  // [out, in]); `expected` is still the shape in the file.
  void read_f32(std::string_view name, const Shape& expected, float* dst, bool transpose2d = false) const;
  // Elements [first, first + dst.size()) of tensor `name` in the file's order, as fp32, after
  // the same checks; the file's pages up to the last element read are given back, so a caller
  // reading a tensor in order through a bounded buffer adds at most one chunk to RSS.
  void read_f32_range(std::string_view name, const Shape& expected, int64_t first, std::span<float> dst) const;

 private:
  const SafetensorsEntry& entry_or_throw(std::string_view name) const;
  // The entry after checking it holds floats of shape `expected` (what read_f32* convert).
  const SafetensorsEntry& float_entry_or_throw(std::string_view name, const Shape& expected) const;
  void check_data_fully_indexed(const std::string& path, uint64_t data_size) const;

  MappedFile file_;
  uint64_t data_start_ = 0;  // 8 + N
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;  // dtype_bytes(dtype, shape.numel()) bytes, little-endian
  // Instead of `data`: called once when the tensor's bytes are due, it passes them in order,
  // in pieces of its choosing, to `emit` (a writer that streams through a bounded buffer).
  std::function<void(const std::function<void(std::span<const std::byte>)>& emit)> produce = {};
};

// Writes tensors atomically (path + ".tmp", fsync, rename over path, fsync the directory): an
// existing file at path survives any failure. Laid out as HF's writer does, so HF loads it:
// header padded with spaces to a multiple of 8 bytes, tensors stored contiguously with no gaps,
// largest element size first and then by name, so each tensor is aligned to its element size.
// A tensor given by `produce` must emit exactly its byte size. nf4 has no safetensors dtype
// and is refused (store packed nf4 as U8 with its own metadata).
void write_safetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace memfit
