// What a hook gpufence writes or applies runs with when its spec says nothing (docs/cdi.md,
// "Hooks"). A hook without `env` is executed by runc and crun with the environment of the
// process that runs it; createContainer hooks run from `runc init` after it has taken the
// container's process.env, so an image's LD_PRELOAD would run as host root before pivot_root
// (the shape of CVE-2025-23266). A hook without `timeout` can hold a create forever.
#pragma once

#include <string>
#include <vector>

namespace gpufence {

// Only PATH, pointing at the host's system directories: nothing the image can set.
inline const std::vector<std::string> kMinimalHookEnv = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};

// Seconds. OCI runtime-spec: timeout "MUST be greater than zero". The ldcache hook takes well
// under a second; a CDI hook that needs more says so with its own timeout.
inline constexpr int kDefaultHookTimeoutSeconds = 30;

}  // namespace gpufence
