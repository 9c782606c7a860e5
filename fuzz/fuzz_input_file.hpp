// A scratch file holding one fuzz input, for readers whose entry point takes a path (they
// map the file, so a path is what they are given in real use). One per process, in /dev/shm
// when it exists, so that writing it costs a memcpy, not a disk write.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace memfit::fuzz {

inline const std::string& input_path(const char* suffix) {
  static const std::string path = [&] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/memfit-fuzz-" + std::to_string(getpid()) + suffix;
  }();
  return path;
}

inline const std::string& write_input(const uint8_t* data, size_t size, const char* suffix) {
  const std::string& path = input_path(suffix);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace memfit::fuzz
