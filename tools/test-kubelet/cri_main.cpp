// gpufence-test-cri: the test kubelet running pods through a CRI runtime. It registers the device
// plugin (as gpufence-test-kubelet does), then for each pod: admits its container (GetPreferred-
// Allocation + Allocate), RunPodSandbox with the RuntimeClass handler, CreateContainer with the
// Allocate answer translated as the kubelet does, StartContainer; once every pod runs, ExecSync's
// the given command in each; with --hold, keeps them running until the test has looked from the
// host; then stops and removes everything. For the CRI scenario tests and benchmarks; not a
// kubelet.
//
// Usage: gpufence-test-cri --plugin-dir D --runtime-endpoint SOCK --image REF [--handler H]
//          [--pods N] [--privileged] [--volume HOST:CTR[:rw]]... [--shell CMD] [--hold PATH]
//          [--pod-annotation K=V]... [--pod-uid-prefix P] [--checkpoint FILE]
//          [--init-shell CMD] [--restart-container] -- CMD [ARG...]
// The device manager's bookkeeping as the kubelet's (pkg/kubelet/cm/devicemanager manager.go):
// each container's Allocate answer is kept (in FILE too with --checkpoint, as
// kubelet_internal_checkpoint) and replayed instead of a new Allocate for a container that already
// holds devices: a restarted container (--restart-container), and a later run with the same
// --pod-uid-prefix and FILE (a kubelet restart, or a reboot: pods keep their UIDs). An init
// container (--init-shell) is admitted first and its devices are reused by the app container, for
// which the kubelet calls Allocate again with the same ids.
// Output lines:
//   runtime <name> <version> <api version>
//   node capacity <n> allocated <m>          (the stand-in's view once every pod was admitted)
//   podresources <ns>/<pod>/<container> <resource> <id>[,<id>...]   (with --pod-resources)
//   podresources allocatable <n> allocated <m>
//   pod <i> ids <id>[,<id>...]
//   pod <i> running <seconds from RunPodSandbox to RUNNING>
//   pod <i> replayed <container> <id>[,<id>...]  (the answer came from the checkpoint)
//   pod <i> init ids <id>[,<id>...]          (with --init-shell)
//   pod <i> init exited 0                    (the init container ran to completion)
//   pod <i> exec <stdout line>
//   pod <i>r exec <stdout line>              (with --restart-container: the restarted container)
//   pod <i> restarted                        (with --restart-container)
//   plugin allocate calls <n>
//   pod <i> container <CRI container id>
//   pods held until <path>                   (with --hold, once every exec ran)
//   pod <i> error <step>: <message>           (the pod failed at that step)
#include <CLI/CLI.hpp>
#include <fstream>

#include <iostream>
#include <thread>

#include <unistd.h>

#include "checkpoint.hpp"
#include "common/strings.hpp"
#include "cri_client.hpp"
#include "pod_runner.hpp"
#include "test_kubelet.hpp"

