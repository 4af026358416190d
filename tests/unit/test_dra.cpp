// gpufence-dra: the slice, claim and checkpoint logic as pure functions, and the driver over its
// real gRPC socket against the test API server (what the kubelet calls, in the kubelet's order).
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/file.hpp"
#include "dra/driver.hpp"
#include "dra/model.hpp"
#include "dra/v1/api.grpc.pb.h"
#include "drahealth/v1alpha1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "support/fake_node.hpp"
#include "support/test_api_server.hpp"
#include "support/test_support.hpp"

using namespace gpufence;
using namespace std::chrono_literals;
using gpufence::test::eventually;
using nlohmann::json;
namespace dra = k8s::io::kubelet::pkg::apis::dra::v1;

namespace {

const std::string kClaims = "/apis/resource.k8s.io/v1/namespaces/video/resourceclaims";
const std::string kSlices = "/apis/resource.k8s.io/v1/resourceslices";

DraIdentity node1() {
  return {std::string(kDraDriverName), "node1"};
}

// A claim as the scheduler leaves it: allocated, one result per request.
json allocated_claim(const std::string& name, const std::string& uid,
                     std::vector<std::tuple<std::string, std::string, std::string, std::string>>
                         results) {  // request, driver, pool, device
  json rs = json::array();
  for (auto& [request, driver, pool, device] : results)
    rs.push_back({{"request", request}, {"driver", driver}, {"pool", pool}, {"device", device}});
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"name", name}, {"namespace", "video"}, {"uid", uid}}},
          {"status", {{"allocation", {{"devices", {{"results", rs}}}}}}}};
}

// One claim of a NodePrepare/NodeUnprepare request, in namespace video.
template <class Request>
void add_claim(Request& req, const std::string& name, const std::string& uid) {
  auto* c = req.add_claims();
  c->set_namespace_("video");
  c->set_name(name);
  c->set_uid(uid);
}

}  // namespace

