#include "checkpoint.hpp"

#include <cstdint>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/base64.hpp"

namespace gpufence::test {

using gpufence::base64_decode;
using gpufence::base64_encode;

namespace {

uint32_t fnv1a32(std::string_view text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return h;
}

}  // namespace

bool DeviceCheckpoint::load(std::string* error) {
  if (m_path.empty()) return true;  // in memory only
  std::ifstream in(m_path);
  if (!in) return true;  // no checkpoint yet: a node's first start
  std::stringstream text;
  text << in.rdbuf();
  auto fail = [&](const std::string& why) {
    *error = "checkpoint " + m_path.string() + ": " + why;
    return false;
  };
  auto doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("Data") ||
      !doc["Checksum"].is_number_unsigned())
    return fail("not a device manager checkpoint");
  const auto& data = doc["Data"];
  if (fnv1a32(data.dump()) != doc["Checksum"].get<uint32_t>()) return fail("checksum mismatch");
  try {
    m_entries.clear();
    for (const auto& e : data.at("PodDeviceEntries")) {
      CheckpointEntry entry;
      entry.pod_uid = e.at("PodUID").get<std::string>();
      entry.container = e.at("ContainerName").get<std::string>();
      entry.resource = e.at("ResourceName").get<std::string>();
      for (const auto& [numa, ids] : e.at("DeviceIDs").items())
        for (const auto& id : ids) entry.ids.push_back(id.get<std::string>());
      auto bytes = base64_decode(e.at("AllocResp").get<std::string>());
      if (!bytes || !entry.response.ParseFromString(*bytes))
        return fail("AllocResp of " + entry.pod_uid + "/" + entry.container + " does not decode");
      m_entries.push_back(std::move(entry));
    }
    registered.clear();
    for (const auto& [resource, ids] : data.at("RegisteredDevices").items())
      for (const auto& id : ids) registered.push_back(id.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    return fail(e.what());
  }
  return true;
}

bool DeviceCheckpoint::store(std::string* error) const {
  if (m_path.empty()) return true;
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : m_entries) {
    std::string bytes;
    e.response.SerializeToString(&bytes);
    // Upstream keys DeviceIDs by NUMA node; the stand-in has no topology manager: "-1".
    entries.push_back({{"PodUID", e.pod_uid},
                       {"ContainerName", e.container},
                       {"ResourceName", e.resource},
                       {"DeviceIDs", {{"-1", e.ids}}},
                       {"AllocResp", base64_encode(bytes)}});
  }
  nlohmann::json data = {{"PodDeviceEntries", entries},
                         {"RegisteredDevices", {{"nvidia.com/gpu", registered}}}};
  nlohmann::json doc = {{"Data", data}, {"Checksum", fnv1a32(data.dump())}};
  auto tmp = m_path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << doc.dump() << "\n";
    if (!out) {
      *error = "checkpoint " + tmp.string() + ": cannot write";
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, m_path, ec);
  if (ec) {
    *error = "checkpoint " + m_path.string() + ": " + ec.message();
    return false;
  }
  return true;
}

const CheckpointEntry* DeviceCheckpoint::find(const std::string& pod_uid,
                                              const std::string& container) const {
  for (const auto& e : m_entries)
    if (e.pod_uid == pod_uid && e.container == container) return &e;
  return nullptr;
}

void DeviceCheckpoint::insert(CheckpointEntry entry) {
  std::erase_if(m_entries, [&](const CheckpointEntry& e) {
    return e.pod_uid == entry.pod_uid && e.container == entry.container;
  });
  m_entries.push_back(std::move(entry));
}

}  // namespace gpufence::test
