// tests/sources/kvm_tep_fixture.h: a tep_handle loaded with the REAL kvm format files of
// Linux 6.18 (testdata/kvm/tracefs-pvm-6.18), and a builder of raw binary records laid out
// by those formats' field offsets, so decoding is tested on the kernel's real layout.
#pragma once

#include <gtest/gtest.h>
#include <traceevent/event-parse.h>
#include <traceevent/trace-seq.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace exitscope::testing {

inline std::string KvmTestdata(const std::string& rel) {
  return std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm/" + rel;
}

class RealKvmFormats {
 public:
  RealKvmFormats() {
    tep_ = tep_alloc();
    tep_set_long_size(tep_, 8);
    tep_set_page_size(tep_, 4096);
    tep_set_file_bigendian(tep_, TEP_LITTLE_ENDIAN);
    tep_set_local_bigendian(tep_, TEP_LITTLE_ENDIAN);
    const std::filesystem::path dir = KvmTestdata("tracefs-pvm-6.18/events/kvm");
    if (!std::filesystem::is_directory(dir)) return;
    for (const auto& ent : std::filesystem::directory_iterator(dir)) {
      std::ifstream f(ent.path() / "format");
      std::stringstream ss;
      ss << f.rdbuf();
      std::string text = ss.str();
      tep_event* ev = nullptr;  // libtraceevent stores the parsed event here (not optional)
      if (tep_parse_format(tep_, &ev, text.data(), text.size(), "kvm") == 0) ++loaded_;
    }
  }
  ~RealKvmFormats() { tep_free(tep_); }
  RealKvmFormats(const RealKvmFormats&) = delete;
  RealKvmFormats& operator=(const RealKvmFormats&) = delete;

  tep_handle* tep() const { return tep_; }
  int loaded() const { return loaded_; }

  // A raw record of kvm:`event` with `fields` stored at their format offsets and sizes.
  std::vector<uint8_t> Build(const char* event, int pid,
                             std::initializer_list<std::pair<const char*, uint64_t>> fields) {
    tep_event* ev = tep_find_event_by_name(tep_, "kvm", event);
    EXPECT_NE(ev, nullptr) << event;
    if (ev == nullptr) return {};
    int size = 0;
    for (tep_format_field* f = ev->format.fields; f != nullptr; f = f->next) {
      size = std::max(size, f->offset + f->size);
    }
    std::vector<uint8_t> data(static_cast<size_t>(size), 0);
    Put(ev, data, tep_find_common_field(ev, "common_type"), static_cast<uint64_t>(ev->id));
    Put(ev, data, tep_find_common_field(ev, "common_pid"), static_cast<uint64_t>(pid));
    for (const auto& [name, value] : fields) {
      tep_format_field* f = tep_find_field(ev, name);
      EXPECT_NE(f, nullptr) << event << "." << name;
      if (f != nullptr) Put(ev, data, f, value);
    }
    return data;
  }
  // Bytes into an array field (kvm_emulate_insn.insn).
  void PutBytes(const char* event, std::vector<uint8_t>& data, const char* field,
                const std::vector<uint8_t>& bytes) {
    tep_event* ev = tep_find_event_by_name(tep_, "kvm", event);
    tep_format_field* f = tep_find_field(ev, field);
    ASSERT_NE(f, nullptr);
    std::memcpy(data.data() + f->offset, bytes.data(),
                std::min<size_t>(bytes.size(), static_cast<size_t>(f->size)));
  }

  static tep_record Record(std::vector<uint8_t>& data, uint64_t ts) {
    tep_record r{};
    r.ts = ts;
    r.size = static_cast<int>(data.size());
    r.record_size = r.size;
    r.data = data.data();
    r.cpu = 0;
    return r;
  }

  // libtraceevent's own rendering of the record with the kernel's print fmt.
  std::string Print(std::vector<uint8_t>& data) {
    tep_record r = Record(data, 0);
    trace_seq s;
    trace_seq_init(&s);
    tep_print_event(tep_, &s, &r, "%s", TEP_PRINT_INFO);
    trace_seq_terminate(&s);
    std::string out(s.buffer, s.len);
    trace_seq_destroy(&s);
    return out;
  }

 private:
  static void Put(tep_event*, std::vector<uint8_t>& data, tep_format_field* f, uint64_t v) {
    if (f == nullptr) return;
    std::memcpy(data.data() + f->offset, &v, std::min<size_t>(8, static_cast<size_t>(f->size)));
  }
  tep_handle* tep_ = nullptr;
  int loaded_ = 0;
};

}  // namespace exitscope::testing