TEST(DraModel, TheSliceHasOnePoolPerNodeAndOneDevicePerGpuWithAttributes) {
  auto gpus = test::fake_gpus(2);
  gpus[0].numa_node = 1;
  gpus[0].driver_version = "550.54.15";
  gpus[0].memory_total = 80ull << 30;
  json s = dra_resource_slice(node1(), gpus, 3);
  EXPECT_EQ(s["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(s["metadata"]["name"], "node1-gpufence.io");
  EXPECT_EQ(s["spec"]["driver"], "gpufence.io");
  EXPECT_EQ(s["spec"]["nodeName"], "node1");
  EXPECT_EQ(s["spec"]["pool"],
            (json{{"name", "node1"}, {"generation", 3}, {"resourceSliceCount", 1}}));
  ASSERT_EQ(s["spec"]["devices"].size(), 2u);
  const json& d = s["spec"]["devices"][0];
  EXPECT_EQ(d["name"], "gpu-0");
  EXPECT_EQ(d["attributes"]["uuid"], (json{{"string", gpus[0].uuid}}));
  EXPECT_EQ(d["attributes"]["index"], (json{{"int", 0}}));
  EXPECT_EQ(d["attributes"]["minor"], (json{{"int", 0}}));
  EXPECT_EQ(d["attributes"]["numaNode"], (json{{"int", 1}}));
  EXPECT_EQ(d["attributes"]["driverVersion"], (json{{"version", "550.54.15"}}));
  EXPECT_EQ(d["capacity"]["memory"]["value"], std::to_string(80ull << 30));
  EXPECT_FALSE(s["spec"]["devices"][1]["attributes"].contains("numaNode")) << "unknown: left out";
  // A driver version that is no semver never makes the slice invalid: left out.
  gpus[0].driver_version = "550.54";
  EXPECT_FALSE(dra_resource_slice(node1(), gpus, 1)["spec"]["devices"][0]["attributes"].contains(
      "driverVersion"));
  EXPECT_TRUE(dra_same_slice_spec(dra_resource_slice(node1(), gpus, 1),
                                  dra_resource_slice(node1(), gpus, 9)))
      << "the generation is ours to bump";
  EXPECT_FALSE(dra_same_slice_spec(dra_resource_slice(node1(), gpus, 1),
                                   dra_resource_slice(node1(), test::fake_gpus(1), 1)));
}

TEST(DraModel, AnUnhealthyGpuIsTaintedNoScheduleOrNoExecuteByThePolicy) {
  EXPECT_FALSE(dra_health_of(false, "xid 48", kDraNoExecuteXids).no_execute);
  EXPECT_TRUE(dra_health_of(false, "xid 79", kDraNoExecuteXids).no_execute);
  EXPECT_TRUE(dra_health_of(false, "lost: GPU is lost", kDraNoExecuteXids).no_execute);
  EXPECT_TRUE(dra_health_of(false, "xid 48", {48}).no_execute) << "the policy names it";
  EXPECT_TRUE(dra_health_of(true, "", kDraNoExecuteXids).healthy);
  EXPECT_EQ(dra_taint_value("xid 48"), "xid-48");
  EXPECT_EQ(dra_taint_value("lost: nvmlDeviceGetUUID did not return"), "lost");
  EXPECT_EQ(dra_taint_value(std::string(100, 'x')).size(), 63u);
  EXPECT_EQ(dra_taint_value("::"), "unhealthy");

  auto gpus = test::fake_gpus(2);
  std::map<std::string, DraDeviceHealth> health;
  health[gpus[1].uuid] = dra_health_of(false, "xid 79", kDraNoExecuteXids);
  json s = dra_resource_slice(node1(), gpus, 1, health);
  EXPECT_FALSE(s["spec"]["devices"][0].contains("taints"));
  EXPECT_EQ(
      s["spec"]["devices"][1]["taints"],
      json::parse(R"([{"key":"gpufence.io/unhealthy","value":"xid-79","effect":"NoExecute"}])"));
  // The API server stamps timeAdded: still the same slice.
  json stamped = s;
  stamped["spec"]["devices"][1]["taints"][0]["timeAdded"] = "2026-12-07T10:00:00Z";
  EXPECT_TRUE(dra_same_slice_spec(stamped, s));
  EXPECT_FALSE(dra_same_slice_spec(dra_resource_slice(node1(), gpus, 1), s)) << "recovery untaints";
}

TEST(DraModel, ALongNodeNameStillGivesADistinctValidSliceName) {
  const std::string a(250, 'a');
  std::string b = a;
  b.back() = 'b';
  auto na = dra_slice_name({"gpufence.io", a}), nb = dra_slice_name({"gpufence.io", b});
  EXPECT_LE(na.size(), 253u);
  EXPECT_NE(na, nb) << "two nodes, two slices";
  EXPECT_TRUE(na.ends_with("-gpufence.io"));
  EXPECT_EQ(dra_slice_name({"gpufence.io", "node1"}), "node1-gpufence.io");
}

TEST(DraModel, AClaimGivesOurDevicesAsGpufenceCdiNames) {
  auto gpus = test::fake_gpus(2);
  json c = allocated_claim("c1", "u1",
                           {{"container-0-request-0", "gpufence.io", "node1", "gpu-1"},
                            {"nic", "other.example.com", "pool-x", "eth0"}});
  auto p = dra_claim_devices(c, "u1", node1(), gpus);
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->name, "c1");
  EXPECT_EQ(p->claim_namespace, "video");
  ASSERT_EQ(p->devices.size(), 1u) << "another driver's result is not ours to prepare";
  EXPECT_EQ(p->devices[0], (DraPreparedDevice{"container-0-request-0", "node1", "gpu-1",
                                              "gpufence.io/gpu=" + gpus[1].uuid}));
}

TEST(DraModel, AClaimThatIsNotOursToPrepareIsRefused) {
  auto gpus = test::fake_gpus(2);
  auto with = [&](const std::string& pool, const std::string& device) {
    return dra_claim_devices(allocated_claim("c1", "u1", {{"r", "gpufence.io", pool, device}}),
                             "u1", node1(), gpus);
  };
  EXPECT_FALSE(with("node2", "gpu-0")) << "allocated on another node";
  EXPECT_NE(with("node2", "gpu-0").error().message.find("pool node2"), std::string::npos);
  EXPECT_FALSE(with("node1", "gpu-7")) << "no such GPU here";
  EXPECT_FALSE(with("node1", "../gpu-0"));
  // The claim the kubelet named was deleted and made again under the same name.
  EXPECT_FALSE(dra_claim_devices(allocated_claim("c1", "u2", {}), "u1", node1(), gpus));
  json pending = allocated_claim("c1", "u1", {});
  pending.erase("status");
  auto p = dra_claim_devices(pending, "u1", node1(), gpus);
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message.find("not allocated"), std::string::npos);
}

