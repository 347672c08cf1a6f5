// The rbd: spec as QEMU writes it (no cluster needed; tests/rbd_test.cc
// runs the device against one).
#include "io/rbd_device.h"

#include <gtest/gtest.h>

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

TEST(RbdSpec, PoolImageSnapAndOptions) {
  auto s = ParseRbdSpec("rbd:vms/disk1@before-upgrade:conf=/etc/ceph/x.conf:id=admin:keyring=/k:rbd_cache=true");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->pool, "vms");
  EXPECT_EQ(s->ns, "");
  EXPECT_EQ(s->image, "disk1");
  EXPECT_EQ(s->snap, "before-upgrade");
  EXPECT_EQ(s->conf, "/etc/ceph/x.conf");
  EXPECT_EQ(s->id, "admin");
  EXPECT_EQ(s->keyring, "/k");
  ASSERT_EQ(s->options.size(), 1u);
  EXPECT_EQ(s->options[0].first, "rbd_cache");
  EXPECT_EQ(s->options[0].second, "true");
  EXPECT_EQ(s->Name(), "rbd:vms/disk1@before-upgrade");
}

TEST(RbdSpec, NamespaceAndEscapes) {
  auto s = ParseRbdSpec(R"(rbd:p/tenant/img\:1:mon_host=[v2\:127.0.0.1\:3300])");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->pool, "p");
  EXPECT_EQ(s->ns, "tenant");
  EXPECT_EQ(s->image, "img:1");
  EXPECT_EQ(s->snap, "");
  ASSERT_EQ(s->options.size(), 1u);
  EXPECT_EQ(s->options[0].first, "mon_host");
  EXPECT_EQ(s->options[0].second, "[v2:127.0.0.1:3300]");
  auto at = ParseRbdSpec(R"(rbd:p/a\@b@snap)");
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  EXPECT_EQ(at->image, "a@b");
  EXPECT_EQ(at->snap, "snap");
}

TEST(RbdSpec, MalformedSpecsSayWhatIsWrong) {
  for (const char* bad : {"rbd:", "rbd:imageonly", "rbd:/img", "rbd:pool/", "rbd:pool/img@", "rbd:a/b/c/d",
                          "rbd:pool/img:noequals", "rbd:pool/img:=v", "rbd:p/i@s1@s2", "rbd:p/i\\"}) {
    auto s = ParseRbdSpec(bad);
    EXPECT_FALSE(s.ok()) << bad;
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), EINVAL) << bad;
      EXPECT_NE(s.status().message().find("expected rbd:POOL/IMAGE"), std::string::npos) << s.status().message();
    }
  }
  EXPECT_FALSE(ParseRbdSpec("file.img").ok());
}

TEST(RbdSpec, OpenDeviceSendsOnlyRbdPathsToRbd) {
  EXPECT_TRUE(IsRbdPath("rbd:p/i"));
  EXPECT_FALSE(IsRbdPath("./rbd:p/i"));
  EXPECT_FALSE(IsRbdPath("/tmp/img"));
  // A file path never reaches librbd, even one that does not exist.
  auto f = OpenDevice("/nonexistent/ubtrfs-test.img");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), ENOENT);
  // A malformed spec fails before any connection attempt.
  auto r = OpenDevice("rbd:nopool");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), RbdSupported() ? EINVAL : EOPNOTSUPP);
}

}  // namespace
}  // namespace ubtrfs::io
