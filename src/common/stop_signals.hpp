// How a long-running gpufence process learns it should stop: SIGTERM (the kubelet and containerd
// end a container's processes with it, then SIGKILL after the grace period) or SIGINT (^C at a
// terminal). One way for every such process (the device plugin, `install --watch`, `autoscale`,
// the test kubelet): the two signals are blocked and read from a signalfd(2), never caught by a
// handler. So no signal ever interrupts a thread inside gRPC, libcurl or NVML with EINTR, and a
// stop is a pending signal that stays pending: the descriptor is readable from the first stop on,
// whoever asks and however often.
//
// Children must not inherit the blocked mask (one could then not be stopped):
// spawn_process (common/process.hpp) starts every child with the default mask.
//
// Not every binary takes one. gpufence-runtime and its hooks are not long-running (runc's and
// containerd's own time limits end them). gpufence-nri keeps SIGTERM's default action on purpose:
// a stop has nothing to finish (each answer to containerd is one write; its status file is read
// together with its pid and start time, so a dead writer is seen as dead), and where containerd
// enforces it (required_plugins, containerd >= 2.2) creates fail closed while it is gone
// (docs/nri.md).
#pragma once

#include <chrono>

#include "common/error.hpp"
#include "common/fd.hpp"

namespace gpufence {

class StopSignals {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread and opens a signalfd for them. Call it before
  // any thread exists (gRPC, libcurl and the NVML watchdog start some): threads inherit the mask,
  // and one that did not block the signals would take their default action and end the whole
  // process at once. The signals stay blocked after the object is gone, so a stop that arrives
  // during the cleanup after a stop cannot cut that cleanup short.
  static Result<StopSignals> block();

  // Readable once a stop signal is pending: for poll(2) beside other descriptors.
  int fd() const { return m_fd.fd; }

  // Whether a stop signal has arrived (it is left pending: asking again answers the same).
  bool stop_requested() const;

  // Waits up to `timeout` for a stop signal; true when one has arrived.
  bool wait_for(std::chrono::milliseconds timeout) const;

 private:
  explicit StopSignals(Fd fd) : m_fd(std::move(fd)) {}
  Fd m_fd;
};

}  // namespace gpufence