TEST(DraModel, TheCheckpointRoundTripsAndRefusesWhatIsNotOne) {
  std::map<std::string, DraPreparedClaim> claims;
  claims["u1"] = {"u1", "video", "c1", {{"r0", "node1", "gpu-0", "gpufence.io/gpu=GPU-a"}}};
  claims["u2"] = {"u2", "video", "c2", {}};
  auto back = dra_parse_checkpoint(dra_checkpoint_text(claims));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, claims);
  EXPECT_FALSE(dra_parse_checkpoint("{}"));
  EXPECT_FALSE(dra_parse_checkpoint("not json"));
  EXPECT_FALSE(dra_parse_checkpoint(R"({"kind":"gpufence.io/dra-checkpoint/v1","claims":[{}]})"));
}

// The driver on its socket, as the kubelet drives it.
class DraDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_gpus = test::fake_gpus(2);
    m_stop = ::eventfd(0, EFD_CLOEXEC);
    auto creds = KubeCredentials{};
    creds.server = m_api.url();
    m_kube = make_rest_client(creds);
    m_api.set_versioned("/api/v1/nodes/node1",
                        {{"metadata", {{"name", "node1"}, {"uid", "node-uid-1"}}}});
  }
  void TearDown() override {
    stop();
    ::close(m_stop);
  }
  DraOptions options() {
    DraOptions o;
    o.id = node1();
    o.registry_dir = m_dir.path() / "plugins_registry";
    o.state_dir = m_dir.path() / "state";
    o.cdi.dir = (m_dir.path() / "cdi").string();
    o.slice_check = m_slice_check;
    return o;
  }
  void start() {
    m_driver = std::make_unique<DraDriver>(options(), *m_kube, m_gpus, m_log, [this] {
      std::lock_guard lock(m_health_mu);
      return m_health;
    });
    m_thread = std::thread([this] { m_result = m_driver->run(m_stop); });
    ASSERT_TRUE(eventually([&] { return std::filesystem::exists(m_driver->socket_path()); }));
    m_channel = grpc::CreateChannel("unix://" + m_driver->socket_path().string(),
                                    grpc::InsecureChannelCredentials());
  }
  void stop() {
    if (!m_thread.joinable()) return;
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(m_stop, &one, sizeof one);
    m_thread.join();
    std::uint64_t v;
    [[maybe_unused]] auto r = ::read(m_stop, &v, sizeof v);
  }
  dra::NodePrepareResourcesResponse prepare(const std::string& name, const std::string& uid) {
    auto stub = dra::DRAPlugin::NewStub(m_channel);
    dra::NodePrepareResourcesRequest req;
    add_claim(req, name, uid);
    dra::NodePrepareResourcesResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->NodePrepareResources(&ctx, req, &resp).ok());
    return resp;
  }
  int claim_gets(const std::string& name) {
    int n = 0;
    for (const auto& r : m_api.requests()) n += r == "GET " + kClaims + "/" + name;
    return n;
  }

  void set_health(const std::string& uuid, std::optional<DraDeviceHealth> h) {
    {
      std::lock_guard lock(m_health_mu);
      if (h)
        m_health[uuid] = *h;
      else
        m_health.erase(uuid);
    }
    m_driver->health_changed();
  }

  std::chrono::milliseconds m_slice_check = 100ms;
  std::mutex m_health_mu;
  std::map<std::string, DraDeviceHealth> m_health;
  test::TempDir m_dir;
  test::TestApiServer m_api;
  std::unique_ptr<KubeClient> m_kube;
  std::vector<Gpu> m_gpus;
  Logger m_log{LogLevel::off};
  int m_stop = -1;
  std::unique_ptr<DraDriver> m_driver;
  std::thread m_thread;
  Status m_result;
  std::shared_ptr<grpc::Channel> m_channel;
};

