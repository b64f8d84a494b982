// sources/qemu_qmp.h: a minimal client of QEMU's machine protocol (QMP) on a Unix socket,
// enough to run one human-monitor command on a live QEMU:
//
//   qemu-system-x86_64 ... -qmp unix:/run/vm1.qmp,server=on,wait=off
//   auto text = QmpHumanMonitorCommand("/run/vm1.qmp", "info mtree -f");
//
// The exchange: QEMU greets ({"QMP": {...}}), the client sends qmp_capabilities (leaving
// command mode negotiation), then human-monitor-command with the command line; the answer's
// "return" string is the monitor's output. Asynchronous events in between are skipped.
// Errors are one line naming the socket: no such socket, not a socket, connection refused
// (nobody listening), not a QMP monitor (e.g. an HMP `-monitor` socket), a QMP error reply
// (QEMU's class and description; an error reply without them is called malformed), no answer
// within the timeout (QEMU serves one QMP client at a time: another client holding the
// monitor looks like this). The timeout is one deadline for the whole exchange, from the
// connect to the answer: a peer that keeps sending events (or a byte at a time) cannot hold
// the caller longer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "exitscope/status.h"

namespace exitscope::sources {

struct QmpOptions {
  int timeout_ms = 5000;                 // for the whole exchange, not per message
  size_t max_message_bytes = 16u << 20;  // a longer line from QEMU is refused
};

// Returns the output of `command_line` (e.g. "info mtree -f"), with QEMU's "\r\n" line ends
// turned into "\n". Error codes: kNotFound (no socket there), kInvalidArgument (not a socket,
// not QMP, a malformed message), kUnavailable (refused, no answer, QEMU's error reply), kIo.
Result<std::string> QmpHumanMonitorCommand(const std::string& socket_path,
                                           std::string_view command_line,
                                           const QmpOptions& options = {});

// The same exchange over an already connected stream `fd` (left open), errors naming `peer`:
// for tests and the fuzz target (fuzz/qmp_fuzzer.cc), which play QEMU on a socketpair.
Result<std::string> QmpHumanMonitorCommandOnFd(int fd, const std::string& peer,
                                               std::string_view command_line,
                                               const QmpOptions& options = {});

}  // namespace exitscope::sources
