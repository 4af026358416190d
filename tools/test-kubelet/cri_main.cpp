// gpufence-test-cri: the test kubelet running pods through a CRI runtime. It registers the device
// plugin (as gpufence-test-kubelet does), then for each pod: admits its container (GetPreferred-
// Allocation + Allocate), RunPodSandbox with the RuntimeClass handler, CreateContainer with the
// Allocate answer translated as the kubelet does, StartContainer; once every pod runs, ExecSync's
// the given command in each; then stops and removes everything. For the CRI scenario tests and
// benchmarks; not a kubelet.
//
// Usage: gpufence-test-cri --plugin-dir D --runtime-endpoint SOCK --image REF [--handler H]
//          [--pods N] [--privileged] -- CMD [ARG...]
// Output lines:
//   runtime <name> <version> <api version>
//   node capacity <n> allocated <m>          (the stand-in's view once every pod was admitted)
//   podresources <ns>/<pod>/<container> <resource> <id>[,<id>...]   (with --pod-resources)
//   podresources allocatable <n> allocated <m>
//   pod <i> ids <id>[,<id>...]
//   pod <i> running <seconds from RunPodSandbox to RUNNING>
//   pod <i> exec <stdout line>
//   pod <i> error <step>: <message>           (the pod failed at that step)
#include <CLI/CLI.hpp>

#include <iostream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "common/strings.hpp"
#include "cri_client.hpp"
#include "pod_resources_server.hpp"
#include "podresources/v1/api.grpc.pb.h"
#include "test_kubelet.hpp"

namespace {

using gpufence::test::CriClient;
using gpufence::test::CriPod;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string plugin_dir;
  std::string endpoint;
  std::string handler;
  std::string image;
  std::string name_prefix = "gpufence-cri";
  std::string cgroup_parent;
  int pods = 1;
  int gpus = 1;
  std::vector<std::string> env;
  std::string pod_resources;
  bool privileged = false;
  std::vector<std::string> exec;
  int timeout_s = 30;
};

struct PodRun {
  CriPod pod;
  std::vector<std::string> ids;
  std::string sandbox_id;
  std::string container_id;
  std::string error;
  double running_s = 0;
};

bool fail(PodRun& run, const std::string& step, const grpc::Status& st) {
  run.error = step + ": " + st.error_message();
  return false;
}