TEST_F(DraDriverTest, RegistersAsADraPluginOfV1OnItsOwnSocket) {
  start();
  auto stub = pluginregistration::Registration::NewStub(m_channel);
  pluginregistration::PluginInfo info;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->GetInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), "gpufence.io");
  EXPECT_EQ(info.endpoint(), m_driver->socket_path().string());
  ASSERT_EQ(info.supported_versions_size(), 1);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");
  EXPECT_EQ(m_driver->socket_path().filename(), "gpufence.io-reg.sock");
  stop();
  EXPECT_TRUE(m_result);
  EXPECT_FALSE(std::filesystem::exists(m_driver->socket_path())) << "removed on stop";
}

TEST_F(DraDriverTest, PublishesTheSliceOwnedByTheNodeAndRepublishesItWhenDeleted) {
  start();
  const std::string path = kSlices + "/node1-gpufence.io";
  ASSERT_TRUE(eventually([&] { return m_api.has_object(path); }));
  json s = m_api.object(path);
  EXPECT_EQ(s["spec"]["devices"].size(), 2u);
  EXPECT_EQ(s["metadata"]["ownerReferences"][0]["uid"], "node-uid-1");
  // The kubelet deletes the node's slices as it starts.
  m_api.remove_object(path);
  EXPECT_TRUE(eventually([&] { return m_api.has_object(path); })) << "published again";
  // Someone changed it: put back, with the pool's generation bumped.
  s = m_api.object(path);
  s["spec"]["devices"].erase(1);
  m_api.set_versioned(path, s);
  ASSERT_TRUE(eventually([&] { return m_api.object(path)["spec"]["devices"].size() == 2; }));
  EXPECT_GT(m_api.object(path)["spec"]["pool"]["generation"].get<int>(), 1);
  EXPECT_TRUE(std::filesystem::exists(m_dir.path() / "cdi" / kPluginCdiSpecFile))
      << "the CDI spec its names resolve in";
}

// The API server stores quantities in canonical form (and drops fields its gates turn off): its
// copy differs from ours for good, which must not make the driver write the slice every check.
TEST_F(DraDriverTest, TheServersCanonicalFormIsNoReasonToWriteAgain) {
  const std::string path = kSlices + "/node1-gpufence.io";
  m_gpus[0].memory_total = 80'000'000'000;
  start();
  ASSERT_TRUE(eventually([&] { return m_api.has_object(path); }));
  json stored = m_api.object(path);
  stored["spec"]["devices"][0]["capacity"]["memory"]["value"] = "80G";
  m_api.set_versioned(path, stored);  // as if the server had stored it so
  std::this_thread::sleep_for(300ms);
  // One write to settle what the server keeps, then none.
  int puts = m_api.puts();
  EXPECT_LE(puts, 1);
  if (puts == 1) {
    json again = m_api.object(path);
    again["spec"]["devices"][0]["capacity"]["memory"]["value"] = "80G";
    m_api.set_versioned(path, again);  // the server canonicalises the write too
    std::this_thread::sleep_for(300ms);
    puts = m_api.puts();
  }
  std::this_thread::sleep_for(500ms);  // five more checks
  EXPECT_EQ(m_api.puts(), puts) << "no write while nothing changed";
}

TEST_F(DraDriverTest, ASliceOfAnotherNodeByTheSameNameIsNotOverwritten) {
  const std::string path = kSlices + "/node1-gpufence.io";
  m_api.set_versioned(path, {{"metadata", {{"name", "node1-gpufence.io"}}},
                             {"spec", {{"driver", "gpufence.io"}, {"nodeName", "node9"}}}});
  start();
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(m_api.puts(), 0);
  EXPECT_EQ(m_api.object(path)["spec"]["nodeName"], "node9");
}

