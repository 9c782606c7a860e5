#include "core/system_memory.hpp"

#include <unistd.h>

#include <fstream>
#include <string>
#include <string_view>

namespace memfit {

namespace {

uint64_t meminfo_bytes(std::string_view field) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == field) return kib * 1024;
  return uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
}

}  // namespace

uint64_t available_memory_bytes() { return meminfo_bytes("MemAvailable:"); }
uint64_t total_memory_bytes() { return meminfo_bytes("MemTotal:"); }

}  // namespace memfit
