// tests/metrics/metrics_text.h: what the metrics tests need to read an endpoint: an HTTP GET
// over a plain socket and a parser for the Prometheus text exposition format.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exitscope::testing {

// GET http://host:port/path; returns the body of a 200 response, nullopt otherwise.
inline std::optional<std::string> HttpGet(const std::string& host, uint16_t port,
                                          const std::string& path, int* status = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  timeval tv{10, 0};  // per receive, and for connect and send (SO_SNDTIMEO bounds connect)
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  const std::string req =
      "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return std::nullopt;
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t sp = resp.find(' ');
  const int code = sp == std::string::npos ? 0 : std::atoi(resp.c_str() + sp + 1);
  if (status != nullptr) *status = code;
  const size_t body = resp.find("\r\n\r\n");
  if (code != 200 || body == std::string::npos) return std::nullopt;
  return resp.substr(body + 4);
}

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses sample lines ("name{k="v",...} value"); comments and blank lines are skipped. A line
// that does not parse makes the result empty and sets *error.
inline std::vector<Sample> ParseExposition(std::string_view text, std::string* error) {
  std::vector<Sample> out;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = std::string(line.substr(0, i));
    auto fail = [&](const char* why) {
      *error = "line " + std::to_string(line_no) + ": " + why + ": " + std::string(line);
      return std::vector<Sample>{};
    };
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"')
          return fail("bad label");
        std::string key(line.substr(i, eq - i)), value;
        i = eq + 2;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value.push_back(line[i] == 'n' ? '\n' : line[i]);
          } else {
            value.push_back(line[i]);
          }
          ++i;
        }
        if (i >= line.size()) return fail("unterminated label value");
        ++i;  // closing quote
        if (i < line.size() && line[i] == ',') ++i;
        s.labels[key] = value;
      }
      if (i >= line.size()) return fail("unterminated labels");
      ++i;  // '}'
    }
    if (i >= line.size() || line[i] != ' ') return fail("no value");
    const std::string value(line.substr(i + 1));
    char* end = nullptr;
    s.value = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) return fail("bad value");
    out.push_back(std::move(s));
  }
  return out;
}

// Samples named `name` whose labels include every one of `want`.
inline std::vector<Sample> Select(const std::vector<Sample>& all, std::string_view name,
                                  const std::map<std::string, std::string>& want = {}) {
  std::vector<Sample> out;
  for (const Sample& s : all) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : want) {
      auto it = s.labels.find(k);
      const std::string have = it == s.labels.end() ? "" : it->second;
      if (have != v) ok = false;
    }
    if (ok) out.push_back(s);
  }
  return out;
}

}  // namespace exitscope::testing