TEST_F(DraDriverTest, ASocketAnotherProcessServesIsLeftAlone) {
  auto o = options();
  std::filesystem::create_directories(o.registry_dir);
  const auto sock = o.registry_dir / "gpufence.io-reg.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  DraDriver driver(o, *m_kube, m_gpus, m_log);
  auto st = driver.run(m_stop);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("another process"), std::string::npos) << st.error().message;
  EXPECT_TRUE(std::filesystem::exists(sock));
  ::close(fd);
  // Dead now: a crash's leftover, removed and served.
  start();
  stop();
  EXPECT_TRUE(m_result);
}

TEST_F(DraDriverTest, PreparesFromTheClaimOnceAndAgainAfterARestartWithoutAskingTheApi) {
  m_api.set_versioned(
      kClaims + "/c1",
      allocated_claim("c1", "u1", {{"container-0-request-0", "gpufence.io", "node1", "gpu-1"}}));
  start();
  auto resp = prepare("c1", "u1");
  ASSERT_EQ(resp.claims().count("u1"), 1u);
  const auto& a = resp.claims().at("u1");
  EXPECT_EQ(a.error(), "");
  ASSERT_EQ(a.devices_size(), 1);
  EXPECT_EQ(a.devices(0).pool_name(), "node1");
  EXPECT_EQ(a.devices(0).device_name(), "gpu-1");
  ASSERT_EQ(a.devices(0).request_names_size(), 1);
  EXPECT_EQ(a.devices(0).request_names(0), "container-0-request-0");
  ASSERT_EQ(a.devices(0).cdi_device_ids_size(), 1);
  EXPECT_EQ(a.devices(0).cdi_device_ids(0), "gpufence.io/gpu=" + m_gpus[1].uuid);
  // The kubelet retries a whole call when another claim of it failed: same answer, no new read.
  auto again = prepare("c1", "u1");
  EXPECT_EQ(again.claims().at("u1").SerializeAsString(), a.SerializeAsString());
  EXPECT_EQ(claim_gets("c1"), 1);
  // A restart (an upgrade of the driver): prepared claims are read back from the checkpoint.
  stop();
  m_api.remove_object(kClaims + "/c1");
  start();
  auto after = prepare("c1", "u1");
  EXPECT_EQ(after.claims().at("u1").SerializeAsString(), a.SerializeAsString());
  EXPECT_EQ(claim_gets("c1"), 1);
}

TEST_F(DraDriverTest, RefusesAClaimItCannotPrepareAndAnswersEveryClaim) {
  m_api.set_versioned(kClaims + "/elsewhere",
                      allocated_claim("elsewhere", "u2", {{"r", "gpufence.io", "node2", "gpu-0"}}));
  start();
  auto stub = dra::DRAPlugin::NewStub(m_channel);
  dra::NodePrepareResourcesRequest req;
  add_claim(req, "elsewhere", "u2");
  add_claim(req, "gone", "u3");
  dra::NodePrepareResourcesResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->NodePrepareResources(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.claims_size(), 2) << "one answer per claim";
  EXPECT_NE(resp.claims().at("u2").error().find("node2"), std::string::npos);
  EXPECT_EQ(resp.claims().at("u2").devices_size(), 0);
  EXPECT_NE(resp.claims().at("u3").error(), "");
  // Nothing refused is checkpointed.
  auto text = read_file(m_dir.path() / "state" / "checkpoint.json");
  EXPECT_FALSE(text && text->find("u2") != std::string::npos);
}

TEST_F(DraDriverTest, UnprepareForgetsTheClaimAndIsIdempotent) {
  m_api.set_versioned(kClaims + "/c1",
                      allocated_claim("c1", "u1", {{"r", "gpufence.io", "node1", "gpu-0"}}));
  start();
  prepare("c1", "u1");
  auto stub = dra::DRAPlugin::NewStub(m_channel);
  for (int i = 0; i < 2; ++i) {
    dra::NodeUnprepareResourcesRequest req;
    add_claim(req, "c1", "u1");
    dra::NodeUnprepareResourcesResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->NodeUnprepareResources(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.claims().count("u1"), 1u);
    EXPECT_EQ(resp.claims().at("u1").error(), "") << "try " << i;
  }
  auto text = read_file(m_dir.path() / "state" / "checkpoint.json");
  ASSERT_TRUE(text);
  EXPECT_EQ(text->find("u1"), std::string::npos);
  // Prepared again after that: read afresh.
  prepare("c1", "u1");
  EXPECT_EQ(claim_gets("c1"), 2);
}

