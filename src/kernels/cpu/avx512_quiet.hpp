// GCC 12's AVX-512 headers initialise "undefined" vectors from themselves (__Y = __Y), which
// its own -Wuninitialized then reports at every inlined shuffle, masked load, conversion and
// reduction. A kernel written with those intrinsics includes this before anything else: the
// two warnings are then off from that point to the end of its translation unit (pragmas are
// per file; nothing else is affected).
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
