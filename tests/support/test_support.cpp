#include "support/test_support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "common/process.hpp"

extern char** environ;

namespace gpufence::test {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "gpufence-test-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  m_path = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(m_path, ec);
}

std::filesystem::path TempDir::write(const std::string& rel, const std::string& content) const {
  auto p = m_path / rel;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

std::string mock_nvml_library(const std::string& variant) {
  return std::string(GPUFENCE_MOCK_NVML_DIR) + "/" + variant + "/libnvidia-ml.so.1";
}
std::string source_path(const std::string& rel) {
  return std::string(GPUFENCE_SOURCE_DIR) + "/" + rel;
}
std::string bin_path(const std::string& name) {
  return std::string(GPUFENCE_BIN_DIR) + "/" + name;
}

std::string mock_uuid(unsigned i) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "GPU-%08x-0000-4000-8000-%012x", 0xa0 + i, i);
  return buf;
}

nlohmann::json mock_gpus(unsigned count) {
  nlohmann::json cfg;
  cfg["driver_version"] = "550.54.15";
  cfg["gpus"] = nlohmann::json::array();
  for (unsigned i = 0; i < count; ++i) {
    char bus[32];
    std::snprintf(bus, sizeof bus, "00000000:%02X:00.0", 0x10 + i);
    cfg["gpus"].push_back({{"uuid", mock_uuid(i)},
                           {"name", "NVIDIA Test GPU"},
                           {"minor", i},
                           {"pci_bus_id", bus},
                           {"memory_total", 16ULL << 30},
                           {"numa_node", i < count / 2 || count == 1 ? 0 : 1}});
  }
  return cfg;
}

namespace {

std::string slurp(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace

CommandResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                          const std::string& stdin_data) {
  // Temp files rather than pipes: no deadlock whatever the child writes.
  char out_tmpl[] = "/tmp/gpufence-out-XXXXXX";
  char err_tmpl[] = "/tmp/gpufence-err-XXXXXX";
  char in_tmpl[] = "/tmp/gpufence-in-XXXXXX";
  int out_fd = ::mkstemp(out_tmpl), err_fd = ::mkstemp(err_tmpl), in_fd = ::mkstemp(in_tmpl);
  ::unlink(out_tmpl);
  ::unlink(err_tmpl);
  ::unlink(in_tmpl);
  if (!stdin_data.empty() && ::write(in_fd, stdin_data.data(), stdin_data.size()) < 0) {
    throw std::runtime_error("write stdin");
  }
  ::lseek(in_fd, 0, SEEK_SET);

  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  for (const auto& e : env) envs.push_back(e);
  auto pid = spawn_process(
      argv, {.env = envs, .stdin_fd = in_fd, .stdout_fd = out_fd, .stderr_fd = err_fd});
  CommandResult result;
  if (!pid) {
    result.err = "spawn failed: " + pid.error().message;
  } else {
    result.exit_code = wait_for_exit(*pid, std::chrono::milliseconds(0)).exit_code;
    ::lseek(out_fd, 0, SEEK_SET);
    ::lseek(err_fd, 0, SEEK_SET);
    result.out = slurp(out_fd);
    result.err = slurp(err_fd);
  }
  ::close(out_fd);
  ::close(err_fd);
  ::close(in_fd);
  return result;
}

int connect_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool prometheus_text_well_formed(const std::string& text, std::string* bad) {
  static const std::regex sample(
      R"re(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? [-+0-9.eEInfNa]+$)re");
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    if (!std::regex_match(line, sample)) {
      if (bad) *bad = line;
      return false;
    }
  }
  return true;
}

}  // namespace gpufence::test