TEST_F(DraDriverTest, TheHealthStreamListsEveryDeviceAndEndsOnStop) {
  start();
  auto stub = v1alpha1::DRAResourceHealth::NewStub(m_channel);
  grpc::ClientContext ctx;
  auto reader = stub->NodeWatchResources(&ctx, {});
  v1alpha1::NodeWatchResourcesResponse first;
  ASSERT_TRUE(reader->Read(&first));
  ASSERT_EQ(first.devices_size(), 2);
  EXPECT_EQ(first.devices(0).device().pool_name(), "node1");
  EXPECT_EQ(first.devices(0).device().device_name(), "gpu-0");
  EXPECT_EQ(first.devices(0).health(), v1alpha1::HEALTHY);
  {
    // Nothing changed: nothing more is sent.
    grpc::ClientContext quiet;
    quiet.set_deadline(std::chrono::system_clock::now() + 1500ms);
    auto r = stub->NodeWatchResources(&quiet, {});
    v1alpha1::NodeWatchResourcesResponse m;
    int n = 0;
    while (r->Read(&m)) ++n;
    EXPECT_EQ(n, 1) << "the list once, then only changes";
  }
  auto t0 = std::chrono::steady_clock::now();
  stop();
  v1alpha1::NodeWatchResourcesResponse more;
  while (reader->Read(&more)) {
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s) << "a stop ends the stream";
}

// An XID: the health stream says UNHEALTHY with why and the slice's device gets the taint;
// recovery: HEALTHY, untainted.
TEST_F(DraDriverTest, AnUnhealthyGpuIsStreamedAndTaintedAndRecovers) {
  const std::string path = kSlices + "/node1-gpufence.io";
  m_slice_check = 60s;  // a change republishes at once, not at the next check
  start();
  ASSERT_TRUE(eventually([&] { return m_api.has_object(path); }));
  auto stub = v1alpha1::DRAResourceHealth::NewStub(m_channel);
  grpc::ClientContext ctx;
  auto reader = stub->NodeWatchResources(&ctx, {});
  v1alpha1::NodeWatchResourcesResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_EQ(msg.devices(1).health(), v1alpha1::HEALTHY);

  set_health(m_gpus[1].uuid, dra_health_of(false, "xid 48", kDraNoExecuteXids));
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_EQ(msg.devices(0).health(), v1alpha1::HEALTHY);
  EXPECT_EQ(msg.devices(1).health(), v1alpha1::UNHEALTHY);
  EXPECT_EQ(msg.devices(1).message(), "xid 48");
  auto taints = [&] {
    return m_api.object(path)["spec"]["devices"][1].value("taints", json::array());
  };
  ASSERT_TRUE(eventually([&] { return taints().size() == 1; }, 3s)) << "republished at once";
  EXPECT_EQ(taints()[0]["effect"], "NoSchedule");
  EXPECT_EQ(taints()[0]["value"], "xid-48");

  set_health(m_gpus[1].uuid, std::nullopt);
  ASSERT_TRUE(reader->Read(&msg));
  EXPECT_EQ(msg.devices(1).health(), v1alpha1::HEALTHY);
  EXPECT_TRUE(eventually([&] { return taints().empty(); }, 3s)) << "recovery removes the taint";
  ctx.TryCancel();
}

TEST_F(DraDriverTest, ACorruptCheckpointStopsTheDriverRatherThanPrepareTwice) {
  std::filesystem::create_directories(m_dir.path() / "state");
  std::ofstream(m_dir.path() / "state" / "checkpoint.json") << "{broken";
  DraDriver driver(options(), *m_kube, m_gpus, m_log);
  auto st = driver.run(m_stop);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("checkpoint"), std::string::npos) << st.error().message;
}
