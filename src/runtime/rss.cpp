#include "runtime/rss.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

namespace memfit {

uint64_t resident_set_bytes() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  // "size resident shared text lib data dt", in pages: the second field.
  const char* c = buf;
  while (*c && *c != ' ') ++c;
  while (*c == ' ') ++c;
  uint64_t pages = 0;
  while (*c >= '0' && *c <= '9') pages = pages * 10 + uint64_t(*c++ - '0');
  return pages * uint64_t(sysconf(_SC_PAGESIZE));
}

uint64_t peak_resident_set_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_maxrss) * 1024;  // kilobytes on Linux
}

}  // namespace memfit
