// exitscope/export.h: EXITSCOPE_EXPORT marks what libexitscope.so exports.
//
// The library is built with hidden visibility (-fvisibility=hidden, inlines hidden), so only
// the C API (es_*) and the classes and functions of include/exitscope/ marked EXITSCOPE_EXPORT
// are in its dynamic symbol table; everything else stays internal to the library. For a static
// link the macro changes nothing.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define EXITSCOPE_EXPORT __attribute__((visibility("default")))
#else
#define EXITSCOPE_EXPORT
#endif
