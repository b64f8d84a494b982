/* exitscope/version.h: the version of these headers, for C and C++ (docs/capi.md, "Versions").
 *
 * Written by hand and checked at configure time against project(VERSION) in CMakeLists.txt (a
 * mismatch fails cmake). The library that is loaded says its own with es_version()
 * (exitscope/exitscope.h); the two differ when a program built against one release runs with
 * another of the same SONAME. */
#ifndef EXITSCOPE_VERSION_H_
#define EXITSCOPE_VERSION_H_

#define ES_VERSION_MAJOR 0
#define ES_VERSION_MINOR 1
#define ES_VERSION_PATCH 0
#define ES_VERSION_STRING "0.1.0"

/* One comparable number: ES_VERSION_ENCODE(0, 1, 0) == 100, ES_VERSION_ENCODE(1, 2, 3) == 10203.
 * #if ES_VERSION_NUMBER >= ES_VERSION_ENCODE(0, 2, 0) ... */
#define ES_VERSION_ENCODE(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))
#define ES_VERSION_NUMBER ES_VERSION_ENCODE(ES_VERSION_MAJOR, ES_VERSION_MINOR, ES_VERSION_PATCH)

#endif /* EXITSCOPE_VERSION_H_ */
