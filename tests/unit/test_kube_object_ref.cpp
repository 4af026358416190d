// NAMESPACE/NAME flags (kube/object_ref.hpp): parsed once, each part checked as the API server
// checks it, so no flag value can put '/', '?', '..' or an empty part into a request path.
#include <gtest/gtest.h>

#include "kube/object_ref.hpp"

using namespace gpufence;

TEST(ObjectRef, NamespaceSlashName) {
  auto r = parse_object_ref("video/ds-app.v2", "--deployment");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*r, (ObjectRef{"video", "ds-app.v2"}));
}

TEST(ObjectRef, WhatCouldBendARequestPathIsRefused) {
  for (const char* bad : {"video", "/ds", "video/", "video/ds/x", "video/..", "../kube-system/ds",
                          "video/ds?watch=1", "Video/ds", "video/DS", "video/-ds", "video/ds-",
                          "video/a..b", "vi_deo/ds", "video/ds%2f", "video/ ds"}) {
    auto r = parse_object_ref(bad, "--deployment");
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_NE(r.error().message.find("--deployment"), std::string::npos) << bad;
    }
  }
  EXPECT_FALSE(parse_object_ref(std::string(64, 'a') + "/ds", "--lease")) << "label over 63";
  EXPECT_TRUE(parse_object_ref(std::string(63, 'a') + "/ds", "--lease"));
  EXPECT_FALSE(parse_object_ref("ns/" + std::string(254, 'a'), "--lease")) << "name over 253";
}

TEST(ObjectRef, ConfigMapKey) {
  auto r = parse_object_key_ref("video/streams:desired.count_A-1", "--streams-configmap");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->object, (ObjectRef{"video", "streams"}));
  EXPECT_EQ(r->key, "desired.count_A-1");
  for (const char* bad : {"video/streams", "video/streams:", "video/streams:..", "video:key",
                          "video/streams:a/b", "video/str:eams:k/"}) {
    EXPECT_FALSE(parse_object_key_ref(bad, "--streams-configmap")) << bad;
  }
}
