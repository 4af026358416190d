// The one error currency of gpufence: fallible calls return Result<T> = std::expected<T, Error>.
// Exceptions never cross a component boundary; only main() catches.
#pragma once

#include <cerrno>
#include <cstring>
#include <expected>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace gpufence {

enum class Errc {
  invalid_argument,  // bad user input: a flag, a selector, a config value
  not_found,         // a file, device or GPU that does not exist
  io,                // the OS refused: open, read, write, rename
  parse,             // malformed content: JSON, TOML, /proc text
  nvml,              // NVML could not be loaded or answered an error
  unsupported,       // valid input that gpufence does not handle yet (MIG)
  denied,            // policy refused: isolation cannot be proven
  rpc,               // a gRPC or HTTP peer failed
  conflict,          // a write lost a race (HTTP 409): re-read and try again
  internal,          // a broken invariant of our own
};

struct Error {
  Errc code = Errc::internal;
  std::string message;

  // "context: message", so callers add what they were doing without losing the cause.
  Error wrap(std::string_view context) const {
    return Error{code, std::string(context) + ": " + message};
  }
};

template <class T>
using Result = std::expected<T, Error>;
using Status = std::expected<void, Error>;

// Concatenates any streamable values; g++ 12 has no std::format.
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <class... Args>
std::unexpected<Error> fail(Errc code, Args&&... args) {
  return std::unexpected(Error{code, cat(std::forward<Args>(args)...)});
}

// "open /dev/nvidia1: Operation not permitted": always names the operation, the path and errno.
inline std::unexpected<Error> fail_errno(std::string_view op, std::string_view path,
                                         int err = errno) {
  Errc code = (err == ENOENT || err == ENOTDIR) ? Errc::not_found : Errc::io;
  return fail(code, op, " ", path, ": ", std::strerror(err));
}

}  // namespace gpufence
