// The pre-flight link probe (worker/link_probe.h) over real loopback sockets:
// a round trip with the job's secret, a prober or responder without it
// refused, a stalled stranger not keeping the responder from the next
// prober, and the bound.
#include "worker/link_probe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "common/net.h"

namespace erun::worker {
namespace {

using namespace std::chrono_literals;

TEST(LinkProbe, ARoundTripWithTheJobsSecretIsTimed) {
  LinkProbeResponder responder("127.0.0.1", "job-1", "secret-1");
  ASSERT_GT(responder.port(), 0);
  for (int i = 0; i < 3; ++i) {  // one connection after another
    auto took = probe_link("127.0.0.1", responder.port(), "job-1", "secret-1", kLinkProbeBytes, 5s);
    ASSERT_TRUE(took.is_ok()) << took.status().message();
    EXPECT_GT(took.value(), Duration::zero());
    EXPECT_LT(took.value(), 5s);
  }
}

TEST(LinkProbe, AProberWithoutTheSecretOrOfAnotherJobIsRefusedAndChangesNothing) {
  LinkProbeResponder responder("127.0.0.1", "job-1", "secret-1");
  ASSERT_GT(responder.port(), 0);
  auto wrong = probe_link("127.0.0.1", responder.port(), "job-1", "not-the-secret", 1024, 5s);
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.status().message().find("failed the job secret's proof"), std::string::npos)
      << wrong.status().message();
  auto other_job = probe_link("127.0.0.1", responder.port(), "job-2", "secret-1", 1024, 5s);
  EXPECT_FALSE(other_job.is_ok());
  auto right = probe_link("127.0.0.1", responder.port(), "job-1", "secret-1", 1024, 5s);
  EXPECT_TRUE(right.is_ok()) << right.status().message();
}

TEST(LinkProbe, AStalledStrangerHoldsTheResponderAtMostItsTimeout) {
  LinkProbeResponder responder("127.0.0.1", "job-1", "secret-1", 300ms);
  ASSERT_GT(responder.port(), 0);
  auto addrs = net::resolve("127.0.0.1", std::to_string(responder.port()));
  ASSERT_TRUE(addrs.is_ok());
  net::Socket stranger = net::connect(addrs.value().front(), std::chrono::steady_clock::now() + 2s);
  ASSERT_TRUE(stranger.ok());  // connects and says nothing
  auto t0 = std::chrono::steady_clock::now();
  auto right = probe_link("127.0.0.1", responder.port(), "job-1", "secret-1", kLinkProbeBytes, 5s);
  EXPECT_TRUE(right.is_ok()) << right.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

// A "responder" that accepts and never answers: the probe gives up at its
// bound and says it timed out.
TEST(LinkProbe, ARoundTripPastTheBoundFailsAtTheBound) {
  auto addrs = net::resolve("127.0.0.1", "0");
  ASSERT_TRUE(addrs.is_ok());
  net::Socket silent = net::listen(addrs.value().front(), 4);
  ASSERT_TRUE(silent.ok());
  const int port = net::local_address(silent.fd.get()).port();
  auto t0 = std::chrono::steady_clock::now();
  auto r = probe_link("127.0.0.1", port, "job-1", "secret-1", 1024, 300ms);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("timed out"), std::string::npos) << r.status().message();
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 3s);
}

}  // namespace
}  // namespace erun::worker