// RunPodSandbox, CreateContainer, StartContainer, then wait until the CRI reports RUNNING.
bool start_pod(CriClient& cri, const Options& opt, const v1beta1::ContainerAllocateResponse& alloc,
               PodRun& run) {
  auto t0 = Clock::now();
  auto sandbox = gpufence::test::sandbox_config(run.pod);
  auto st = cri.run_pod_sandbox(sandbox, opt.handler, &run.sandbox_id);
  if (!st.ok()) return fail(run, "RunPodSandbox", st);
  st = cri.create_container(run.sandbox_id, gpufence::test::container_config(run.pod, alloc),
                            sandbox, &run.container_id);
  if (!st.ok()) return fail(run, "CreateContainer", st);
  st = cri.start_container(run.container_id);
  if (!st.ok()) return fail(run, "StartContainer", st);
  auto deadline = t0 + std::chrono::seconds(opt.timeout_s);
  while (true) {
    runtime::v1::ContainerStatus status;
    st = cri.container_status(run.container_id, &status);
    if (!st.ok()) return fail(run, "ContainerStatus", st);
    if (status.state() == runtime::v1::CONTAINER_RUNNING) break;
    if (status.state() == runtime::v1::CONTAINER_EXITED || Clock::now() > deadline) {
      run.error = "ContainerStatus: state " + runtime::v1::ContainerState_Name(status.state()) +
                  " reason " + status.reason() + " " + status.message();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  run.running_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return true;
}

// PodResources from what the stand-in allocated, served on `socket` while the pods run, and read
// back through the API as a client sees it.
std::unique_ptr<gpufence::test::PodResourcesServer> serve_pod_resources(
    const std::string& socket, const std::vector<PodRun>& runs,
    const gpufence::test::TestKubelet::Devices& devices) {
  std::vector<gpufence::test::PodAllocation> allocations;
  for (const auto& r : runs) {
    if (!r.ids.empty())
      allocations.push_back({r.pod.namespace_, r.pod.name, r.pod.container, r.ids});
  }
  std::vector<std::string> allocatable;
  for (const auto& [id, health] : devices) allocatable.push_back(id);
  auto server = std::make_unique<gpufence::test::PodResourcesServer>(socket, "nvidia.com/gpu",
                                                                     allocations, allocatable);
  if (!server->start()) {
    std::cerr << "gpufence-test-cri: cannot serve PodResources on " << socket << "\n";
    return nullptr;
  }
  auto stub = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListPodResourcesResponse list;
  if (auto st = stub->List(&ctx, v1::ListPodResourcesRequest{}, &list); !st.ok()) {
    std::cerr << "gpufence-test-cri: PodResources List: " << st.error_message() << "\n";
    return nullptr;
  }
  int listed = 0;
  for (const auto& p : list.pod_resources()) {
    for (const auto& c : p.containers()) {
      for (const auto& d : c.devices()) {
        std::cout << "podresources " << p.namespace_() << "/" << p.name() << "/" << c.name() << " "
                  << d.resource_name() << " "
                  << gpufence::join({d.device_ids().begin(), d.device_ids().end()}, ",") << "\n";
        listed += d.device_ids_size();
      }
    }
  }
  grpc::ClientContext actx;
  actx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::AllocatableResourcesResponse alloc;
  if (auto st = stub->GetAllocatableResources(&actx, v1::AllocatableResourcesRequest{}, &alloc);
      !st.ok()) {
    std::cerr << "gpufence-test-cri: PodResources GetAllocatableResources: " << st.error_message()
              << "\n";
    return nullptr;
  }
  int allocatable_count = 0;
  for (const auto& d : alloc.devices()) allocatable_count += d.device_ids_size();
  std::cout << "podresources allocatable " << allocatable_count << " allocated " << listed << "\n";
  return server;
}

void teardown(CriClient& cri, const PodRun& run) {
  if (!run.container_id.empty()) {
    cri.stop_container(run.container_id, std::chrono::seconds(0));
    cri.remove_container(run.container_id);
  }
  if (!run.sandbox_id.empty()) {
    cri.stop_pod_sandbox(run.sandbox_id);
    cri.remove_pod_sandbox(run.sandbox_id);
  }
}

void print_exec(int i, CriClient& cri, const Options& opt, PodRun& run) {
  runtime::v1::ExecSyncResponse resp;
  auto st = cri.exec_sync(run.container_id, opt.exec, std::chrono::seconds(opt.timeout_s), &resp);
  if (!st.ok()) {
    fail(run, "ExecSync", st);
    return;
  }
  std::istringstream lines(resp.stdout() + resp.stderr());
  for (std::string line; std::getline(lines, line);)
    std::cout << "pod " << i << " exec " << line << "\n";
  if (resp.exit_code() != 0) run.error = "ExecSync: exit code " + std::to_string(resp.exit_code());
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
  app.add_flag("--privileged", opt.privileged, "securityContext.privileged: true");
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
  if (!kubelet.wait_registrations(1, timeout) ||
      !kubelet.wait_devices([](const auto& d) { return !d.empty(); }, timeout)) {
    std::cerr << "gpufence-test-cri: no device plugin registered within " << opt.timeout_s << "s\n";
    return 1;
  }

  // Step 2: the runtime answers.
  CriClient cri(opt.endpoint, timeout);
  runtime::v1::VersionResponse version;
  if (auto st = cri.version(&version); !st.ok()) {
    std::cerr << "gpufence-test-cri: CRI Version on " << opt.endpoint << ": " << st.error_message()
              << "\n";
    return 1;
  }
  std::cout << "runtime " << version.runtime_name() << " " << version.runtime_version() << " "
            << version.runtime_api_version() << "\n";

  // Step 3: admit and start each pod, all running at once.
  std::vector<PodRun> runs(opt.pods);
  int admitted = 0;
  for (int i = 0; i < opt.pods; ++i) {
    auto& run = runs[i];
    run.pod.name = opt.name_prefix + "-" + std::to_string(i);
    run.pod.uid = "uid-" + std::to_string(getpid()) + "-" + std::to_string(i);
    run.pod.image = opt.image;
    run.pod.command = {"/bin/sleep", "3600"};
    run.pod.privileged = opt.privileged;
    run.pod.cgroup_parent = opt.cgroup_parent;
    for (const auto& kv : opt.env) {
      auto eq = kv.find('=');
      run.pod.env.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
    }
    v1beta1::ContainerAllocateResponse alloc;
    if (opt.gpus == 0) {  // a pod that asks for no GPU: the kubelet never calls the plugin
      if (start_pod(cri, opt, alloc, run))
        std::cout << "pod " << i << " running " << run.running_s << "\n";
      continue;
    }
    if (auto st = kubelet.admit(opt.gpus, &alloc, &run.ids); !st.ok()) {
      fail(run, "Allocate", st);
      continue;
    }
    admitted += static_cast<int>(run.ids.size());
    std::cout << "pod " << i << " ids " << gpufence::join(run.ids, ",") << "\n";
    if (start_pod(cri, opt, alloc, run))
      std::cout << "pod " << i << " running " << run.running_s << "\n";
  }
  std::cout << "node capacity " << kubelet.devices().size() << " allocated " << admitted << "\n";
  std::unique_ptr<gpufence::test::PodResourcesServer> pod_resources;
  if (!opt.pod_resources.empty()) {
    pod_resources = serve_pod_resources(opt.pod_resources, runs, kubelet.devices());
    if (!pod_resources) runs.front().error = "PodResources: not served";
  }

  // Step 4: look inside each running container.
  if (!opt.exec.empty()) {
    for (int i = 0; i < opt.pods; ++i) {
      if (runs[i].error.empty()) print_exec(i, cri, opt, runs[i]);
    }
  }

  // Step 5: stop and remove, as the kubelet does when pods are deleted.
  int failed = 0;
  for (int i = 0; i < opt.pods; ++i) {
    teardown(cri, runs[i]);
    if (!runs[i].error.empty()) {
      std::cout << "pod " << i << " error " << runs[i].error << "\n";
      ++failed;
    }
  }
  kubelet.stop();
  return failed == 0 ? 0 : 1;
}
