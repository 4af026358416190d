#include "runtime/runc_args.hpp"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>

#include "common/error.hpp"

namespace gpufence {
namespace {

enum class FlagKind { value, boolean };

// A urfave/cli v1 flag: its names as urfave spells them ("bundle, b"), and whether Go's flag
// package reads a value after it.
struct FlagSpec {
  std::string_view names;
  FlagKind kind;
};

// urfave/cli v1 adds these to the app and to every command (HelpFlag, VersionFlag).
constexpr FlagSpec kHelp{"help, h", FlagKind::boolean};

// runc 1.1 main.go's app flags.
const std::vector<FlagSpec> kGlobalFlags = {
    {"debug", FlagKind::boolean},      {"log", FlagKind::value},
    {"log-format", FlagKind::value},   {"root", FlagKind::value},
    {"criu", FlagKind::value},         {"systemd-cgroup", FlagKind::boolean},
    {"rootless", FlagKind::value},     kHelp,
    {"version, v", FlagKind::boolean},
};

// create.go, run.go and restore.go of runc 1.1 (the same lists `runc <cmd> --help` prints).
const std::vector<FlagSpec> kCreateFlags = {
    {"bundle, b", FlagKind::value},
    {"console-socket", FlagKind::value},
    {"pid-file", FlagKind::value},
    {"no-pivot", FlagKind::boolean},
    {"no-new-keyring", FlagKind::boolean},
    {"preserve-fds", FlagKind::value},
    kHelp,
};
const std::vector<FlagSpec> kRunFlags = {
    {"bundle, b", FlagKind::value},    {"console-socket", FlagKind::value},
    {"detach, d", FlagKind::boolean},  {"keep", FlagKind::boolean},
    {"pid-file", FlagKind::value},     {"no-subreaper", FlagKind::boolean},
    {"no-pivot", FlagKind::boolean},   {"no-new-keyring", FlagKind::boolean},
    {"preserve-fds", FlagKind::value}, kHelp,
};
const std::vector<FlagSpec> kRestoreFlags = {
    {"console-socket", FlagKind::value},
    {"image-path", FlagKind::value},
    {"work-path", FlagKind::value},
    {"tcp-established", FlagKind::boolean},
    {"ext-unix-sk", FlagKind::boolean},
    {"shell-job", FlagKind::boolean},
    {"file-locks", FlagKind::boolean},
    {"manage-cgroups-mode", FlagKind::value},
    {"bundle, b", FlagKind::value},
    {"detach, d", FlagKind::boolean},
    {"pid-file", FlagKind::value},
    {"no-subreaper", FlagKind::boolean},
    {"no-pivot", FlagKind::boolean},
    {"empty-ns", FlagKind::value},
    {"auto-dedup", FlagKind::boolean},
    {"lazy-pages", FlagKind::boolean},
    {"lsm-profile", FlagKind::value},
    {"lsm-mount-context", FlagKind::value},
    kHelp,
};

// urfave splits a flag's Name on ',' and trims spaces.
std::vector<std::string_view> names_of(const FlagSpec& f) {
  std::vector<std::string_view> out;
  std::string_view rest = f.names;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view n = rest.substr(0, comma);
    while (!n.empty() && n.front() == ' ') n.remove_prefix(1);
    while (!n.empty() && n.back() == ' ') n.remove_suffix(1);
    out.push_back(n);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

const FlagSpec* find_flag(const std::vector<FlagSpec>& table, std::string_view name) {
  for (const auto& f : table)
    for (auto n : names_of(f))
      if (n == name) return &f;
  return nullptr;
}

// Go's strconv.ParseBool.
std::optional<bool> go_parse_bool(std::string_view s) {
  for (std::string_view t : {"1", "t", "T", "TRUE", "true", "True"})
    if (s == t) return true;
  for (std::string_view f : {"0", "f", "F", "FALSE", "false", "False"})
    if (s == f) return false;
  return std::nullopt;
}

struct ParsedFlags {
  std::map<std::string, std::string, std::less<>> values;  // by the name used; the last wins
  std::vector<std::string> positional;
  std::string error;  // Go's or urfave's message, as runc prints it after "Incorrect Usage"
};

// Go's flag.FlagSet.Parse (flag.go parseOne): "-name", "--name", "-name=value"; a value flag
// takes the next argument whatever it is; "--" ends the flags and is dropped; the first
// argument that is not a flag ("-" included) ends them and is kept.
ParsedFlags go_flag_parse(const std::vector<FlagSpec>& table,
                          const std::vector<std::string>& args) {
  ParsedFlags out;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    std::string_view s = args[i];
    if (s.size() < 2 || s[0] != '-') break;
    size_t minuses = 1;
    if (s[1] == '-') {
      minuses = 2;
      if (s.size() == 2) {
        ++i;
        break;
      }
    }
    std::string_view name = s.substr(minuses);
    if (name.empty() || name[0] == '-' || name[0] == '=') {
      out.error = cat("bad flag syntax: ", s);
      return out;
    }
    std::optional<std::string_view> value;
    if (size_t eq = name.find('=', 1); eq != std::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* f = find_flag(table, name);
    if (!f) {
      out.error = cat("flag provided but not defined: -", name);
      return out;
    }
    if (f->kind == FlagKind::boolean) {
      std::optional<bool> b = value ? go_parse_bool(*value) : true;
      if (!b) {
        out.error = cat("invalid boolean value \"", *value, "\" for -", name, ": parse error");
        return out;
      }
      out.values[std::string(name)] = *b ? "true" : "false";
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        out.error = cat("flag needs an argument: -", name);
        return out;
      }
      value = args[++i];
    }
    out.values[std::string(name)] = std::string(*value);
  }
  out.positional.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return out;
}

// urfave/cli v1 normalizeFlags: a flag with several names may be given under one of them only
// ("Cannot use two forms of the same flag: b bundle"); its value is then read under every name.
std::optional<std::string> normalize(const std::vector<FlagSpec>& table, ParsedFlags& parsed) {
  for (const auto& f : table) {
    auto names = names_of(f);
    if (names.size() < 2) continue;
    std::optional<std::string_view> used;
    for (auto n : names) {
      if (!parsed.values.contains(n)) continue;
      if (used) return cat("Cannot use two forms of the same flag: ", n, " ", *used);
      used = n;
    }
    if (!used) continue;
    std::string v = parsed.values.find(*used)->second;
    for (auto n : names) parsed.values[std::string(n)] = v;
  }
  return std::nullopt;
}

// urfave/cli v1.22 argIsFlag: "--name", "-name" or either with "=value", for a name of this
// command. It strips the first two '-' and then one more, as strings.Replace does.
bool arg_is_flag(const std::vector<FlagSpec>& table, std::string_view arg) {
  if (arg == "-" || arg == "--" || !arg.starts_with('-')) return false;
  if (arg.starts_with("--")) arg.remove_prefix(2);
  if (arg.starts_with('-')) arg.remove_prefix(1);
  arg = arg.substr(0, arg.find('='));
  return find_flag(table, arg) != nullptr;
}

// urfave/cli v1.22 reorderArgs (Command.parseFlags, unless SkipArgReorder, which create, run
// and restore do not set): the command's own flags, each with the argument after it when that
// is not itself one of its flags and the flag has no "=", go in front; every other argument
// keeps its order behind them; a "--" that is not such a value ends the reordering and moves to
// the front of the rest. Measured on runc 1.1.5: `create ID --bundle B` runs B;
// `create ID --bundle --` runs the bundle "--"; `create ID --` runs the working directory.
std::vector<std::string> reorder_args(const std::vector<FlagSpec>& table,
                                      const std::vector<std::string>& args) {
  std::vector<std::string> reordered, remaining;
  bool next_may_be_value = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (next_may_be_value && !arg_is_flag(table, arg)) {
      next_may_be_value = false;
      reordered.push_back(arg);
    } else if (arg == "--") {
      remaining.insert(remaining.begin(), "--");
      remaining.insert(remaining.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                       args.end());
      break;
    } else if (arg_is_flag(table, arg)) {
      reordered.push_back(arg);
      next_may_be_value = arg.find('=') == std::string::npos;
    } else {
      remaining.push_back(arg);
    }
  }
  reordered.insert(reordered.end(), remaining.begin(), remaining.end());
  return reordered;
}

const std::vector<FlagSpec>* command_flags(std::string_view command) {
  if (command == "create") return &kCreateFlags;
  if (command == "run") return &kRunFlags;
  if (command == "restore") return &kRestoreFlags;
  return nullptr;
}

std::string value_of(const ParsedFlags& p, std::string_view name) {
  auto it = p.values.find(name);
  return it == p.values.end() ? std::string() : it->second;
}

std::string current_dir() {
  char buf[4096];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string(".");
}

}  // namespace

