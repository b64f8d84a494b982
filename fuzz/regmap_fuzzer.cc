// Fuzz target for the register-map text format (RegisterMap::Parse): a map that parses must
// resolve any access, format what it finds, and come back equal from its own ToText().
#include <string_view>

#include "exitscope/register_map.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = exitscope::RegisterMap::Parse(text, "fuzz.map");
  if (!m) return 0;
  for (const auto& def : m->registers()) {
    for (const uint64_t off : {def.offset, def.end() - 1, def.end()}) {
      for (const uint32_t sz : {1u, 2u, 4u, 8u}) {
        for (const auto dir : {exitscope::AccessDir::kRead, exitscope::AccessDir::kWrite}) {
          const auto hit = m->Resolve(off, sz, dir);
          const auto ref = m->ResolveBySearch(off, sz, dir);
          if (hit.reg != ref.reg || hit.element != ref.element || hit.delta != ref.delta) {
            exitscope::fuzz::InvariantFailed("Resolve and ResolveBySearch disagree");
          }
          (void)m->Format(hit, sz);
        }
      }
    }
  }
  auto again = exitscope::RegisterMap::Parse(m->ToText(), "fuzz-totext.map");
  if (!again) exitscope::fuzz::InvariantFailed("Parse(ToText()) failed on a map that parsed");
  if (again->registers().size() != m->registers().size()) {
    exitscope::fuzz::InvariantFailed("Parse(ToText()) changed the register count");
  }
  return 0;
}
