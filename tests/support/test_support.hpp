// Helpers shared by the tests: temporary trees, mock NVML configs, running binaries.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpufence::test {

// A temporary directory removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return m_path; }
  std::filesystem::path operator/(const std::string& rel) const { return m_path / rel; }
  // Writes `content` at `rel`, creating parent directories.
  std::filesystem::path write(const std::string& rel, const std::string& content) const;

 private:
  std::filesystem::path m_path;
};

// Whether `pred` holds within `timeout`, asked every 10 ms.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::string mock_nvml_library(const std::string& variant = "default");
std::string source_path(const std::string& rel);
std::string bin_path(const std::string& name);

// A mock NVML description of `count` GPUs named GPU-00000000-0000-0000-0000-00000000000<i>.
nlohmann::json mock_gpus(unsigned count);
std::string mock_uuid(unsigned i);

// A TCP connection to 127.0.0.1:port (close-on-exec), or -1.
int connect_loopback(int port);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs argv with extra environment entries ("K=V"), capturing stdout and stderr.
CommandResult run_command(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env = {},
                          const std::string& stdin_data = "");

// Every line of Prometheus' text format is a HELP/TYPE comment or `name{labels} value`, each
// label value made only of its escapes (\\, \", \n) and bytes other than a backslash, a quote
// and a newline. The first line that is not is put in `bad`.
bool prometheus_text_well_formed(const std::string& text, std::string* bad);

}  // namespace gpufence::test
