// Fuzz target for text traces (trace-cmd report, ftrace `trace`, perf script): detection,
// every line through the parser and the kvm pairer, for each ISA interpretation.
#include <string>

#include "fuzz_target.h"
#include "sources/kvm_pairing.h"
#include "sources/trace_text.h"

using exitscope::Isa;
using namespace exitscope::sources;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const Isa isa : {Isa::kUnknown, Isa::kPvm}) {
    auto t = TraceText::FromString(text, "fuzz.txt", TextOptions{.isa = isa});
    if (!t) continue;
    KvmPairer pairer({}, nullptr);
    (void)(*t)->ReadAll(&pairer);
  }
  return 0;
}
