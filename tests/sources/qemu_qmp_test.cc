// The QMP client's exchange and its one-line errors, without a QEMU: no socket, not a socket,
// refused, silent, not QMP, QEMU's refusal. The peers below replay what QEMU 7.2.22 (Debian
// 1:7.2+dfsg-7+deb12u18) sent on this host, byte for byte; the exchange with a real QEMU is
// tested in tests/cli/qemu_kvm_tracefs_test.cc.
#include "sources/qemu_qmp.h"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "sources/kvm_device_map.h"

namespace exitscope::sources {
namespace {

// What QEMU 7.2.22 sent (QMP greeting, answers, an event; HMP's banner on -monitor unix:).
constexpr std::string_view kGreeting =
    "{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, \"major\": 7}, "
    "\"package\": \"Debian 1:7.2+dfsg-7+deb12u18+b3\"}, \"capabilities\": [\"oob\"]}}\r\n";
constexpr std::string_view kEmptyReturn = "{\"return\": {}}\r\n";
constexpr std::string_view kNotFound =
    "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The command nope has not been "
    "found\"}}\r\n";
constexpr std::string_view kShutdownEvent =
    "{\"timestamp\": {\"seconds\": 1796127221, \"microseconds\": 886164}, \"event\": "
    "\"SHUTDOWN\", \"data\": {\"guest\": false, \"reason\": \"host-qmp-quit\"}}\r\n";
constexpr std::string_view kHmpBanner =
    "QEMU 7.2.22 monitor - type 'help' for more information\r\n(qemu) ";

class SocketDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/exitscope-qmp-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/qmp.sock";
  }
  void TearDown() override {
    if (peer_.joinable()) peer_.join();
    for (int fd : fds_) ::close(fd);
    ::unlink(path_.c_str());
    ::unlink((dir_ + "/file").c_str());
    ::rmdir(dir_.c_str());
  }
  int Bind(bool listen) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    if (listen) {
      EXPECT_EQ(::listen(fd, 1), 0);
    }
    fds_.push_back(fd);
    return fd;
  }
  // A peer that sends `first`, then one scripted answer per line it reads.
  void Serve(std::string first, std::vector<std::string> answers) {
    const int lfd = Bind(true);
    peer_ = std::thread([lfd, first = std::move(first), answers = std::move(answers)] {
      const int c = ::accept(lfd, nullptr, nullptr);
      if (c < 0) return;
      (void)!::write(c, first.data(), first.size());
      std::string in;
      char buf[4096];
      for (const std::string& a : answers) {
        while (in.find('\n') == std::string::npos) {
          const ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) {
            ::close(c);
            return;
          }
          in.append(buf, static_cast<size_t>(n));
        }
        in.erase(0, in.find('\n') + 1);
        (void)!::write(c, a.data(), a.size());
      }
      ::close(c);
    });
  }
  std::string dir_, path_;
  std::vector<int> fds_;
  std::thread peer_;
};

TEST_F(SocketDir, RunsAHumanMonitorCommandAndSkipsEvents) {
  Serve(std::string(kGreeting),
        {std::string(kEmptyReturn),
         std::string(kShutdownEvent) +
             "{\"return\": \"FlatView #0\\r\\n AS \\\"I/O\\\", root: io\\r\\n\"}\r\n"});
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f");
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_EQ(*out, "FlatView #0\n AS \"I/O\", root: io\n");
}

TEST_F(SocketDir, NoSocketIsNotFoundAndSaysHowToStartQemu) {
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(out.error().message, path_ +
                                     ": no QMP socket there: No such file or directory (start "
                                     "QEMU with -qmp unix:" +
                                     path_ + ",server=on,wait=off)");
}

TEST_F(SocketDir, ARegularFileIsNotASocket) {
  std::ofstream(dir_ + "/file") << "x";
  auto out = QmpHumanMonitorCommand(dir_ + "/file", "info mtree -f");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(out.error().message.find(": not a socket"), std::string::npos) << out.error().message;
}

TEST_F(SocketDir, ASocketNobodyListensOnIsRefused) {
  Bind(false);  // what a QEMU that exited leaves behind looks like to connect(): refused
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(out.error().message,
            path_ + ": connection refused: no QEMU is listening on it (it has exited?)");
}

TEST_F(SocketDir, ASilentPeerTimesOut) {
  Bind(true);  // accepts into the backlog, never speaks: QMP busy with another client
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f", {.timeout_ms = 200});
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(out.error().message.find(": no answer within 200 ms (for the whole exchange) while "
                                     "waiting for a QMP greeting"),
            std::string::npos)
      << out.error().message;
}

TEST_F(SocketDir, AnHmpMonitorIsNotQmp) {
  Serve(std::string(kHmpBanner), {});
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(out.error().message,
            path_ +
                ": not a QMP monitor: it sent 'QEMU 7.2.22 monitor - type 'help' for more "
                "information' (a QMP greeting expected)");
  EXPECT_EQ(out.error().message.find('\n'), std::string::npos);
}

TEST_F(SocketDir, QemuRefusingACommandIsItsOwnWords) {
  Serve(std::string(kGreeting), {std::string(kNotFound)});
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kUnavailable);
  EXPECT_EQ(out.error().message, path_ +
                                     ": QEMU refused qmp_capabilities: The command nope has "
                                     "not been found (CommandNotFound)");
}

// Issue 28 item 6: the timeout is one deadline for the whole exchange. A peer that greets,
// then sends an event every 50 ms and never answers held the client for as long as it kept
// talking (the limit was per message); now it fails at the deadline.
TEST_F(SocketDir, EventsCannotHoldTheExchangePastItsDeadline) {
  const int lfd = Bind(true);
  peer_ = std::thread([lfd] {
    const int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) return;
    (void)!::write(c, kGreeting.data(), kGreeting.size());
    for (int i = 0; i < 100; ++i) {  // 5 s at most
      if (::send(c, kShutdownEvent.data(), kShutdownEvent.size(), MSG_NOSIGNAL) < 0) break;
      ::usleep(50'000);
    }
    ::close(c);
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f", {.timeout_ms = 300});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(out.error().message.find("no answer within 300 ms (for the whole exchange)"),
            std::string::npos)
      << out.error().message;
  EXPECT_LT(s, 1.5) << "the deadline is for the whole exchange";
}

// Issue 28 item 8: an error reply that is not QEMU's {"class", "desc"} ({"error": 7}) was
// printed as "7 (?)": it is a malformed reply, and the line says so.
TEST_F(SocketDir, AMalformedErrorReplyIsCalledMalformed) {
  Serve(std::string(kGreeting), {"{\"error\": 7}\r\n"});
  auto out = QmpHumanMonitorCommand(path_, "info mtree -f");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(out.error().message, path_ +
                                     ": malformed QMP error reply to qmp_capabilities (no "
                                     "\"desc\" text): '{\"error\":7}'");
  EXPECT_EQ(out.error().message.find("(?)"), std::string::npos);
}

TEST_F(SocketDir, AnAnswerThatIsNoMemoryTreeIsRefusedByTheDeviceMap) {
  // HMP's answer to a command it does not know, as QEMU 7.2.22 gave it through QMP.
  Serve(std::string(kGreeting),
        {std::string(kEmptyReturn), "{\"return\": \"unknown command: 'info nope'\\r\\n\"}\r\n"});
  auto m = KvmDeviceMap::LoadQmp(path_);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().message,
            path_ +
                ": `info mtree -f` answered 'unknown command: 'info nope'': not a memory "
                "tree");
}

}  // namespace
}  // namespace exitscope::sources
