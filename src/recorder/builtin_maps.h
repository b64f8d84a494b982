// recorder/builtin_maps.h: the register maps of data/regmaps/, embedded at build time
// (the generated builtin_maps.cc is written by embed_maps.cmake).
#pragma once

#include <cstddef>
#include <string_view>

namespace exitscope::internal {

struct BuiltinMapText {
  std::string_view name;  // file stem: "nvme"
  std::string_view text;  // the .map file's text
};

extern const BuiltinMapText kBuiltinMaps[];
extern const size_t kBuiltinMapCount;

}  // namespace exitscope::internal
