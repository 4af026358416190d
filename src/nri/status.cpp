#include "nri/status.hpp"

#include <chrono>
#include <nlohmann/json.hpp>

#include "common/file.hpp"
#include "common/strings.hpp"
#include "common/utc_time.hpp"

namespace gpufence::nri {

namespace {
using Json = nlohmann::ordered_json;
constexpr std::pair<NriState, std::string_view> kStates[] = {{NriState::connected, "connected"},
                                                             {NriState::waiting, "waiting"},
                                                             {NriState::exited, "exited"}};
}  // namespace

std::string_view nri_state_name(NriState s) {
  for (const auto& [state, name] : kStates)
    if (state == s) return name;
  return "unknown";
}

void NriDecisionCounters::observe(std::string_view outcome, std::string_view refusal,
                                  double seconds) {
  ++outcomes[std::string(outcome)];
  if (!refusal.empty()) ++refusals[std::string(refusal)];
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (seconds <= kBuckets[i]) ++buckets[i];
  ++count;
  sum_seconds += seconds;
}

std::string render_nri_status(const NriStatus& s) {
  Json unenforced = Json::array();
  for (const auto& c : s.unenforced)
    unenforced.push_back({{"id", c.id},
                          {"pod", c.pod},
                          {"name", c.name},
                          {"runtime_handler", c.runtime_handler},
                          {"why", c.why}});
  Json j = {{"pid", s.pid},
            {"start_time", s.start_time},
            {"state", nri_state_name(s.state)},
            {"since", s.since},
            {"socket", s.socket},
            {"runtime", s.runtime},
            {"runtime_version", s.runtime_version},
            {"nri_version", s.nri_version},
            {"device_rules", s.device_rules},
            {"synchronized_at", s.synchronized_at},
            {"containers", s.containers},
            {"without_gpu_edit", s.without_gpu_edit},
            {"judgement", s.judgement_stale ? "stale" : "current"},
            {"unenforced", unenforced},
            {"decisions",
             {{"outcomes", s.decisions.outcomes},
              {"refusals", s.decisions.refusals},
              {"buckets", s.decisions.buckets},
              {"count", s.decisions.count},
              {"sum_seconds", s.decisions.sum_seconds}}}};
  // Pod-controlled names are JSON strings here (escaped by the encoder; invalid UTF-8 replaced);
  // the doctor escapes them again for its report.
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

Result<NriStatus> parse_nri_status(std::string_view text, std::string_view origin) {
  Json j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return fail(Errc::parse, origin, ": not a JSON object");
  NriStatus s;
  try {
    s.pid = j.at("pid").get<int64_t>();
    s.start_time = j.at("start_time").get<uint64_t>();
    const std::string state = j.at("state").get<std::string>();
    bool known = false;
    for (const auto& [value, name] : kStates)
      if (name == state) s.state = value, known = true;
    if (!known) return fail(Errc::parse, origin, ": unknown state '", state, "'");
    s.since = j.value("since", "");
    s.socket = j.value("socket", "");
    s.runtime = j.value("runtime", "");
    s.runtime_version = j.value("runtime_version", "");
    s.nri_version = j.value("nri_version", "");
    s.device_rules = j.value("device_rules", false);
    s.synchronized_at = j.value("synchronized_at", "");
    s.containers = j.value("containers", int64_t{0});
    s.without_gpu_edit = j.value("without_gpu_edit", int64_t{0});
    s.judgement_stale = j.value("judgement", "current") == "stale";
    for (const auto& c : j.value("unenforced", Json::array()))
      s.unenforced.push_back({c.at("id").get<std::string>(), c.value("pod", ""),
                              c.value("name", ""), c.value("runtime_handler", ""),
                              c.value("why", "")});
    if (auto d = j.find("decisions"); d != j.end() && d->is_object()) {
      s.decisions.outcomes = d->value("outcomes", std::map<std::string, uint64_t>{});
      s.decisions.refusals = d->value("refusals", std::map<std::string, uint64_t>{});
      auto buckets = d->value("buckets", std::vector<uint64_t>{});
      if (buckets.size() == s.decisions.buckets.size())
        std::copy(buckets.begin(), buckets.end(), s.decisions.buckets.begin());
      s.decisions.count = d->value("count", uint64_t{0});
      s.decisions.sum_seconds = d->value("sum_seconds", 0.0);
    }
  } catch (const Json::exception& e) {
    return fail(Errc::parse, origin, ": ", e.what());
  }
  if (s.pid <= 0) return fail(Errc::parse, origin, ": pid ", s.pid, " is not a process");
  return s;
}

Result<uint64_t> parse_proc_start_time(std::string_view stat_line) {
  auto close = stat_line.rfind(')');
  if (close == std::string_view::npos) return fail(Errc::parse, "no ')' in a /proc stat line");
  // After "pid (comm)": field 3 (state) is the first; starttime is field 22, the 20th after it.
  std::vector<std::string_view> fields;
  for (auto f : split(trim(stat_line.substr(close + 1)), ' '))
    if (!f.empty()) fields.push_back(f);
  if (fields.size() < 20) return fail(Errc::parse, "a /proc stat line with too few fields");
  auto value = parse_number<uint64_t>(fields[19]);
  if (!value) return fail(Errc::parse, "starttime '", std::string(fields[19]), "' is not a number");
  return *value;
}

Status write_nri_status(const std::string& path, const NriStatus& s) {
  if (path.empty() || path.front() != '/')
    return fail(Errc::invalid_argument, "status file '", path, "' is not an absolute path");
  return write_file_atomic(path, render_nri_status(s), Durability::none, Symlinks::none,
                           MakeDir::yes);
}

std::string utc_now_text() {
  return utc_rfc3339(std::chrono::system_clock::now(), SubSecond::none);
}

}  // namespace gpufence::nri
