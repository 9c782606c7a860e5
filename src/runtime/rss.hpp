// The process's resident memory, read from /proc/self/statm with plain system calls into a
// stack buffer: it can be sampled between steps without allocating (an allocation there
// would be the very thing being measured).
#pragma once

#include <cstdint>

namespace memfit {

uint64_t resident_set_bytes();  // 0 when /proc is not available
uint64_t peak_resident_set_bytes();  // the process's high-water RSS so far (getrusage)

}  // namespace memfit