RuncInvocation parse_runc_args(const std::vector<std::string>& args) {
  RuncInvocation inv;

  // Step 1: the app's flags (urfave App.Run: Go's flag package, no reordering).
  ParsedFlags global = go_flag_parse(kGlobalFlags, args);
  if (global.error.empty())
    if (auto err = normalize(kGlobalFlags, global)) global.error = *err;
  inv.log_path = value_of(global, "log");
  inv.log_format = value_of(global, "log-format");
  inv.systemd_cgroup = value_of(global, "systemd-cgroup") == "true";
  if (!global.error.empty()) {
    inv.unreadable = cat("runc 1.1 rejects its global flags: ", global.error);
    return inv;
  }
  // `runc --help create ...` and `runc --version create ...` print and exit before any command.
  if (value_of(global, "help") == "true" || value_of(global, "version") == "true") return inv;
  if (global.positional.empty()) return inv;  // runc shows its help

  // Step 2: the command: the first positional. Only the ones that create from the spec matter.
  inv.subcommand = global.positional.front();
  const std::vector<FlagSpec>* table = command_flags(inv.subcommand);
  if (!table) return inv;

  // Step 3: its flags, after urfave moved them in front of the positionals.
  std::vector<std::string> rest(global.positional.begin() + 1, global.positional.end());
  ParsedFlags cmd = go_flag_parse(*table, reorder_args(*table, rest));
  if (cmd.error.empty())
    if (auto err = normalize(*table, cmd)) cmd.error = *err;
  if (!cmd.error.empty()) {
    inv.unreadable = cat("runc 1.1 rejects the flags of '", inv.subcommand, "': ", cmd.error);
    return inv;
  }
  // urfave's checkCommandHelp comes before the action: help, and nothing is created.
  if (value_of(cmd, "help") == "true") {
    inv.help = true;
    return inv;
  }

  // Step 4: the action's checkArgs(context, 1, exactArgs) and setupSpec's chdir(bundle).
  if (cmd.positional.size() != 1) {
    inv.unreadable = cat("runc 1.1 requires exactly one container id after '", inv.subcommand,
                         "' and its flags; this command line has ", cmd.positional.size());
    return inv;
  }
  inv.container_id = cmd.positional.front();
  inv.bundle = value_of(cmd, "bundle");
  if (inv.bundle.empty())
    inv.bundle = current_dir();
  else if (inv.bundle.front() != '/')
    inv.bundle = current_dir() + "/" + inv.bundle;
  return inv;
}

}  // namespace gpufence
