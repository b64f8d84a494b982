#include "sources/qemu_qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace exitscope::sources {
namespace {

using nlohmann::json;

std::string Excerpt(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 60)) {
    out +=
        (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) ? ' ' : c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return s.size() > 60 ? out + "..." : out;
}

class QmpConnection {
 public:
  // One deadline for the whole exchange (issue 28: it was per message, so a peer sending an
  // event every few seconds held the caller for as long as it liked).
  QmpConnection(std::string path, const QmpOptions& o)
      : path_(std::move(path)),
        opt_(o),
        deadline_(std::chrono::steady_clock::now() + std::chrono::milliseconds(o.timeout_ms)) {}
  ~QmpConnection() {
    if (fd_ >= 0 && owns_fd_) ::close(fd_);
  }
  void Adopt(int fd) {
    fd_ = fd;
    owns_fd_ = false;
  }
  QmpConnection(const QmpConnection&) = delete;
  QmpConnection& operator=(const QmpConnection&) = delete;

  Status Connect() {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) {
      const int e = errno;
      return Fail(e == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                  fmt::format("{}: no QMP socket there: {} (start QEMU with -qmp "
                              "unix:{},server=on,wait=off)",
                              path_, std::strerror(e), path_));
    }
    if (!S_ISSOCK(st.st_mode)) {
      return Fail(
          ErrorCode::kInvalidArgument,
          fmt::format("{}: not a socket (QMP needs QEMU's -qmp unix:PATH,server=on)", path_));
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path_.size() >= sizeof(addr.sun_path)) {
      return Fail(ErrorCode::kInvalidArgument, fmt::format("{}: socket path longer than {} bytes",
                                                           path_, sizeof(addr.sun_path) - 1));
    }
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return Fail(ErrorCode::kIo, fmt::format("socket: {}", std::strerror(errno)));
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int e = errno;
      if (e == ECONNREFUSED) {
        return Fail(ErrorCode::kUnavailable,
                    fmt::format("{}: connection refused: no QEMU is listening on it (it has "
                                "exited?)",
                                path_));
      }
      return Fail(e == EACCES ? ErrorCode::kPermission : ErrorCode::kIo,
                  fmt::format("{}: connect: {}", path_, std::strerror(e)));
    }
    return {};
  }

  // The next message that is not an asynchronous event. `what` names the awaited message.
  Result<json> Next(std::string_view what) {
    for (;;) {
      auto line = ReadLine(what);
      if (!line) return Propagate(line);
      json j = json::parse(*line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        return Fail(ErrorCode::kInvalidArgument,
                    fmt::format("{}: not a QMP monitor: it sent '{}' ({} expected)", path_,
                                Excerpt(*line), what));
      }
      if (j.contains("event")) continue;
      return j;
    }
  }

  Status Send(const json& j) {
    const std::string s = j.dump() + "\n";
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Fail(ErrorCode::kUnavailable,
                    fmt::format("{}: send: {}", path_, std::strerror(errno)));
      }
      off += static_cast<size_t>(n);
    }
    return {};
  }

  // Runs `execute` and returns its "return" member; an "error" reply is QEMU refusing it.
  Result<json> Execute(const json& command, std::string_view label) {
    if (Status s = Send(command); !s) return Propagate(s);
    auto reply = Next(fmt::format("the answer to {}", label));
    if (!reply) return Propagate(reply);
    if (reply->contains("error")) {
      // QEMU's error is {"class": "...", "desc": "..."}; anything else (`{"error": 7}`) is a
      // peer that does not speak QMP: say so, never "7 (?)".
      const json& e = (*reply)["error"];
      const bool has_desc = e.is_object() && e.contains("desc") && e["desc"].is_string();
      if (!has_desc) {
        return Fail(ErrorCode::kInvalidArgument,
                    fmt::format("{}: malformed QMP error reply to {} (no \"desc\" text): '{}'",
                                path_, label, Excerpt(reply->dump())));
      }
      const std::string cls = e.contains("class") && e["class"].is_string()
                                  ? e["class"].get<std::string>()
                                  : "no class";
      return Fail(ErrorCode::kUnavailable, fmt::format("{}: QEMU refused {}: {} ({})", path_, label,
                                                       e["desc"].get<std::string>(), cls));
    }
    if (!reply->contains("return")) {
      return Fail(ErrorCode::kInvalidArgument, fmt::format("{}: not a QMP answer to {}: '{}'",
                                                           path_, label, Excerpt(reply->dump())));
    }
    return (*reply)["return"];
  }

 private:
  Result<std::string> ReadLine(std::string_view what) {
    for (;;) {
      if (const size_t nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        return line;
      }
      if (buf_.size() > opt_.max_message_bytes) {
        return Fail(
            ErrorCode::kInvalidArgument,
            fmt::format("{}: a QMP message longer than {} bytes", path_, opt_.max_message_bytes));
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline_ - std::chrono::steady_clock::now())
                            .count();
      pollfd p{fd_, POLLIN, 0};
      const int r = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        return Fail(ErrorCode::kIo, fmt::format("{}: poll: {}", path_, std::strerror(errno)));
      if (r == 0) {
        return Fail(ErrorCode::kUnavailable,
                    fmt::format("{}: no answer within {} ms (for the whole exchange) while "
                                "waiting for {} (QEMU serves one QMP client at a time: is "
                                "another one connected?)",
                                path_, opt_.timeout_ms, what));
      }
      char chunk[65536];
      const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return Fail(ErrorCode::kUnavailable,
                    fmt::format("{}: recv: {}", path_, std::strerror(errno)));
      }
      if (n == 0) {
        return Fail(ErrorCode::kUnavailable,
                    buf_.empty()
                        ? fmt::format("{}: QEMU closed the connection before {}", path_, what)
                        : fmt::format("{}: not a QMP monitor: it sent '{}' and closed", path_,
                                      Excerpt(buf_)));
      }
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  std::string path_;
  QmpOptions opt_;
  std::chrono::steady_clock::time_point deadline_;
  int fd_ = -1;
  bool owns_fd_ = true;
  std::string buf_;
};

