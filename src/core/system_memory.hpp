// This machine's memory, from /proc/meminfo: what a run may use by default (available) and
// what the "cpu" hardware preset has (total). Outside Linux, or when /proc is not mounted,
// both fall back to the physical memory sysconf reports.
#pragma once

#include <cstdint>

namespace memfit {

uint64_t available_memory_bytes();  // MemAvailable
uint64_t total_memory_bytes();      // MemTotal

}  // namespace memfit
