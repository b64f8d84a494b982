// cli/commands.h: the `exitscope` subcommands. Each takes argv with argv[0] naming the
// subcommand ("exitscope run"), parses its own flags with CLI11 and returns the process exit
// status: 0 success, 1 runtime failure, 2 bad usage or bad input (one line on stderr).
#pragma once

namespace exitscope::cli {

int RunMain(int argc, char** argv);        // cmd_run.cc: the reference VMM
int InspectMain(int argc, char** argv);    // cmd_inspect.cc: summarise a recorder dump
int KvmMain(int argc, char** argv);        // cmd_kvm.cc: kernel-side analysis; dispatches:
int KvmRecordMain(int argc, char** argv);  // cmd_kvm_record.cc: `exitscope kvm record`
int KvmLiveMain(int argc, char** argv);    // cmd_kvm_live.cc: `exitscope kvm live`
int KvmStatMain(int argc, char** argv);    // cmd_kvm_stat.cc: `exitscope kvm stat [--bpf]`
int TimelineMain(int argc, char** argv);   // cmd_timeline.cc: Trace Event JSON timeline

}  // namespace exitscope::cli
