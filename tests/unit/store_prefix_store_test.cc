// PrefixStore: keys land under the prefix in the underlying store, views of
// views join their prefixes, views with different prefixes never see each
// other's keys, bad prefixes are refused, and a timed-out get names the full key.
#include <gtest/gtest.h>

#include <thread>

#include "erun/errors.hpp"
#include "store/memory_store.h"
#include "store/prefix_store.h"

namespace erun {
namespace {

using namespace std::chrono_literals;

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(PrefixStore, KeysLandUnderThePrefix) {
  MemoryKvStore base;
  PrefixStore view(base, "coll");
  view.set("addr/0", bytes("a0"));
  EXPECT_EQ(base.get("coll/addr/0", 1s), bytes("a0"));
  EXPECT_FALSE(base.check({"addr/0"}));
  base.set("coll/addr/1", bytes("a1"));
  EXPECT_EQ(view.get("addr/1", 1s), bytes("a1"));
  EXPECT_TRUE(view.check({"addr/0", "addr/1"}));
  EXPECT_FALSE(view.check({"addr/0", "addr/2"}));
  EXPECT_EQ(view.prefix(), "coll");
  EXPECT_EQ(view.scoped("x"), "coll/x");
}

TEST(PrefixStore, AViewOfAViewJoinsThePrefixes) {
  MemoryKvStore base;
  PrefixStore coll(base, "coll");
  PrefixStore shm(coll, "shm/host-a");
  EXPECT_EQ(shm.prefix(), "coll/shm/host-a");
  EXPECT_EQ(&shm.base(), &base);  // one hop, not a chain
  shm.set("segment", bytes("s"));
  EXPECT_EQ(base.get("coll/shm/host-a/segment", 1s), bytes("s"));
  EXPECT_EQ(coll.get("shm/host-a/segment", 1s), bytes("s"));
}

TEST(PrefixStore, SiblingViewsAreIsolated) {
  MemoryKvStore base;
  PrefixStore a(base, "gen3");
  PrefixStore b(base, "gen4");
  a.set("go", {});
  EXPECT_TRUE(a.check({"go"}));
  EXPECT_FALSE(b.check({"go"}));
  // A prefix that is a string prefix of another is still another scope.
  PrefixStore c(base, "gen3x");
  EXPECT_FALSE(c.check({"go"}));
}

TEST(PrefixStore, BadPrefixesAreRefusedWithTheirName) {
  MemoryKvStore base;
  for (const std::string p : {"", "/coll", "coll/", "coll//shm", "/"}) {
    try {
      PrefixStore view(base, p);
      FAIL() << "prefix '" << p << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + p + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(PrefixStore, GetWaitsForALaterSetThroughAnotherView) {
  MemoryKvStore base;
  PrefixStore reader(base, "ready");
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    PrefixStore(base, "ready").set("1", bytes("ok"));
  });
  EXPECT_EQ(reader.get("1", 30s), bytes("ok"));
  writer.join();
}

TEST(PrefixStore, TimeoutNamesTheFullKey) {
  MemoryKvStore base;
  PrefixStore view(base, "coll/tcp");
  try {
    view.get("addr/7", 50ms);
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("coll/tcp/addr/7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace erun
