// Helpers shared by the io tests: a scratch directory removed at the end of each test, raw
// file bytes in and out, and a check that a call throws one clear one-line memfit::Error.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace memfit::test {

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "memfit-io-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ignored);
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <class T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

inline std::string le_u64(uint64_t v) { return bytes_of<uint64_t>({v}); }

// Runs f, which must throw memfit::Error from `piece` with a one-line, printable message that contains
// every one of `parts`. Returns the message for further checks.
template <class F>
std::string expect_error(F&& f, std::string_view piece, std::initializer_list<std::string_view> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.piece(), piece) << message;
    EXPECT_EQ(message.rfind("[" + std::string(piece) + "] ", 0), 0u) << message;
    EXPECT_TRUE(std::all_of(message.begin(), message.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; }))
        << "not one printable line: " << message;
    for (std::string_view part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    return message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-memfit exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no memfit::Error thrown";
  return {};
}

}  // namespace memfit::test
