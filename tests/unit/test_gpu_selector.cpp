#include <gtest/gtest.h>

#include "gpu/selector.hpp"

using namespace gpufence;

namespace {

std::vector<Gpu> inventory() {
  Gpu a;
  a.index = 0;
  a.uuid = "GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01";
  a.minor = 0;
  Gpu b;
  b.index = 1;
  b.uuid = "GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2";
  b.minor = 1;
  Gpu c;  // shares a prefix with a
  c.index = 2;
  c.uuid = "GPU-5a1c9999-0000-0000-0000-000000000000";
  c.minor = 2;
  return {a, b, c};
}

std::vector<unsigned> indices(const Result<std::vector<Gpu>>& gpus) {
  std::vector<unsigned> out;
  for (const auto& g : gpus.value()) out.push_back(g.index);
  return out;
}

std::string error_of(std::string_view value) {
  auto sel = parse_device_selector(value);
  if (!sel) return sel.error().message;
  auto res = resolve_selector(*sel, inventory());
  return res ? std::string("(no error)") : res.error().message;
}

}  // namespace

TEST(Selector, SpecialValues) {
  EXPECT_EQ(parse_device_selector("").value().kind, DeviceSelector::Kind::unset);
  EXPECT_EQ(parse_device_selector("  ").value().kind, DeviceSelector::Kind::unset);
  EXPECT_EQ(parse_device_selector("void").value().kind, DeviceSelector::Kind::unset);
  EXPECT_EQ(parse_device_selector("none").value().kind, DeviceSelector::Kind::none);
  EXPECT_EQ(parse_device_selector("all").value().kind, DeviceSelector::Kind::all);
  EXPECT_EQ(parse_device_selector("/var/run/nvidia-container-devices").value().kind,
            DeviceSelector::Kind::volume_mounts);
  EXPECT_TRUE(resolve_selector(parse_device_selector("none").value(), inventory()).value().empty());
  EXPECT_EQ(indices(resolve_selector(parse_device_selector("all").value(), inventory())),
            (std::vector<unsigned>{0, 1, 2}));
}

TEST(Selector, IndicesUuidsAndCdiNames) {
  auto resolve = [](std::string_view v) {
    return resolve_selector(parse_device_selector(v).value(), inventory());
  };
  EXPECT_EQ(indices(resolve("0,1")), (std::vector<unsigned>{0, 1}));
  EXPECT_EQ(indices(resolve(" 1 , 0 ")), (std::vector<unsigned>{1, 0}));
  EXPECT_EQ(indices(resolve("GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2")),
            (std::vector<unsigned>{1}));
  EXPECT_EQ(indices(resolve("GPU-C3E79D42-1B5F-4A08-B6D2-7E9F05A1C3B2")),
            (std::vector<unsigned>{1}));
  EXPECT_EQ(indices(resolve("GPU-c3e7")), (std::vector<unsigned>{1}));  // unique prefix, as CUDA
  EXPECT_EQ(indices(resolve("nvidia.com/gpu=1")), (std::vector<unsigned>{1}));
  EXPECT_EQ(indices(resolve("nvidia.com/gpu=GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01")),
            (std::vector<unsigned>{0}));
  EXPECT_EQ(indices(resolve("nvidia.com/gpu=all")), (std::vector<unsigned>{0, 1, 2}));
  EXPECT_EQ(indices(resolve("nvidia.com/gpu=0,GPU-c3e79d42")), (std::vector<unsigned>{0, 1}));
  // The device plugin's own kind, and both kinds in one list.
  EXPECT_EQ(indices(resolve("gpufence.io/gpu=GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2")),
            (std::vector<unsigned>{1}));
  EXPECT_EQ(indices(resolve("gpufence.io/gpu=all")), (std::vector<unsigned>{0, 1, 2}));
  EXPECT_EQ(indices(resolve("gpufence.io/gpu=2,nvidia.com/gpu=0")), (std::vector<unsigned>{2, 0}));
}

