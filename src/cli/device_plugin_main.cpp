// gpufence-device-plugin: the kubelet device plugin for nvidia.com/gpu (issue 3 lands its server).
#include <iostream>
#include <string_view>

int main(int argc, char** argv) {
  bool help = argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h");
  std::ostream& out = help ? std::cout : std::cerr;
  out << "usage: gpufence-device-plugin [flags]\n"
         "Serves the kubelet Device Plugin API v1beta1 for nvidia.com/gpu.\n"
         "Not built yet in this version: this binary only prints its usage.\n";
  return help ? 0 : 2;
}
