#include "install/runner.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <nlohmann/json.hpp>

namespace gpufence {

Result<ProcessResult> SystemProcessRunner::run(const std::vector<std::string>& argv) {
  // A restart that hangs (a unit stuck stopping) must not hang install: systemd's own default
  // stop timeout is 90 s (DefaultTimeoutStopSec), so two minutes is past any honest restart.
  ProcessOptions opt;
  opt.timeout = std::chrono::minutes(2);
  auto res = run_process(argv, opt);
  if (res && res->timed_out) return fail(Errc::io, "`", argv.front(), "` timed out after 2 min");
  return res;
}

std::vector<std::string> host_command(HostExec how, const std::vector<std::string>& argv, int pid) {
  if (how == HostExec::direct) return argv;
  std::vector<std::string> out = {"nsenter", "-t", std::to_string(pid), "-m", "-u", "-i", "-n",
                                  "-p",      "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

Result<std::vector<LoadedRuntime>> parse_cri_config_runtimes(std::string_view config_json) {
  auto doc = nlohmann::json::parse(config_json, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    return fail(Errc::parse, "CRI status info[\"config\"] is not a JSON object");
  auto containerd = doc.find("containerd");
  if (containerd == doc.end() || !containerd->is_object())
    return fail(Errc::parse, "CRI status config has no \"containerd\" object");
  auto runtimes = containerd->find("runtimes");
  if (runtimes == containerd->end() || !runtimes->is_object())
    return fail(Errc::parse, "CRI status config has no containerd.runtimes object");
  std::vector<LoadedRuntime> out;
  for (const auto& [name, rt] : runtimes->items()) {
    LoadedRuntime r;
    r.name = name;
    if (!rt.is_object()) {
      out.push_back(r);
      continue;
    }
    if (auto t = rt.find("runtimeType"); t != rt.end() && t->is_string()) r.runtime_type = *t;
    if (auto p = rt.find("runtimePath"); p != rt.end() && p->is_string()) r.runtime_path = *p;
    if (auto a = rt.find("PodAnnotations"); a != rt.end() && a->is_array())
      for (const auto& pattern : *a)
        if (pattern.is_string()) r.pod_annotations.push_back(pattern.get<std::string>());
    if (auto o = rt.find("options"); o != rt.end() && o->is_object()) {
      if (auto b = o->find("BinaryName"); b != o->end() && b->is_string())
        r.binary_name = b->get<std::string>();
    }
    out.push_back(std::move(r));
  }
  return out;
}

bool RuntimeProbe::nri_listening(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return false;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // A connection that sends nothing: containerd's NRI waits for a registration that never
  // comes and drops it (a line in its log), nothing else.
  bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace gpufence
