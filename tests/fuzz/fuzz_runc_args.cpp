// libFuzzer target: runc command lines as containerd's shim passes them to gpufence-runtime.
// Input: the arguments after argv[0], separated by NUL bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/runc_args.hpp"

using namespace gpufence;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\0') {
      args.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (size > 0) args.push_back(std::move(current));

  auto inv = parse_runc_args(args);
  if (!inv) return 0;
  // The shim opens <bundle>/config.json: a create/run must always name an absolute bundle.
  if (inv->edits_spec() && (inv->bundle.empty() || inv->bundle.front() != '/')) std::abort();
  return 0;
}
