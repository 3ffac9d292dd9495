// host_file_name (common/strings.h): a host's name as one file-name
// component of its host-memory commit directory.
#include <gtest/gtest.h>

#include "common/strings.h"

namespace erun {
namespace {

TEST(HostFileName, PlainNamesAndAddressesAreKept) {
  EXPECT_EQ(host_file_name("node-7.cluster_a"), "node-7.cluster_a");
  EXPECT_EQ(host_file_name("127.0.0.2"), "127.0.0.2");
}

TEST(HostFileName, AnyOtherByteBecomesSafeAndTheNameStaysDistinct) {
  const std::string v6 = host_file_name("[::1]");
  EXPECT_EQ(v6.rfind("___1_-", 0), 0u) << v6;
  const std::string slash = host_file_name("a/b");
  EXPECT_EQ(slash.find('/'), std::string::npos) << slash;
  EXPECT_NE(slash, host_file_name("a_b"));
  EXPECT_NE(host_file_name(".."), "..");
  EXPECT_NE(host_file_name("."), ".");
  EXPECT_FALSE(host_file_name("").empty());
}

TEST(HostFileName, LongNamesAreCutButStayDistinct) {
  const std::string a(100, 'a');
  std::string b = a;
  b.back() = 'b';
  EXPECT_LE(host_file_name(a).size(), 64u + 9u);
  EXPECT_NE(host_file_name(a), host_file_name(b));
}

}  // namespace
}  // namespace erun
