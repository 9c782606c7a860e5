#include "support/alloc_counter.hpp"

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstddef>

#include "core/library_scope.hpp"

extern "C" {
void* __libc_malloc(size_t);
void __libc_free(void*);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_memfit{0}, g_library{0}, g_library_outstanding{0}, g_library_max{0};

void note(void* p, size_t n) {
  if (!p || !g_counting.load(std::memory_order_relaxed)) return;
  if (memfit::LibraryCallScope::active()) {
    g_library.fetch_add(1);
    g_library_outstanding.fetch_add(int64_t(malloc_usable_size(p)));
    int64_t prev = g_library_max.load();
    while (int64_t(n) > prev && !g_library_max.compare_exchange_weak(prev, int64_t(n))) {
    }
  } else {
    g_memfit.fetch_add(1);
  }
}

void note_free(void* p) {
  if (!p || !g_counting.load(std::memory_order_relaxed)) return;
  if (memfit::LibraryCallScope::active()) g_library_outstanding.fetch_sub(int64_t(malloc_usable_size(p)));
}

}  // namespace

extern "C" {
void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  note(p, n);
  return p;
}
void free(void* p) {
  note_free(p);
  __libc_free(p);
}
void* calloc(size_t a, size_t b) {
  void* p = __libc_calloc(a, b);
  note(p, a * b);
  return p;
}
void* realloc(void* old, size_t n) {
  note_free(old);
  void* p = __libc_realloc(old, n);
  note(p, n);
  return p;
}
int posix_memalign(void** out, size_t align, size_t n) {
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  note(p, n);
  *out = p;
  return 0;
}
void* aligned_alloc(size_t align, size_t n) {
  void* p = __libc_memalign(align, n);
  note(p, n);
  return p;
}
void* memalign(size_t align, size_t n) {
  void* p = __libc_memalign(align, n);
  note(p, n);
  return p;
}
}

namespace memfit::test {

void alloc_counter_start() {
  g_memfit = 0;
  g_library = 0;
  g_library_outstanding = 0;
  g_library_max = 0;
  g_counting = true;
}

AllocCounts alloc_counter_stop() {
  g_counting = false;
  return AllocCounts{g_memfit.load(), g_library.load(), g_library_outstanding.load(), g_library_max.load()};
}

}  // namespace memfit::test
