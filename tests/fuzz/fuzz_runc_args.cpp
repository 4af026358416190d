// libFuzzer target: runc command lines as containerd's shim passes them to gpufence-runtime.
// Input: the arguments after argv[0], separated by NUL bytes.
// Beyond "no crash", each reading is checked against what runc 1.1 does with the same bundle
// written canonically (the forms in tests/unit/test_runtime_runc_args.cpp were recorded from
// runc 1.1.5 itself):
//  - a create/run/restore always names an absolute bundle;
//  - the bundle comes from the command line (an argument, or the value after "="), else it is
//    the working directory;
//  - `<cmd> --bundle=<bundle> -- <id>` reads back as the same bundle and id, and so does the
//    same line behind containerd's global flags.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/runc_args.hpp"

using namespace gpufence;

namespace {

bool comes_from_args(const std::string& value, const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == value) return true;
    if (auto eq = a.find('='); eq != std::string::npos && a.substr(eq + 1) == value) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\0') {
      args.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (size > 0) args.push_back(std::move(current));

  RuncInvocation inv = parse_runc_args(args);
  if (!inv.edits_spec() || !inv.unreadable.empty()) return 0;
  if (inv.bundle.empty() || inv.bundle.front() != '/') std::abort();

  static const std::string cwd = [] {
    char buf[4096];
    return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string(".");
  }();
  bool from_cwd = inv.bundle == cwd;
  bool given = comes_from_args(inv.bundle, args) ||
               (inv.bundle.starts_with(cwd + "/") &&
                comes_from_args(inv.bundle.substr(cwd.size() + 1), args));
  if (!from_cwd && !given) std::abort();

  std::vector<std::string> canonical = {inv.subcommand, "--bundle=" + inv.bundle, "--",
                                        inv.container_id};
  RuncInvocation again = parse_runc_args(canonical);
  if (!again.unreadable.empty() || !again.edits_spec() || again.bundle != inv.bundle ||
      again.container_id != inv.container_id)
    std::abort();
  canonical.insert(canonical.begin(), {"--root", "/run/containerd/runc/k8s.io", "--log",
                                       "/run/x/log.json", "--log-format", "json"});
  RuncInvocation shim = parse_runc_args(canonical);
  if (!shim.unreadable.empty() || shim.bundle != inv.bundle || shim.log_path != "/run/x/log.json")
    std::abort();
  return 0;
}
