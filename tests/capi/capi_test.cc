// The C API as a C VMM sees it: status codes, messages, no exceptions, NULL safety.
#include "exitscope/exitscope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <unistd.h>

namespace {

std::string TempPath(const char* name) {
  return testing::TempDir() + "/capi_" + std::to_string(::getpid()) + "_" + name;
}

class CApiTest : public testing::Test {
 protected:
  void SetUp() override {
    es_options o;
    es_options_init(&o);
    o.num_vcpus = 2;
    o.events_per_vcpu = 64;
    o.log_slow_exits = 0;
    ASSERT_EQ(es_recorder_create(&o, &rec_), ES_OK) << es_last_error();
  }
  void TearDown() override { es_recorder_destroy(rec_); }
  es_recorder* rec_ = nullptr;
};

TEST(CApi, OptionsDefaultsMatchTheLibrary) {
  es_options o;
  es_options_init(&o);
  EXPECT_EQ(o.num_vcpus, 1u);
  EXPECT_EQ(o.slow_exit_ns, 20'000'000u);
  EXPECT_EQ(o.io_age_ns, 20'000'000'000u);
  EXPECT_EQ(o.start_watchdog, 1);
}

TEST(CApi, VersionOfTheLibraryIsTheHeaders) {
  EXPECT_STREQ(es_version(), ES_VERSION_STRING);
  EXPECT_EQ(es_version_number(), static_cast<uint32_t>(ES_VERSION_NUMBER));
  EXPECT_EQ(std::string(es_version()), std::to_string(ES_VERSION_MAJOR) + "." +
                                           std::to_string(ES_VERSION_MINOR) + "." +
                                           std::to_string(ES_VERSION_PATCH));
  EXPECT_EQ(ES_VERSION_ENCODE(1, 2, 3), 10203);
}

TEST(CApi, OptionsInitSetsTheStructSize) {
  es_options o;
  std::memset(&o, 0xab, sizeof(o));
  es_options_init(&o);
  EXPECT_EQ(o.struct_size, sizeof(es_options));
  EXPECT_EQ(es_options_init_sized(nullptr, sizeof(es_options)), ES_EINVAL);
  EXPECT_EQ(es_options_init_sized(&o, 8), ES_EINVAL);
  EXPECT_NE(std::string(es_last_error()).find("smaller than the first es_options"),
            std::string::npos);
}

// A caller built against a newer header passes a larger struct: accepted while the fields this
// library does not know are zero, refused (ES_EUNSUPPORTED) once one is set.
TEST(CApi, OptionsFromANewerHeaderNeedTheirUnknownFieldsZero) {
  struct Newer {
    es_options base;
    uint64_t added_later;
  };
  Newer n;
  ASSERT_EQ(es_options_init_sized(&n.base, sizeof(Newer)), ES_OK);
  EXPECT_EQ(n.base.struct_size, sizeof(Newer));
  EXPECT_EQ(n.added_later, 0u);
  EXPECT_EQ(n.base.num_vcpus, 1u);
  n.base.start_watchdog = 0;
  es_recorder* r = nullptr;
  ASSERT_EQ(es_recorder_create(&n.base, &r), ES_OK) << es_last_error();
  es_recorder_destroy(r);

  n.added_later = 7;
  EXPECT_EQ(es_recorder_create(&n.base, &r), ES_EUNSUPPORTED);
  EXPECT_EQ(r, nullptr);
  EXPECT_NE(std::string(es_last_error()).find("does not know"), std::string::npos);
}

TEST(CApi, OptionsNotInitialisedAreRefused) {
  es_options o;
  es_options_init(&o);
  o.start_watchdog = 0;
  o.struct_size = 0;
  es_recorder* r = nullptr;
  EXPECT_EQ(es_recorder_create(&o, &r), ES_EINVAL);
  EXPECT_NE(std::string(es_last_error()).find("es_options_init"), std::string::npos);
  // NULL options are the defaults.
  ASSERT_EQ(es_recorder_create(nullptr, &r), ES_OK) << es_last_error();
  es_recorder_destroy(r);
}

TEST(CApi, BadOptionsAreRefusedWithAMessage) {
  es_options o;
  es_options_init(&o);
  o.num_vcpus = 0;
  es_recorder* r = reinterpret_cast<es_recorder*>(0x1);
  EXPECT_EQ(es_recorder_create(&o, &r), ES_EINVAL);
  EXPECT_EQ(r, nullptr);
  EXPECT_NE(std::string(es_last_error()), "");
  EXPECT_EQ(es_recorder_create(&o, nullptr), ES_EINVAL);
}

TEST(CApi, NullHandlesAreSafe) {
  es_begin_exit(nullptr, 0, ES_EXIT_PIO, 0x3f8, 1, ES_DIR_WRITE, 0);
  es_end_exit(nullptr, 0);
  es_io_submit(nullptr, 0, 1);
  es_recorder_destroy(nullptr);
  EXPECT_EQ(es_write_dump(nullptr, "x", 0), ES_EINVAL);
  EXPECT_EQ(es_add_device(nullptr, "a", "b", nullptr), ES_EINVAL);
  EXPECT_STREQ(es_status_name(ES_ECORRUPT), "corrupt");
}

TEST_F(CApiTest, DevicesRangesAndResolution) {
  uint32_t uart = 99, nvme = 99;
  ASSERT_EQ(es_add_device(rec_, "uart0", "uart16550", &uart), ES_OK);
  ASSERT_EQ(es_add_device(rec_, "nvme0", "nvme", &nvme), ES_OK);
  EXPECT_EQ(es_add_device(rec_, "nvme0", "nvme", nullptr), ES_EEXIST);
  ASSERT_EQ(es_add_range_builtin(rec_, ES_SPACE_PIO, 0x3f8, 8, uart, "uart16550"), ES_OK);
  ASSERT_EQ(es_add_range_builtin(rec_, ES_SPACE_MMIO, 0xfebf0000, 0x4000, nvme, "nvme"), ES_OK);
  EXPECT_EQ(es_add_range_builtin(rec_, ES_SPACE_MMIO, 0xfebf3000, 0x1000, nvme, nullptr),
            ES_EEXIST);
  EXPECT_NE(std::string(es_last_error()).find("overlaps"), std::string::npos) << es_last_error();
  EXPECT_EQ(es_add_range_builtin(rec_, ES_SPACE_MMIO, 0x1000, 0x10, nvme, "no-such-map"), ES_ENOENT)
      << es_last_error();
  EXPECT_EQ(es_add_range_file(rec_, ES_SPACE_MMIO, 0x1000, 0x10, nvme, "/nonexistent.map"),
            ES_ENOENT)
      << es_last_error();

  char buf[64];
  ASSERT_EQ(es_resolve(rec_, ES_SPACE_MMIO, 0xfebf1008, 4, ES_DIR_WRITE, buf, sizeof buf), ES_OK);
  EXPECT_STREQ(buf, "nvme0.SQ1TDBL");
  ASSERT_EQ(es_resolve(rec_, ES_SPACE_MMIO, 0xfebf0016, 2, ES_DIR_READ, buf, sizeof buf), ES_OK);
  EXPECT_STREQ(buf, "nvme0.CC+2");
  ASSERT_EQ(es_resolve(rec_, ES_SPACE_PIO, 0x3f8, 1, ES_DIR_WRITE, buf, sizeof buf), ES_OK);
  EXPECT_STREQ(buf, "uart0.THR");
  ASSERT_EQ(es_resolve(rec_, ES_SPACE_MMIO, 0xdead0000, 4, ES_DIR_READ, buf, sizeof buf), ES_OK);
  EXPECT_STREQ(buf, "unassigned");
  char tiny[4];
  EXPECT_EQ(es_resolve(rec_, ES_SPACE_MMIO, 0xfebf1008, 4, ES_DIR_WRITE, tiny, sizeof tiny),
            ES_EINVAL);
  EXPECT_EQ(std::string(tiny), "nvm");
}

struct HookLog {
  std::vector<es_event_type> types;
  std::vector<std::string> lines, regs;
};

TEST_F(CApiTest, ExitsHooksCountersAndDump) {
  uint32_t nvme = 0;
  ASSERT_EQ(es_add_device(rec_, "nvme0", "nvme", &nvme), ES_OK);
  ASSERT_EQ(es_add_range_builtin(rec_, ES_SPACE_MMIO, 0xfebf0000, 0x4000, nvme, "nvme"), ES_OK);
  HookLog log;
  ASSERT_EQ(es_set_finding_hook(
                rec_,
                [](const es_finding* f, void* user) {
                  auto* l = static_cast<HookLog*>(user);
                  l->types.push_back(f->type);
                  l->lines.emplace_back(f->line);
                  l->regs.emplace_back(f->reg);
                },
                &log),
            ES_OK);
  ASSERT_EQ(es_set_slow_exit_ns(rec_, 5'000'000), ES_OK);
  EXPECT_EQ(es_set_slow_exit_ns(rec_, 0), ES_EINVAL);
  for (int i = 0; i < 100; ++i) {
    es_begin_exit(rec_, 0, ES_EXIT_MMIO, 0xfebf001c, 4, ES_DIR_READ, 0);
    es_end_exit_value(rec_, 0, 1);
  }
  es_begin_exit(rec_, 1, ES_EXIT_MMIO, 0xfebf1008, 4, ES_DIR_WRITE, 7);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  es_end_exit(rec_, 1);
  es_begin_exit(rec_, 7, ES_EXIT_HLT, 0, 0, ES_DIR_NONE, 0);  // bad vCPU: counted, dropped
  es_end_exit(rec_, 0);                                       // end without begin: counted

  es_counters c;
  ASSERT_EQ(es_get_counters(rec_, &c), ES_OK);
  EXPECT_EQ(c.exits_written, 101u);
  EXPECT_EQ(c.exits_overwritten, 100u - 64u);  // vCPU 0 wrote 100 into a ring of 64
  EXPECT_EQ(c.slow_exits, 1u);
  EXPECT_EQ(c.bad_vcpu, 1u);
  EXPECT_EQ(c.end_without_begin, 1u);
  ASSERT_FALSE(log.types.empty());
  EXPECT_EQ(log.types.back(), ES_SLOW_EXIT);
  EXPECT_EQ(log.regs.back(), "SQ1TDBL");
  EXPECT_NE(log.lines.back().find("vCPU 1: exit MMIO write 4B to nvme0.SQ1TDBL (0xfebf1008) took"),
            std::string::npos)
      << log.lines.back();

  const std::string path = TempPath("dump.esdump");
  ASSERT_EQ(es_write_dump(rec_, path.c_str(), 0), ES_OK) << es_last_error();
  EXPECT_EQ(es_check_dump(path.c_str()), ES_OK) << es_last_error();
  EXPECT_EQ(es_check_dump("/nonexistent/dump"), ES_ENOENT);  // a missing file is "not found"

  // A truncated copy is refused as corrupt, naming the file.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = TempPath("cut.esdump");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), bytes.size() / 2);
  EXPECT_EQ(es_check_dump(cut.c_str()), ES_ECORRUPT);
  EXPECT_NE(std::string(es_last_error()).find(cut), std::string::npos) << es_last_error();
  std::remove(path.c_str());
  std::remove(cut.c_str());
}

// The vCPU thread of the stack test: inside an exit, blocked in read() of a pipe until the
// test writes to it. Not inlined: the capture must show it as a frame of its own.
__attribute__((noinline)) void BlockInPipeRead(es_recorder* rec, int fd) {
  es_begin_exit(rec, 0, ES_EXIT_MMIO, 0xd0000050, 4, ES_DIR_WRITE, 1);
  char c;
  while (read(fd, &c, 1) < 0 && errno == EINTR) {
  }
  es_end_exit(rec, 0);
}

struct StackLog {
  std::mutex mu;
  int findings = 0, stacks = 0;
  uint32_t max_user = 0;
  int32_t tid = 0;
  bool named = false;               // a user frame names BlockInPipeRead
  bool other_pointer_null = false;  // es_finding_stack of a copy of the finding is NULL
  std::vector<std::string> frames;  // of the first stack with user frames
};

// The watchdog finds a plain thread stuck inside an exit (blocked in read() for ~300 ms) and,
// with the stack signal installed, the hook gets its frames through es_finding_stack: user
// frames, one of them the blocking function (the test is built with frame pointers and -g).
TEST(CApiStacks, AHookSeesTheFramesOfAStuckThread) {
  es_options o;
  es_options_init(&o);
  o.num_vcpus = 1;
  o.stuck_exit_ns = 20'000'000;
  o.log_slow_exits = 0;
  es_recorder* rec = nullptr;
  ASSERT_EQ(es_recorder_create(&o, &rec), ES_OK) << es_last_error();
  ASSERT_EQ(es_install_stack_signal(rec, SIGRTMIN + 3), ES_OK) << es_last_error();
  EXPECT_EQ(es_set_thread_id(rec, 1, 1234), ES_EINVAL);  // no vCPU 1
  EXPECT_EQ(es_set_thread_id(rec, 0, 0), ES_EINVAL);
  EXPECT_EQ(es_set_thread_id(nullptr, 0, 1), ES_EINVAL);
  EXPECT_EQ(es_install_stack_signal(nullptr, SIGRTMIN + 3), ES_EINVAL);
  EXPECT_EQ(es_finding_stack(nullptr), nullptr);
  StackLog log;
  ASSERT_EQ(es_set_finding_hook(
                rec,
                [](const es_finding* f, void* user) {
                  auto* l = static_cast<StackLog*>(user);
                  std::lock_guard<std::mutex> lock(l->mu);
                  ++l->findings;
                  const es_stack* s = es_finding_stack(f);
                  const es_finding copy = *f;
                  l->other_pointer_null = es_finding_stack(&copy) == nullptr;
                  if (s == nullptr) return;
                  ++l->stacks;
                  l->tid = s->tid;
                  l->max_user = std::max(l->max_user, s->n_user);
                  for (uint32_t i = 0; i < s->n_user; ++i) {
                    if (std::strstr(s->user[i].function, "BlockInPipeRead") != nullptr)
                      l->named = true;
                  }
                  if (l->frames.empty() && s->n_user > 0) {
                    for (uint32_t i = 0; i < s->n_kernel; ++i)
                      l->frames.push_back(std::string("k ") + s->kernel[i].function);
                    for (uint32_t i = 0; i < s->n_user; ++i)
                      l->frames.push_back(std::string("u ") + s->user[i].function + " [" +
                                          s->user[i].module + "]");
                    if (s->note[0] != '\0') l->frames.push_back(std::string("note ") + s->note);
                  }
                },
                &log),
            ES_OK);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::atomic<int32_t> tid{0};
  std::thread vcpu([&] {
    tid = static_cast<int32_t>(gettid());
    EXPECT_EQ(es_set_thread_id(rec, 0, tid), ES_OK) << es_last_error();
    BlockInPipeRead(rec, p[0]);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(write(p[1], "x", 1), 1);
  vcpu.join();
  es_recorder_destroy(rec);
  close(p[0]);
  close(p[1]);
  std::string frames;
  for (const std::string& f : log.frames) frames += "\n  " + f;
  EXPECT_GE(log.findings, 1);
  EXPECT_GE(log.stacks, 1) << "no finding carried a stack";
  EXPECT_TRUE(log.other_pointer_null);
  EXPECT_EQ(log.tid, tid.load());
  EXPECT_GT(log.max_user, 0u) << "no user frames";
  EXPECT_TRUE(log.named) << "no user frame names BlockInPipeRead:" << frames;
}

TEST_F(CApiTest, AttributesCountersAndWatchdog) {
  EXPECT_EQ(es_set_attribute(rec_, "vmm", "capi_test"), ES_OK);
  EXPECT_EQ(es_set_vcpu_counter(rec_, 1, "kvm.exits", 42), ES_OK);
  EXPECT_EQ(es_set_vcpu_counter(rec_, 9, "kvm.exits", 42), ES_EINVAL);
  EXPECT_EQ(es_watchdog_start(rec_, 1'000'000, 0), ES_OK);
  es_watchdog_stop(rec_);
  EXPECT_EQ(es_install_dump_signal(rec_, 0, "/tmp"), ES_EINVAL);
}

// An exit kind outside the enum is refused at the C boundary (ES_EINVAL, message naming it),
// still timed as ES_EXIT_UNKNOWN so that the next es_end_exit pairs with it; the dump stays
// readable. 257 must not become MMIO (its low byte is 1).
TEST_F(CApiTest, UnknownExitKindsAreRefusedAndTheDumpStaysReadable) {
  EXPECT_EQ(es_begin_exit(rec_, 0, static_cast<es_exit_kind>(99), 0x1234, 4, ES_DIR_READ, 0),
            ES_EINVAL);
  EXPECT_NE(std::string(es_last_error()).find("exit kind 99 is unknown"), std::string::npos)
      << es_last_error();
  es_end_exit(rec_, 0);
  EXPECT_EQ(es_begin_exit(rec_, 1, static_cast<es_exit_kind>(257), 0xfebf1008, 4, ES_DIR_WRITE, 0),
            ES_EINVAL);
  es_end_exit(rec_, 1);
  EXPECT_EQ(es_begin_exit(rec_, 1, static_cast<es_exit_kind>(-1), 0, 0, ES_DIR_NONE, 0), ES_EINVAL);
  es_end_exit(rec_, 1);
  EXPECT_EQ(es_begin_exit(rec_, 0, ES_EXIT_HLT, 0, 0, ES_DIR_NONE, 0), ES_OK);
  es_end_exit(rec_, 0);
  es_counters c;
  ASSERT_EQ(es_get_counters(rec_, &c), ES_OK);
  EXPECT_EQ(c.exits_written, 4u);
  EXPECT_EQ(c.end_without_begin, 0u);
  const std::string path = TempPath("kinds.esdump");
  ASSERT_EQ(es_write_dump(rec_, path.c_str(), 0), ES_OK) << es_last_error();
  EXPECT_EQ(es_check_dump(path.c_str()), ES_OK) << es_last_error();
  std::remove(path.c_str());
}

// Dumps written by the old C API with kind 99 (testdata/crashes/README.md) are readable.
TEST(CApiRegression, DumpsWithAnUnknownKindAreReadable) {
  for (const char* f : {"capi-kind99.esdump", "capi-kind99-in-progress.esdump"}) {
    const std::string path = std::string(EXITSCOPE_TESTDATA_DIR) + "/crashes/" + f;
    EXPECT_EQ(es_check_dump(path.c_str()), ES_OK) << path << ": " << es_last_error();
  }
}

TEST_F(CApiTest, SynchronousFaultSignalsAreRefusedForDumps) {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSTOP, SIGTRAP, SIGSYS}) {
    EXPECT_EQ(es_install_dump_signal(rec_, sig, "/tmp"), ES_EINVAL) << "signal " << sig;
  }
  EXPECT_EQ(es_install_dump_signal(rec_, SIGUSR2, "/tmp"), ES_OK) << es_last_error();
}

// A register-map file is size-checked before it is read: a device node is refused at once
// instead of being read without limit.
TEST_F(CApiTest, RangeFileRefusesDevicesAndHugeFiles) {
  uint32_t dev = 0;
  ASSERT_EQ(es_add_device(rec_, "dev0", "x", &dev), ES_OK);
  EXPECT_EQ(es_add_range_file(rec_, ES_SPACE_MMIO, 0x1000, 0x1000, dev, "/dev/zero"), ES_EINVAL);
  EXPECT_NE(std::string(es_last_error()).find("not a regular file"), std::string::npos)
      << es_last_error();
  const std::string big = TempPath("big.map");
  {
    std::ofstream out(big, std::ios::binary);
    out.seekp((16 << 20) + 10);
    out.put('\n');
  }
  EXPECT_EQ(es_add_range_file(rec_, ES_SPACE_MMIO, 0x1000, 0x1000, dev, big.c_str()), ES_EINVAL);
  EXPECT_NE(std::string(es_last_error()).find("too large"), std::string::npos) << es_last_error();
  std::remove(big.c_str());
}

}  // namespace