TEST(Selector, MigFormsAreRecognisedAndRejected) {
  for (auto v : {"0:1", "MIG-GPU-5a1c0b3e-8f2d-4c6a-9e71-0d3b2a4f6c01/1/0",
                 "MIG-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2", "nvidia.com/gpu=0:1"}) {
    auto sel = parse_device_selector(v);
    ASSERT_FALSE(sel) << v;
    EXPECT_EQ(sel.error().code, Errc::unsupported) << v;
    EXPECT_NE(sel.error().message.find("MIG is not supported yet"), std::string::npos) << v;
  }
}

TEST(Selector, MalformedValuesAreRejectedNamingTheToken) {
  EXPECT_NE(error_of("GPU-").find("'GPU-'"), std::string::npos);
  EXPECT_NE(error_of(",,").find("empty entry"), std::string::npos);
  EXPECT_NE(error_of("0,,1").find("empty entry"), std::string::npos);
  EXPECT_NE(error_of("-1").find("'-1'"), std::string::npos);
  EXPECT_NE(error_of("+1").find("'+1'"), std::string::npos);
  EXPECT_NE(error_of("GPU-xyz").find("'GPU-xyz'"), std::string::npos);
  EXPECT_NE(error_of("gpu0").find("'gpu0'"), std::string::npos);
  EXPECT_NE(error_of("amd.com/gpu=0").find("CDI kind 'amd.com/gpu'"), std::string::npos);
  EXPECT_NE(error_of("nvidia.com/gpu=").find("empty CDI device name"), std::string::npos);
  EXPECT_NE(error_of("all,0").find("cannot be combined"), std::string::npos);
  EXPECT_NE(error_of("99999999999999999999").find("out of range"), std::string::npos);
  std::string long_id = "GPU-" + std::string(296, 'a');
  EXPECT_NE(error_of(long_id).find("300 characters"), std::string::npos);
}

TEST(Selector, ResolutionErrorsNameTheToken) {
  EXPECT_NE(error_of("7").find("'7': no GPU with index 7"), std::string::npos);
  EXPECT_NE(error_of("GPU-deadbeef").find("'GPU-deadbeef': no GPU with this UUID"),
            std::string::npos);
  EXPECT_NE(error_of("GPU-5a1c").find("'GPU-5a1c': UUID prefix is ambiguous"), std::string::npos);
  EXPECT_NE(error_of("0,0").find("named more than once"), std::string::npos);
  EXPECT_NE(error_of("1,GPU-c3e79d42").find("'GPU-c3e79d42'"), std::string::npos);
  EXPECT_NE(error_of("nvidia.com/gpu=3").find("'nvidia.com/gpu=3'"), std::string::npos);
}

TEST(Selector, SingleTokens) {
  auto t = parse_device_token("nvidia.com/gpu=GPU-ABC");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->kind, DeviceToken::Kind::uuid);
  EXPECT_EQ(t->uuid, "GPU-abc");
  EXPECT_EQ(t->text, "nvidia.com/gpu=GPU-ABC");
  EXPECT_EQ(t->cdi_kind, "nvidia.com/gpu");
  EXPECT_EQ(t->id(), "GPU-ABC");
  auto own = parse_device_token(" gpufence.io/gpu=1 ");
  ASSERT_TRUE(own);
  EXPECT_EQ(own->cdi_kind, "gpufence.io/gpu");
  EXPECT_EQ(own->id(), "1");
  EXPECT_EQ(own->index, 1u);
  EXPECT_EQ(parse_device_token("GPU-ABC").value().cdi_kind, "");
  EXPECT_EQ(parse_device_token("GPU-ABC").value().id(), "GPU-ABC");
  // A look-alike vendor is another kind, not gpufence's.
  EXPECT_FALSE(parse_device_token("gpufence.io/gpux=1"));
  EXPECT_FALSE(parse_device_token("xgpufence.io/gpu=1"));
  EXPECT_EQ(parse_device_token("12").value().index, 12u);
  EXPECT_FALSE(parse_device_token(""));
}
