// ERUN_API marks what liberun exports: the classes and functions declared in
// include/erun, and nothing else. liberun's objects are built with hidden
// visibility (-fvisibility=hidden -fvisibility-inlines-hidden), so the
// classes and functions behind this API (the communicators, the rendezvous,
// the stores) stay inside the library; an exported class also exports its
// typeinfo and vtable, which exceptions (errors.hpp) and virtual calls across
// the library boundary need. For a program, ERUN_API is only a visibility
// attribute and needs no definition of its own.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define ERUN_API __attribute__((visibility("default")))
#else
#define ERUN_API
#endif