namespace {

using gpufence::test::CriClient;
using gpufence::test::PodRun;

struct Options {
  std::string plugin_dir;
  std::string endpoint;
  std::string handler;
  std::string image;
  std::string name_prefix = "gpufence-cri";
  std::string namespace_ = "default";
  std::string container = "app";
  std::string cgroup_parent;
  int pods = 1;
  int gpus = 1;
  std::vector<std::string> env;
  std::vector<std::string> volumes;
  std::string shell;
  std::string pod_resources;
  std::string hold;
  bool privileged = false;
  std::vector<std::string> annotations;
  std::string uid_prefix;
  std::string checkpoint;
  std::string init_shell;
  bool restart = false;
  std::vector<std::string> exec;
  int timeout_s = 30;
};

// HOST:CONTAINER[:ro|:rw] (read-only unless :rw), as a hostPath volume and its volumeMount.
// HOST:CONTAINER[:ro|:rw[:host-to-container]]; CONTAINER "@FILE": the mount path is FILE's
// content (a path longer than one argument may be: Kubernetes bounds a mountPath's length only
// by the object's size).
bool parse_volume(const std::string& arg, gpufence::test::CriPod::Volume* out) {
  auto parts = gpufence::split(arg, ':');
  if (parts.size() < 2 || parts.size() > 4 || parts[0].empty() || parts[1].empty()) return false;
  if (parts.size() >= 3 && parts[2] != "ro" && parts[2] != "rw") return false;
  if (parts.size() == 4 && parts[3] != "host-to-container") return false;
  std::string container(parts[1]);
  if (container.starts_with("@")) {
    std::ifstream in(container.substr(1), std::ios::binary);
    if (!in) return false;
    container.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  *out = {std::string(parts[0]), container, parts.size() == 2 || parts[2] == "ro",
          parts.size() == 4};
  return true;
}

std::pair<std::string, std::string> split_kv(const std::string& kv) {
  auto eq = kv.find('=');
  return {kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1)};
}

// The device manager's answer for one container: the stored one when the checkpoint holds it
// (devicesToAllocate: "Found pre-allocated devices", nothing to allocate;
// GetDeviceRunContainerOptions reads podDevices), else devicesToAllocate + Allocate, stored.
grpc::Status container_allocation(gpufence::test::TestKubelet& kubelet,
                                  gpufence::test::DeviceCheckpoint& checkpoint, int i,
                                  const std::string& uid, const std::string& container, int gpus,
                                  const std::vector<std::string>& reusable,
                                  v1beta1::ContainerAllocateResponse* alloc,
                                  std::vector<std::string>* ids) {
  if (const auto* e = checkpoint.find(uid, container)) {
    *alloc = e->response;
    *ids = e->ids;
    kubelet.assign(e->ids);
    std::cout << "pod " << i << " replayed " << container << " " << gpufence::join(e->ids, ",")
              << "\n";
    return grpc::Status::OK;
  }
  auto st = kubelet.admit(gpus, alloc, ids, reusable);
  if (!st.ok()) return st;
  checkpoint.insert({uid, container, "nvidia.com/gpu", *ids, *alloc});
  std::string error;
  if (!checkpoint.store(&error)) return grpc::Status(grpc::StatusCode::INTERNAL, error);
  return st;
}

// Until `path` exists (the test's signal that it has looked at the running pods), bounded.
void hold_until(const std::string& path, std::chrono::seconds limit) {
  std::cout << "pods held until " << path << std::endl;
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (access(path.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"gpufence-test-cri: a stand-in kubelet that runs GPU pods through a CRI runtime"};
  app.add_option("--plugin-dir", opt.plugin_dir, "Device plugin directory to serve kubelet.sock in")
      ->required();
  app.add_option("--runtime-endpoint", opt.endpoint, "The CRI socket (containerd's grpc address)")
      ->required();
  app.add_option("--handler", opt.handler, "RuntimeClass handler (empty: the default runtime)");
  app.add_option("--image", opt.image, "Container image (already in the runtime's store)")
      ->required();
  app.add_option("--pods", opt.pods, "Pods to run, one container each")->capture_default_str();
  app.add_option("--gpus", opt.gpus, "nvidia.com/gpu per container (0: no device plugin admission)")
      ->capture_default_str();
  app.add_option("--env", opt.env, "KEY=VALUE in the pod spec's own env (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--volume", opt.volumes,
                 "HOST:CONTAINER[:ro|:rw[:host-to-container]] hostPath volume, read-only unless "
                 ":rw, private propagation unless named; CONTAINER @FILE: the path in FILE "
                 "(repeatable)")
      ->allow_extra_args(false);
  app.add_option("--shell", opt.shell,
                 "The container's command, run as /bin/sh -c SHELL (default: /bin/sleep 3600)");
  app.add_option("--namespace", opt.namespace_, "The pods' namespace")->capture_default_str();
  app.add_option("--container-name", opt.container, "The container's name")->capture_default_str();
  app.add_option("--hold", opt.hold,
                 "Once every pod ran its exec, keep them running until this path exists "
                 "(at most 10 minutes)");
  app.add_flag("--privileged", opt.privileged, "securityContext.privileged: true");
  app.add_option("--pod-annotation", opt.annotations,
                 "KEY=VALUE in the pod's metadata.annotations (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--pod-uid-prefix", opt.uid_prefix,
                 "Pod UIDs are PREFIX-<i> (default: uid-<pid>-<i>); the same UIDs in a later run "
                 "are the same pods, as after a kubelet restart or a reboot");
  app.add_option("--checkpoint", opt.checkpoint,
                 "The device manager's checkpoint file: replayed when it holds a container, "
                 "written after each Allocate");
  app.add_option("--init-shell", opt.init_shell,
                 "An init container \"init\" with the same GPU request, running /bin/sh -c CMD "
                 "to completion before the app container");
  app.add_flag("--restart-container", opt.restart,
               "After the exec, restart each container (remove, create again from the stored "
               "answer) and exec again");
  app.add_option("--name-prefix", opt.name_prefix, "Pod name prefix")->capture_default_str();
  app.add_option("--cgroup-parent", opt.cgroup_parent, "Pod cgroup parent (cgroupfs style)");
  app.add_option("--pod-resources", opt.pod_resources,
                 "Serve PodResources on this socket while the pods run, and print what it lists");
  app.add_option("--timeout", opt.timeout_s, "Seconds per step")->capture_default_str();
  app.add_option("exec", opt.exec,
                 "After --: the command ExecSync runs in each container once all of them run");
  CLI11_PARSE(app, argc, argv);

  // Step 1: the device plugin registers with the stand-in, as with a kubelet.
  gpufence::test::TestKubelet kubelet(opt.plugin_dir);
  kubelet.start();
  auto timeout = std::chrono::seconds(opt.timeout_s);
  if (!gpufence::test::wait_for_plugin(kubelet, timeout, "gpufence-test-cri")) return 1;

  // Step 2: the runtime answers.
  CriClient cri(opt.endpoint, timeout);
  if (!gpufence::test::print_runtime(cri, opt.endpoint, "gpufence-test-cri", std::cout)) return 1;

  // Step 3: admit and start each pod, all running at once.
  gpufence::test::DeviceCheckpoint checkpoint(opt.checkpoint);
  if (std::string error; !checkpoint.load(&error)) {
    std::cerr << "gpufence-test-cri: " << error << "\n";  // the kubelet does not start either
    return 1;
  }
  std::vector<PodRun> runs(opt.pods);
  int admitted = 0;
  for (int i = 0; i < opt.pods; ++i) {
    auto& run = runs[i];
    run.pod.name = opt.name_prefix + "-" + std::to_string(i);
    run.pod.uid = (opt.uid_prefix.empty() ? "uid-" + std::to_string(getpid()) : opt.uid_prefix) +
                  "-" + std::to_string(i);
    run.pod.image = opt.image;
    run.pod.namespace_ = opt.namespace_;
    run.pod.container = opt.container;
    run.pod.command = opt.shell.empty() ? std::vector<std::string>{"/bin/sleep", "3600"}
                                        : std::vector<std::string>{"/bin/sh", "-c", opt.shell};
    for (const auto& v : opt.volumes) {
      gpufence::test::CriPod::Volume vol;
      if (!parse_volume(v, &vol)) {
        std::cerr << "gpufence-test-cri: --volume " << v << ": expected HOST:CONTAINER[:ro|:rw]\n";
        return 2;
      }
      run.pod.volumes.push_back(vol);
    }
    run.pod.privileged = opt.privileged;
    run.pod.cgroup_parent = opt.cgroup_parent;
    for (const auto& kv : opt.env) run.pod.env.push_back(split_kv(kv));
    for (const auto& kv : opt.annotations) run.pod.annotations.insert(split_kv(kv));
    v1beta1::ContainerAllocateResponse alloc;
    if (opt.gpus == 0) {  // a pod that asks for no GPU: the kubelet never calls the plugin
      if (start_pod(cri, opt.handler, alloc, timeout, run))
        std::cout << "pod " << i << " running " << run.running_s << "\n";
      continue;
    }
    // Admission: the init container first, then the app container, which reuses its devices
    // (manager.go Allocate: devicesToReuse, addContainerAllocatedResources).
    gpufence::test::CriPod init = run.pod;
    v1beta1::ContainerAllocateResponse init_alloc;
    std::vector<std::string> init_ids;
    if (!opt.init_shell.empty()) {
      init.container = "init";
      init.command = {"/bin/sh", "-c", opt.init_shell};
      if (auto st = container_allocation(kubelet, checkpoint, i, run.pod.uid, init.container,
                                         opt.gpus, {}, &init_alloc, &init_ids);
          !st.ok()) {
        run.error = "Allocate (init): " + st.error_message();
        continue;
      }
      std::cout << "pod " << i << " init ids " << gpufence::join(init_ids, ",") << "\n";
    }
    if (auto st = container_allocation(kubelet, checkpoint, i, run.pod.uid, run.pod.container,
                                       opt.gpus, init_ids, &alloc, &run.ids);
        !st.ok()) {
      run.error = "Allocate: " + st.error_message();
      continue;
    }
    admitted += static_cast<int>(run.ids.size());
    std::cout << "pod " << i << " ids " << gpufence::join(run.ids, ",") << "\n";
    bool started = false;
    if (opt.init_shell.empty()) {
      started = start_pod(cri, opt.handler, alloc, timeout, run);
    } else if (run_sandbox(cri, opt.handler, timeout, run) &&
               start_container(cri, init, init_alloc, timeout, gpufence::test::Until::exited, run,
                               &run.init_container_id)) {
      std::cout << "pod " << i << " init exited 0\n";
      started = start_container(cri, run.pod, alloc, timeout, gpufence::test::Until::running, run,
                                &run.container_id);
    }
    if (started) std::cout << "pod " << i << " running " << run.running_s << "\n";
    if (!run.container_id.empty())
      std::cout << "pod " << i << " container " << run.container_id << "\n";
  }
  std::cout << "node capacity " << kubelet.devices().size() << " allocated " << admitted << "\n";
  std::unique_ptr<gpufence::test::PodResourcesServer> pod_resources;
  if (!opt.pod_resources.empty()) {
    pod_resources =
        gpufence::test::serve_pod_resources(opt.pod_resources, runs, kubelet.devices(), std::cout);
    if (!pod_resources) runs.front().error = "PodResources: not served";
  }

  // Step 4: look inside each running container.
  if (!opt.exec.empty()) {
    for (int i = 0; i < opt.pods; ++i) {
      if (runs[i].error.empty())
        gpufence::test::exec_in_pod(cri, i, opt.exec, timeout, std::cout, runs[i]);
    }
  }
  // Step 4b: a container restart: the kubelet removes the exited container and creates the next
  // attempt with the devices it holds (GetDeviceRunContainerOptions), asking the plugin nothing.
  if (opt.restart) {
    for (int i = 0; i < opt.pods; ++i) {
      auto& run = runs[i];
      if (!run.error.empty() || run.container_id.empty()) continue;
      cri.stop_container(run.container_id, std::chrono::seconds(0));
      cri.remove_container(run.container_id);
      run.container_id.clear();
      run.pod.attempt += 1;
      v1beta1::ContainerAllocateResponse alloc;
      if (opt.gpus > 0) {
        if (auto st = container_allocation(kubelet, checkpoint, i, run.pod.uid, run.pod.container,
                                           opt.gpus, {}, &alloc, &run.ids);
            !st.ok()) {
          run.error = "Allocate (restart): " + st.error_message();
          continue;
        }
      }
      if (!start_container(cri, run.pod, alloc, timeout, gpufence::test::Until::running, run,
                           &run.container_id))
        continue;
      std::cout << "pod " << i << " restarted\n";
      if (!opt.exec.empty())
        gpufence::test::exec_in_pod(cri, std::to_string(i) + "r", opt.exec, timeout, std::cout,
                                    run);
    }
  }
  std::cout << "plugin allocate calls " << kubelet.allocate_calls() << "\n";
  if (!opt.hold.empty()) hold_until(opt.hold, std::chrono::minutes(10));

  // Step 5: stop and remove, as the kubelet does when pods are deleted.
  int failed = 0;
  for (int i = 0; i < opt.pods; ++i) {
    gpufence::test::teardown_pod(cri, runs[i]);
    if (!runs[i].error.empty()) {
      std::cout << "pod " << i << " error " << runs[i].error << "\n";
      ++failed;
    }
  }
  kubelet.stop();
  return failed == 0 ? 0 : 1;
}
