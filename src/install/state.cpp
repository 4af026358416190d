#include "install/state.hpp"

#include <nlohmann/json.hpp>

namespace gpufence {
namespace {

nlohmann::ordered_json file_json(const InstallState::ManagedFile& f) {
  return {{"path", f.path}, {"existed", f.existed}, {"backup", f.backup}, {"written", f.written}};
}

// "written" was one string before every text was kept.
InstallState::ManagedFile parse_file(const nlohmann::json& f) {
  InstallState::ManagedFile out{f.at("path").get<std::string>(),
                                f.at("existed").get<bool>(),
                                f.value("backup", std::string()),
                                {}};
  const auto& w = f.at("written");
  if (w.is_string())
    out.written.push_back(w.get<std::string>());
  else
    out.written = w.get<std::vector<std::string>>();
  return out;
}

}  // namespace

std::string install_state_to_json(const InstallState& s) {
  nlohmann::ordered_json j;
  j["phase"] = s.phase;
  j["steps"] = s.steps;
  j["distribution"] = s.distribution;
  j["runtimeName"] = s.runtime_name;
  j["socket"] = s.socket;
  j["restart"] = s.restart;
  j["enforcement"] = s.enforcement;
  if (!s.nri_socket.empty()) j["nriSocket"] = s.nri_socket;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const auto& f : s.config_files) files.push_back(file_json(f));
  j["config"] = {{"path", s.config_path}, {"changed", s.config_changed}, {"files", files}};
  if (s.runtime_config_path)
    j["runtimeConfig"] = {{"path", *s.runtime_config_path},
                          {"written", s.runtime_config_written.value_or("")}};
  if (s.cdi_spec) j["cdiSpec"] = file_json(*s.cdi_spec);
  j["binary"] = {{"link", s.binary_link}, {"versionsDir", s.versions_dir}};
  if (!s.nri_binary_link.empty()) {
    j["nriPlugin"] = {{"binaryLink", s.nri_binary_link}, {"pluginLink", s.nri_plugin_link}};
    if (!s.nri_fence_link.empty()) j["nriPlugin"]["fenceLink"] = s.nri_fence_link;
  }
  j["createdDirs"] = s.created_dirs;
  return j.dump(2) + "\n";
}

Result<InstallState> parse_install_state(std::string_view text, std::string_view origin) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail(Errc::parse, origin, ": not a JSON object");
  InstallState s;
  try {
    s.phase = j.value("phase", std::string("installed"));
    if (j.contains("steps")) s.steps = j.at("steps").get<std::vector<std::string>>();
    s.distribution = j.at("distribution").get<std::string>();
    s.runtime_name = j.at("runtimeName").get<std::string>();
    s.socket = j.at("socket").get<std::string>();
    s.restart = j.at("restart").get<std::vector<std::string>>();
    s.enforcement = j.value("enforcement", std::string("runtime"));
    s.nri_socket = j.value("nriSocket", std::string());
    const auto& c = j.at("config");
    s.config_path = c.at("path").get<std::string>();
    s.config_changed = c.at("changed").get<bool>();
    if (c.contains("files")) {
      for (const auto& f : c.at("files")) s.config_files.push_back(parse_file(f));
    } else if (s.config_changed) {  // the record of an install before drop-ins were recorded
      s.config_files.push_back({s.config_path,
                                c.at("existed").get<bool>(),
                                c.at("backup").get<std::string>(),
                                {c.at("written").get<std::string>()}});
    }
    if (j.contains("runtimeConfig")) {
      s.runtime_config_path = j["runtimeConfig"].at("path").get<std::string>();
      s.runtime_config_written = j["runtimeConfig"].at("written").get<std::string>();
    }
    if (j.contains("cdiSpec")) {
      if (j["cdiSpec"].is_string())  // a spec install created, from before texts were kept
        s.cdi_spec = InstallState::ManagedFile{j["cdiSpec"].get<std::string>(), false, "", {}};
      else
        s.cdi_spec = parse_file(j["cdiSpec"]);
    }
    s.binary_link = j.at("binary").at("link").get<std::string>();
    s.versions_dir = j.at("binary").at("versionsDir").get<std::string>();
    if (j.contains("nriPlugin")) {
      s.nri_binary_link = j["nriPlugin"].at("binaryLink").get<std::string>();
      s.nri_plugin_link = j["nriPlugin"].at("pluginLink").get<std::string>();
      s.nri_fence_link = j["nriPlugin"].value("fenceLink", std::string());
    }
    if (j.contains("createdDirs"))
      s.created_dirs = j.at("createdDirs").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    return fail(Errc::parse, origin, ": ", e.what());
  }
  if (s.enforcement != "runtime" && s.enforcement != "nri" && s.enforcement != "both")
    return fail(Errc::parse, origin, ": enforcement must be runtime, nri or both");
  if (s.phase != "installing" && s.phase != "installed")
    return fail(Errc::parse, origin, ": phase must be installing or installed");
  if (s.config_path.empty() || s.binary_link.empty())
    return fail(Errc::parse, origin, ": config.path and binary.link must be set");
  if (s.config_changed && s.config_files.empty())
    return fail(Errc::parse, origin, ": config.changed without config.files");
  for (const auto& f : s.config_files) {
    if (f.path.empty() || (f.existed && f.backup.empty()))
      return fail(Errc::parse, origin,
                  ": a config.files entry needs a path, and a backup if it existed");
  }
  if (s.cdi_spec &&
      (s.cdi_spec->path.empty() || (s.cdi_spec->existed && s.cdi_spec->backup.empty())))
    return fail(Errc::parse, origin, ": cdiSpec needs a path, and a backup if it existed");
  return s;
}

}  // namespace gpufence
