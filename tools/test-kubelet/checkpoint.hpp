// The test kubelet's device checkpoint: what the kubelet's device manager stores after every
// Allocate (pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go, file
// /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint) and replays instead of asking the
// plugin again: on a container restart and a kubelet restart (manager.go
// GetDeviceRunContainerOptions reads podDevices; devicesToAllocate returns nothing to allocate
// for a container it already holds devices for), and after a node reboot, where the pods keep
// their UIDs. The JSON has upstream's shape (Data.PodDeviceEntries with PodUID, ContainerName,
// ResourceName, DeviceIDs by NUMA node, AllocResp as the marshalled ContainerAllocateResponse in
// base64; Data.RegisteredDevices); its Checksum is an FNV-1a 32 over the Data text, not
// upstream's (which hashes a Go dump of the object). docs/containerd-lines.md, "Checkpoint".
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "deviceplugin/api.hpp"

namespace gpufence::test {

struct CheckpointEntry {
  std::string pod_uid;
  std::string container;
  std::string resource;
  std::vector<std::string> ids;
  v1beta1::ContainerAllocateResponse response;
};

class DeviceCheckpoint {
 public:
  // An empty path: kept in memory only (the kubelet's podDevices between its restarts).
  explicit DeviceCheckpoint(std::filesystem::path path) : m_path(std::move(path)) {}

  // Reads the file when there is one (none: an empty checkpoint). False, with the reason, when it
  // is corrupt: the kubelet refuses to start on a checkpoint whose checksum does not match.
  bool load(std::string* error);
  // Writes it whole (a temporary file renamed over it, as the kubelet's checkpoint manager does).
  bool store(std::string* error) const;

  const CheckpointEntry* find(const std::string& pod_uid, const std::string& container) const;
  void insert(CheckpointEntry entry);   // replaces the container's entry
  std::vector<std::string> registered;  // RegisteredDevices of the resource

 private:
  std::filesystem::path m_path;
  std::vector<CheckpointEntry> m_entries;
};

}  // namespace gpufence::test