Result<std::string> Exchange(QmpConnection& c, const std::string& socket_path,
                             std::string_view command_line) {
  auto greeting = c.Next("a QMP greeting");
  if (!greeting) return Propagate(greeting);
  if (!greeting->contains("QMP")) {
    return Fail(ErrorCode::kInvalidArgument,
                fmt::format("{}: not a QMP monitor: its first message is '{}', not a QMP "
                            "greeting",
                            socket_path, Excerpt(greeting->dump())));
  }
  auto caps = c.Execute({{"execute", "qmp_capabilities"}, {"id", 1}}, "qmp_capabilities");
  if (!caps) return Propagate(caps);
  const std::string label = fmt::format("human-monitor-command '{}'", command_line);
  auto out = c.Execute({{"execute", "human-monitor-command"},
                        {"arguments", {{"command-line", std::string(command_line)}}},
                        {"id", 2}},
                       label);
  if (!out) return Propagate(out);
  if (!out->is_string()) {
    return Fail(ErrorCode::kInvalidArgument, fmt::format("{}: {} returned no text: '{}'",
                                                         socket_path, label, Excerpt(out->dump())));
  }
  std::string text = out->get<std::string>();
  std::string lf;
  lf.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    lf += text[i];
  }
  return lf;
}

}  // namespace

Result<std::string> QmpHumanMonitorCommand(const std::string& socket_path,
                                           std::string_view command_line,
                                           const QmpOptions& options) {
  QmpConnection c(socket_path, options);
  if (Status s = c.Connect(); !s) return Propagate(s);
  return Exchange(c, socket_path, command_line);
}

Result<std::string> QmpHumanMonitorCommandOnFd(int fd, const std::string& peer,
                                               std::string_view command_line,
                                               const QmpOptions& options) {
  QmpConnection c(peer, options);
  c.Adopt(fd);
  return Exchange(c, peer, command_line);
}

}  // namespace exitscope::sources
