#include "pod_runner.hpp"

#include <iostream>
#include <sstream>
#include <thread>

#include "common/strings.hpp"
#include "podresources/v1/api.grpc.pb.h"

namespace gpufence::test {

namespace {

using Clock = std::chrono::steady_clock;

bool fail(PodRun& run, const std::string& step, const grpc::Status& st) {
  run.error = step + ": " + st.error_message();
  return false;
}

}  // namespace

bool wait_for_plugin(TestKubelet& kubelet, std::chrono::seconds timeout,
                     const std::string& program) {
  if (kubelet.wait_registrations(1, timeout) &&
      kubelet.wait_devices([](const auto& d) { return !d.empty(); }, timeout))
    return true;
  std::cerr << program << ": no device plugin registered within " << timeout.count() << "s\n";
  return false;
}

bool print_runtime(CriClient& cri, const std::string& endpoint, const std::string& program,
                   std::ostream& out) {
  runtime::v1::VersionResponse version;
  if (auto st = cri.version(&version); !st.ok()) {
    std::cerr << program << ": CRI Version on " << endpoint << ": " << st.error_message() << "\n";
    return false;
  }
  out << "runtime " << version.runtime_name() << " " << version.runtime_version() << " "
      << version.runtime_api_version() << "\n";
  return true;
}

bool run_sandbox(CriClient& cri, const std::string& handler, std::chrono::seconds, PodRun& run) {
  auto st = cri.run_pod_sandbox(sandbox_config(run.pod), handler, &run.sandbox_id);
  if (!st.ok()) return fail(run, "RunPodSandbox", st);
  return true;
}

bool start_container(CriClient& cri, const CriPod& container,
                     const v1beta1::ContainerAllocateResponse& alloc, std::chrono::seconds timeout,
                     Until until, PodRun& run, std::string* id) {
  auto deadline = Clock::now() + timeout;
  auto st = cri.create_container(run.sandbox_id, container_config(container, alloc),
                                 sandbox_config(run.pod), id);
  if (!st.ok()) return fail(run, "CreateContainer", st);
  st = cri.start_container(*id);
  if (!st.ok()) return fail(run, "StartContainer", st);
  while (true) {
    runtime::v1::ContainerStatus status;
    st = cri.container_status(*id, &status);
    if (!st.ok()) return fail(run, "ContainerStatus", st);
    if (until == Until::running && status.state() == runtime::v1::CONTAINER_RUNNING) return true;
    if (until == Until::exited && status.state() == runtime::v1::CONTAINER_EXITED &&
        status.exit_code() == 0)
      return true;
    if (status.state() == runtime::v1::CONTAINER_EXITED || Clock::now() > deadline) {
      run.error = "ContainerStatus: " + container.container + " state " +
                  runtime::v1::ContainerState_Name(status.state()) + " exit code " +
                  std::to_string(status.exit_code()) + " reason " + status.reason() + " " +
                  status.message();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool start_pod(CriClient& cri, const std::string& handler,
               const v1beta1::ContainerAllocateResponse& alloc, std::chrono::seconds timeout,
               PodRun& run) {
  auto t0 = Clock::now();
  if (!run_sandbox(cri, handler, timeout, run)) return false;
  if (!start_container(cri, run.pod, alloc, timeout, Until::running, run, &run.container_id))
    return false;
  run.running_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return true;
}

void exec_in_pod(CriClient& cri, int i, const std::vector<std::string>& cmd,
                 std::chrono::seconds timeout, std::ostream& out, PodRun& run) {
  exec_in_pod(cri, std::to_string(i), cmd, timeout, out, run);
}

void exec_in_pod(CriClient& cri, const std::string& label, const std::vector<std::string>& cmd,
                 std::chrono::seconds timeout, std::ostream& out, PodRun& run) {
  runtime::v1::ExecSyncResponse resp;
  auto st = cri.exec_sync(run.container_id, cmd, timeout, &resp);
  if (!st.ok()) {
    fail(run, "ExecSync", st);
    return;
  }
  std::istringstream lines(resp.stdout() + resp.stderr());
  for (std::string line; std::getline(lines, line);)
    out << "pod " << label << " exec " << line << "\n";
  if (resp.exit_code() != 0) run.error = "ExecSync: exit code " + std::to_string(resp.exit_code());
}

void teardown_pod(CriClient& cri, const PodRun& run) {
  for (const auto& id : {run.container_id, run.init_container_id}) {
    if (id.empty()) continue;
    cri.stop_container(id, std::chrono::seconds(0));
    cri.remove_container(id);
  }
  if (!run.sandbox_id.empty()) {
    cri.stop_pod_sandbox(run.sandbox_id);
    cri.remove_pod_sandbox(run.sandbox_id);
  }
}

std::unique_ptr<PodResourcesServer> serve_pod_resources(const std::string& socket,
                                                        const std::vector<PodRun>& runs,
                                                        const TestKubelet::Devices& devices,
                                                        std::ostream& out) {
  std::vector<PodAllocation> allocations;
  // Every pod, those without devices too, as the kubelet's List answers.
  for (const auto& r : runs)
    allocations.push_back({r.pod.namespace_, r.pod.name, r.pod.container, r.ids});
  std::vector<std::string> allocatable;
  for (const auto& [id, health] : devices) allocatable.push_back(id);
  auto server =
      std::make_unique<PodResourcesServer>(socket, "nvidia.com/gpu", allocations, allocatable);
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
        out << "podresources " << p.namespace_() << "/" << p.name() << "/" << c.name() << " "
            << d.resource_name() << " " << join({d.device_ids().begin(), d.device_ids().end()}, ",")
            << "\n";
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
  out << "podresources allocatable " << allocatable_count << " allocated " << listed << "\n";
  return server;
}

}  // namespace gpufence::test
