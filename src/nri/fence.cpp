#include "nri/fence.hpp"

#include "common/escape.hpp"
#include "common/strings.hpp"
#include "nri/status.hpp"
#include "runtime/config.hpp"

namespace gpufence::nri {

std::optional<std::string> fence_rejection(const api::ValidateContainerAdjustmentRequest& request,
                                           std::string_view decider) {
  const auto& container = request.container();
  const std::string key(kDecidedAnnotation);
  const auto& marks = request.adjust().annotations();
  auto mark = marks.find(key);
  if (container.id().empty()) return "the runtime named no container id";
  if (mark == marks.end() || mark->second != container.id())
    return cat(decider, " did not decide this container (it timed out, failed or is not running)");
  // The mark must be the decider's own, not another plugin's stamp.
  std::string owner;
  if (auto per = request.owners().owners().find(container.id());
      per != request.owners().owners().end()) {
    if (auto field = per->second.compound().find(kFieldAnnotations);
        field != per->second.compound().end()) {
      if (auto o = field->second.owners().find(key); o != field->second.owners().end())
        owner = o->second;
    }
  }
  // Owners are "NN-name" (nri@v0.12.0 pkg/adaptation/plugin.go name()).
  auto dash = owner.find('-');
  if (dash == std::string::npos || std::string_view(owner).substr(dash + 1) != decider)
    return cat("the mark of ", decider, " was set by ",
               owner.empty() ? std::string("no known plugin") : escape_excerpt(owner), ", not by ",
               decider);
  return std::nullopt;
}

uint32_t FenceHandler::events() const {
  return event_bit(api::VALIDATE_CONTAINER_ADJUSTMENT);
}

Status FenceHandler::configured(const RuntimeInfo& runtime) {
  // A launched fence's .conf is a runtime.toml like the decider's: only its log is read here.
  if (!runtime.config.empty()) {
    auto config = parse_runtime_config(runtime.config, "the NRI plugin config");
    if (!config) return std::unexpected(config.error());
    if (!config->log_file.empty())
      if (auto st = m_log.open_file(config->log_file); !st)
        m_log.warn("nri.log_file_unavailable", {{"error", st.error().message}});
  }
  m_log.info("nri.fence_configured", {{"runtime", runtime.name},
                                      {"version", runtime.version},
                                      {"nri", runtime.nri_text()},
                                      {"decider", m_decider}});
  if (!runtime.nri || *runtime.nri < NriVersion{0, 10, 0})
    return fail(Errc::unsupported,
                "gpufence-fence needs adjustment validation (NRI v0.10, "
                "containerd 2.2+); ",
                runtime.name, " ", runtime.version, " speaks NRI ", runtime.nri_text(),
                " (docs/nri.md)");
  return {};
}

api::ValidateContainerAdjustmentResponse FenceHandler::validate(
    const api::ValidateContainerAdjustmentRequest& request) {
  api::ValidateContainerAdjustmentResponse out;
  auto why = fence_rejection(request, m_decider);
  const auto& pod = request.pod();
  if (!why) return out;
  out.set_reject(true);
  out.set_reason(
      bounded_line(cat("gpufence-fence: container ", escape_excerpt(request.container().name()),
                       " of pod ", escape_excerpt(pod.namespace_()), "/",
                       escape_excerpt(pod.name()), ": ", *why, "; created nothing (docs/nri.md)"),
                   kMaxStatusMessageBytes));
  m_log.error("nri.fenced", {{"container", request.container().id()},
                             {"pod", cat(pod.namespace_(), "/", pod.name())},
                             {"name", request.container().name()},
                             {"why", *why}});
  return out;
}

}  // namespace gpufence::nri
