// sources/source.cc: OpenSource and the two file sources (a dump, a kernel trace).
#include "sources/source.h"

#include <utility>

#include "sources/dump_source.h"
#include "sources/input_format.h"

namespace exitscope::sources {
namespace {

// A recorder Dump, read from a file (owned) or given (borrowed).
class DumpFileSource final : public Source {
 public:
  DumpFileSource(Dump owned, std::string name) : owned_(std::move(owned)), dump_(owned_) {
    Init(std::move(name));
  }
  DumpFileSource(const Dump& borrowed, std::string name, bool) : dump_(borrowed) {
    Init(std::move(name));
  }
  Status Run(EventSink* sink) override {
    DumpSource src(dump_);
    src.Emit(sink);
    info_.lost_at_record = src.capture().lost_events;
    return {};
  }
  const SourceInfo& info() const noexcept override { return info_; }
  const Dump* dump() const noexcept override { return &dump_; }

 private:
  void Init(std::string name) {
    info_.name = std::move(name);
    info_.format = "recorder dump";
    info_.side = Side::kVmm;
    info_.clock = "CLOCK_MONOTONIC";
  }
  Dump owned_;
  const Dump& dump_;
  SourceInfo info_;
};

// A kernel trace file: KvmInput's records paired by KvmPairer.
class KvmFileSource final : public Source {
 public:
  KvmFileSource(std::unique_ptr<KvmInput> in, const SourceOptions& o, std::string name)
      : in_(std::move(in)), options_(o) {
    info_.name = std::move(name);
    info_.format = in_->format_name();
    info_.side = Side::kKernel;
    info_.clock = in_->clock();
    info_.tsc_khz = in_->tsc_khz();
    info_.tsc_khz_from_host = in_->tsc_khz_from_host();
    info_.scale = in_->scale();
    info_.lost_at_record = in_->lost_at_record();
    if (!o.raw_clock) options_.pairer.clock = in_->scale();
  }
  Status Run(EventSink* sink) override {
    pairer_ = std::make_unique<KvmPairer>(options_.pairer, sink);
    if (observer_ != nullptr) pairer_->SetRecordObserver(observer_, observer_ctx_);
    Status s = in_->ReadAll(pairer_.get());  // ends with the pairer's Finish()
    info_.lost_at_record = in_->lost_at_record();
    return s;
  }
  const SourceInfo& info() const noexcept override { return info_; }
  const KvmPairingStats* pairing() const noexcept override {
    return pairer_ ? &pairer_->stats() : &empty_;
  }
  void ObserveRecords(void (*fn)(const KvmRecord&, void*), void* ctx) override {
    observer_ = fn;
    observer_ctx_ = ctx;
  }
  const KvmInput& input() const noexcept { return *in_; }

 private:
  std::unique_ptr<KvmInput> in_;
  SourceOptions options_;
  SourceInfo info_;
  std::unique_ptr<KvmPairer> pairer_;
  KvmPairingStats empty_;
  void (*observer_)(const KvmRecord&, void*) = nullptr;
  void* observer_ctx_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Source>> OpenSource(const std::string& path, const SourceOptions& options) {
  auto format = SniffInputFile(path);
  if (!format) return Propagate(format);
  if (*format == InputFormat::kDump) {
    auto dump = ReadDump(path);
    if (!dump) return Propagate(dump);
    return std::unique_ptr<Source>(std::make_unique<DumpFileSource>(std::move(*dump), path));
  }
  return OpenKernelTrace(path, options);
}

Result<std::unique_ptr<Source>> OpenKernelTrace(const std::string& path,
                                                const SourceOptions& options) {
  auto in = KvmInput::Open(path, options.input);
  if (!in) return Propagate(in);
  return std::unique_ptr<Source>(std::make_unique<KvmFileSource>(std::move(*in), options, path));
}

std::unique_ptr<Source> DumpAsSource(const Dump& dump, std::string name) {
  return std::make_unique<DumpFileSource>(dump, std::move(name), true);
}

}  // namespace exitscope::sources
