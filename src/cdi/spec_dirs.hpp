// The CDI spec directories as the CDI project's registry reads them (pkg/cdi cache.go,
// spec-dirs.go; docs/cdi.md): every *.json and *.yaml file directly in each directory, sorted;
// a file's priority is its directory's index, and when two files define the same device (the
// same kind and name) the later directory wins (/var/run/cdi over /etc/cdi), while two files of
// one directory conflict. The one reader of spec directories: gpufence-runtime, the doctor and
// check-containerd all read through it.
//
// gpufence reads the GPU kinds it is asked for strictly: a file of such a kind that is malformed
// is an error naming the file and the field. Every other file is looked at only for its `kind`,
// never judged: other vendors' specs, valid or not, must never block GPU containers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cdi/spec.hpp"
#include "common/hostfs.hpp"

namespace gpufence {

struct CdiSpecFile {
  std::string path;
  CdiSpec spec;
  size_t priority = 0;  // index of its directory in the list read
};

enum class CdiSkip {
  other_kind,  // a spec of another kind (detail: the kind); not judged at all
  unreadable,  // unreadable, not JSON/YAML, or no string `kind` (detail: why)
};

struct CdiSkippedFile {
  std::string path;
  CdiSkip why = CdiSkip::other_kind;
  std::string detail;
};

struct CdiSpecSet {
  std::vector<CdiSpecFile> specs;  // of the wanted kind, valid, every device as the file has it
  std::vector<CdiSkippedFile> skipped;
};

// One file as read from a spec directory (read apart from parsing, so tests feed literal text).
struct CdiSourceFile {
  std::string path;
  size_t priority = 0;
  Result<std::string> text;
};

// The spec files of `dirs` in upstream's order: *.json and *.yaml directly in each directory,
// sorted by name; a missing directory has none. Paths are host paths joined to `fs`'s root.
std::vector<CdiSourceFile> read_cdi_spec_files(const HostFs& fs,
                                               const std::vector<std::string>& dirs);

// Sorts the files into specs of one of `kinds` (decoded strictly: an error names the file and
// field) and skipped ones.
Result<CdiSpecSet> parse_cdi_spec_files(const std::vector<CdiSourceFile>& files,
                                        const std::vector<std::string_view>& kinds);

// read_cdi_spec_files + parse_cdi_spec_files.
Result<CdiSpecSet> load_cdi_spec_dirs(const HostFs& fs, const std::vector<std::string>& dirs,
                                      const std::vector<std::string_view>& kinds);

// Every file as the doctor and check-containerd report it: its kind and device names, or why it
// does not parse. Nothing is refused here; the checks judge.
struct CdiFileSummary {
  std::string path;
  size_t priority = 0;
  std::string kind;                  // "" when the file is unreadable or names no kind
  std::vector<std::string> devices;  // device names (unqualified); empty when `error` is set
  std::string error;                 // why it does not read or decode as a spec
};
std::vector<CdiFileSummary> summarize_cdi_spec_files(const std::vector<CdiSourceFile>& files);

// A device defined by more than one file.
struct CdiDuplicateDevice {
  std::string name;  // qualified: "<kind>=<name>"
  // conflict: two or more files of the highest priority define it; upstream drops the device
  //   (unresolvable) and gpufence refuses a container that asks for it.
  // overridden: one file of a later directory wins; the earlier ones are ignored for it.
  enum class Resolution { conflict, overridden };
  Resolution resolution = Resolution::conflict;
  std::vector<std::string> winners;  // conflict: every highest-priority file; else the one used
  std::vector<std::string> ignored;  // files of earlier directories that also define it
};

// Every device (kind and name) defined in more than one of `files`, sorted by qualified name.
// Pure; for the doctor and for apply_cdi_priority. Files with an error define nothing.
std::vector<CdiDuplicateDevice> duplicate_cdi_devices(const std::vector<CdiFileSummary>& files);

// Removes each device that a file of a later directory also defines from the earlier files
// (upstream's resolveConflict), and returns what it removed. Same-priority conflicts stay, so
// that whoever asks for such a device gets an error naming both files.
std::vector<CdiDuplicateDevice> apply_cdi_priority(std::vector<CdiSpecFile>& specs);

}  // namespace gpufence
