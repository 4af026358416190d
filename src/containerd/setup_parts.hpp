// `gpufence setup containerd` in files of one concern; internal to the containerd library
// (containerd/setup.hpp is its interface):
//   setup.cpp        reading the user's config, the handler's table, the plan for containerd's own
//                    config (versions 1-2 in place, 3+ as a drop-in), and verifying a result;
//   setup_k3s.cpp    k3s/rke2: a block in the config template they render;
//   setup_k0s.cpp    k0s: one drop-in of gpufence's own in /etc/k0s/containerd.d;
//   setup_nri.cpp    the NRI keys of install --enforcement nri|both;
//   setup_write.cpp  writing a plan: backups first, gpufence's own files, the RuntimeClass.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "containerd/config.hpp"
#include "containerd/setup.hpp"

namespace gpufence::setup_parts {

inline constexpr std::string_view kK3sBegin =
    "# --- gpufence: begin (managed by gpufence setup containerd) ---";
inline constexpr std::string_view kK3sEnd = "# --- gpufence: end ---";
inline constexpr std::string_view kAddedComment =
    "# Added by gpufence setup containerd: GPU pods with this RuntimeClass handler run "
    "gpufence-runtime.";
// Device plugin annotations reach the OCI spec only through this allow-list (containerd
// pkg/cri/config, container_annotations); gpufence-runtime reads the plugin's CDI annotation
// from there. See docs/containerd-setup.md.
inline constexpr std::string_view kCdiAnnotations = "cdi.k8s.io/*";

// What our change must guarantee, checked on the re-parsed result.
enum class DefaultRuntimeCheck { yes, no };  // no for a drop-in, whose runc lives elsewhere

// setup.cpp: the config, the handler, in place and drop-in
std::string serialize(const toml::table& doc);
toml::table& ensure_table(toml::table& parent, std::string_view key);
toml::table& cri_containerd(toml::table& doc, int version);
std::vector<std::string> containerd_key(int version);
std::vector<std::string> runtime_key(int version, const std::string& name);
toml::table handler_table(const toml::table* base, const std::string& base_name,
                          const std::string& binary, std::vector<std::string>& notes);
std::optional<std::string> appendable_handler(int version, const std::string& name,
                                              const toml::table& handler);
Status verify(const std::string& text, const std::string& origin, int version_hint,
              const SetupOptions& opt, const std::string& handler, bool handler_expected_here,
              DefaultRuntimeCheck check_default = DefaultRuntimeCheck::yes);
std::optional<std::string> if_equivalent(const std::optional<std::string>& edit,
                                         const toml::table& expected, const std::string& origin);
std::string with_newline(std::string text);
Status plan_in_place(const SetupOptions& opt, const std::string& path, const ContainerdConfig& cfg,
                     const std::string& old_text, bool existed, SetupPlan& plan);
void add_handler(toml::table& drop, int version, const ContainerdConfig& base,
                 const SetupOptions& opt, std::vector<std::string>& notes);
bool imports_path(const ContainerdConfig& cfg, const std::string& path);
Status plan_drop_in(const SetupOptions& opt, const std::string& path, const ContainerdConfig& cfg,
                    const std::string& old_text, bool existed, const ReadFile& read,
                    SetupPlan& plan);

// setup_k3s.cpp
std::string without_gpufence_block(std::string text, const std::string& path, Status& st);
std::set<std::string> runtime_tables(std::string_view text);
std::optional<int> version_line(std::string_view text);
std::string k3s_block(int version, const std::string& name, const std::string& binary);
Result<SetupPlan> plan_k3s(const SetupOptions& opt, const ReadFile& read,
                           const IsExecutable& executable);

// setup_nri.cpp
std::vector<std::string> nri_key();
std::vector<std::string> validator_key();
const toml::table* validator_table(const ContainerdConfig& cfg);
toml::array required_plugins_with(const ContainerdConfig& base,
                                  const std::vector<std::string>& ours);
bool drops_earlier_waiver(const toml::table* validator, const NriEdit& nri);
void apply_nri(toml::table& doc, const ContainerdConfig& base, const NriEdit& nri);
std::optional<std::string> edit_toml_key_line(std::string_view text,
                                              const std::vector<std::string>& table,
                                              std::string_view key,
                                              std::optional<std::string_view> value_toml);
std::optional<std::string> apply_nri_text(std::optional<std::string> text,
                                          const ContainerdConfig& base, const NriEdit& nri);
Status verify_nri(const std::string& text, const std::string& origin, const NriEdit& nri);

// setup_k0s.cpp
bool k0s_managed(std::string_view text);
ContainerdConfig k0s_base_config(const ContainerdConfig& root, const ReadFile& read);
Result<SetupPlan> plan_k0s(const SetupOptions& opt, const ReadFile& read);

}  // namespace gpufence::setup_parts
