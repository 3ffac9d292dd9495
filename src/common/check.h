// ERUN_CHECK: an invariant of erun itself. A failure is a bug in erun, never
// an expected condition (those are Status values or typed exceptions); it logs
// the condition with file and line and aborts.
#pragma once

#include <cstdio>
#include <cstdlib>

#define ERUN_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "erun: internal error: check failed: %s (%s:%d)\n",   \
                   #cond, __FILE__, __LINE__);                                    \
      std::abort();                                                               \
    }                                                                             \
  } while (0)
