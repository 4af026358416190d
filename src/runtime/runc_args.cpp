#include "runtime/runc_args.hpp"

#include <unistd.h>

#include <set>

namespace gpufence {
namespace {

// runc 1.1 global flags that take a value (main.go).
const std::set<std::string, std::less<>> kGlobalValueFlags = {"root", "log", "log-format", "criu",
                                                              "rootless"};
// create/run/restore flags that take a value (create.go, run.go, restore.go); the rest are
// booleans.
const std::set<std::string, std::less<>> kCreateValueFlags = {
    "bundle",       "b",           "console-socket",   "pid-file",
    "preserve-fds", "image-path",  "work-path",        "manage-cgroups-mode",
    "empty-ns",     "lsm-profile", "lsm-mount-context"};

struct Flag {
  std::string name;
  bool has_inline_value = false;
  std::string value;
};

// "--root=/x" -> {root, /x}; "-b" -> {b}. Go's flag package accepts one or two dashes.
Flag read_flag(std::string_view arg) {
  arg.remove_prefix(arg.starts_with("--") ? 2 : 1);
  Flag f;
  if (auto eq = arg.find('='); eq != std::string_view::npos) {
    f.name = std::string(arg.substr(0, eq));
    f.has_inline_value = true;
    f.value = std::string(arg.substr(eq + 1));
  } else {
    f.name = std::string(arg);
  }
  return f;
}

bool is_flag(std::string_view arg) {
  return arg.size() > 1 && arg.front() == '-' && arg != "--";
}

std::string current_dir() {
  char buf[4096];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string(".");
}

}  // namespace

Result<RuncInvocation> parse_runc_args(const std::vector<std::string>& args) {
  RuncInvocation inv;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    if (args[i] == "--") {
      ++i;
      break;
    }
    if (!is_flag(args[i])) break;
    Flag f = read_flag(args[i]);
    if (kGlobalValueFlags.contains(f.name) && !f.has_inline_value) {
      if (i + 1 >= args.size()) return inv;  // runc itself reports the missing value
      f.value = args[++i];
    }
    if (f.name == "log") inv.log_path = f.value;
    if (f.name == "log-format") inv.log_format = f.value;
    if (f.name == "systemd-cgroup") inv.systemd_cgroup = f.value.empty() || f.value == "true";
  }
  if (i >= args.size()) return inv;  // `runc --version`, `runc --help`, or nothing
  inv.subcommand = args[i++];
  if (!inv.edits_spec()) return inv;

  for (; i < args.size(); ++i) {
    if (args[i] == "--") {
      ++i;
      break;
    }
    if (!is_flag(args[i])) break;  // Go's flag package stops at the first positional
    Flag f = read_flag(args[i]);
    if (!kCreateValueFlags.contains(f.name)) continue;
    if (!f.has_inline_value) {
      if (i + 1 >= args.size()) {
        return fail(Errc::invalid_argument, "flag --", f.name, " of '", inv.subcommand,
                    "' needs a value");
      }
      f.value = args[++i];
    }
    if (f.name == "bundle" || f.name == "b") inv.bundle = f.value;
  }
  if (i < args.size()) inv.container_id = args[i];
  if (inv.bundle.empty())
    inv.bundle = current_dir();
  else if (inv.bundle.front() != '/')
    inv.bundle = current_dir() + "/" + inv.bundle;
  return inv;
}

}  // namespace gpufence
