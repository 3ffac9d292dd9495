#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "discovery/host_set.h"

namespace erun {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Host> hosts_of(const Result<HostSet>& r) {
  EXPECT_TRUE(r.is_ok()) << r.message();
  return r ? r->hosts() : std::vector<Host>{};
}

TEST(HostSet, AddMergesAndKeepsOrder) {
  HostSet s;
  s.add({"b", 2});
  s.add({"a", 1});
  s.add({"b", 3});
  EXPECT_THAT(s.hosts(), ElementsAre(Host{"b", 5}, Host{"a", 1}));
  EXPECT_EQ(s.total_slots(), 6);
  EXPECT_EQ(s.find("a"), 1);
  EXPECT_EQ(s.find("zz"), -1);
  EXPECT_EQ(s.slots_of("b"), 5);
  EXPECT_EQ(s.slots_of("zz"), 0);
  EXPECT_EQ(s.to_string(), "b:5,a:1");
}

TEST(HostSet, ToStringBracketsIpv6) {
  HostSet s({{"fe80::1", 2}, {"10.0.0.1", 1}});
  EXPECT_EQ(s.to_string(), "[fe80::1]:2,10.0.0.1:1");
  EXPECT_EQ(HostSet().to_string(), "");
}

TEST(DiscoveryOutput, GoodLines) {
  auto r = parse_discovery_output(
      "# header comment\n"
      "node1:4\n"
      "\n"
      "   node2   \n"
      "node3:2   # trailing comment\n"
      "\t10.0.0.7:8\r\n"
      "[fe80::1]:2\n"
      "fe80::2\n"
      "[::1]\n"
      "a.example.com:1\n"
      "   # indented comment\n",
      3);
  EXPECT_THAT(hosts_of(r), ElementsAre(Host{"node1", 4}, Host{"node2", 3}, Host{"node3", 2},
                                       Host{"10.0.0.7", 8}, Host{"fe80::1", 2}, Host{"fe80::2", 3},
                                       Host{"::1", 3}, Host{"a.example.com", 1}));
}

TEST(DiscoveryOutput, EmptyAndCommentsOnly) {
  EXPECT_TRUE(parse_discovery_output("", 1)->empty());
  EXPECT_TRUE(parse_discovery_output("\n\n# nothing\n  \n", 1)->empty());
}

TEST(DiscoveryOutput, NoTrailingNewline) {
  EXPECT_THAT(hosts_of(parse_discovery_output("a:1\nb:2", 1)),
              ElementsAre(Host{"a", 1}, Host{"b", 2}));
}

TEST(DiscoveryOutput, ErrorNamesLineNumberTextAndProblem) {
  auto r = parse_discovery_output("node0:1\n# c\nnode1:x\n", 1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.message(),
            "discovery output line 3 \"node1:x\": slots must be a positive integer "
            "(expected host[:slots], or host[:slots] draining for a host that leaves; rack=NAME may follow)");
}

struct BadLine {
  const char* text;
  int line;
  const char* what;
};

class DiscoveryOutputBad : public ::testing::TestWithParam<BadLine> {};

TEST_P(DiscoveryOutputBad, Rejected) {
  auto p = GetParam();
  auto r = parse_discovery_output(p.text, 1);
  ASSERT_FALSE(r) << p.text;
  EXPECT_THAT(r.message(), HasSubstr("line " + std::to_string(p.line) + " ")) << r.message();
  EXPECT_THAT(r.message(), HasSubstr(p.what)) << r.message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DiscoveryOutputBad,
    ::testing::Values(BadLine{"a:0", 1, "positive integer"}, BadLine{"a:-2", 1, "positive integer"},
                      BadLine{"ok\na:", 2, "positive integer"},
                      BadLine{"a:1.5", 1, "positive integer"},
                      BadLine{"a:99999999999999999999", 1, "limit"},
                      BadLine{"a:65537", 1, "limit"}, BadLine{"\n\nbad_host", 3, "'_'"},
                      BadLine{"a b", 1, "unexpected \"b\""},
                      BadLine{"node1 slots=4", 1, "write node1:4"},
                      BadLine{"-node", 1, "'-'"}, BadLine{"node-", 1, "'-'"},
                      BadLine{"a..b", 1, "empty label"}, BadLine{"a.", 1, "trailing"},
                      BadLine{"999.1.1.1", 1, "IPv4"}, BadLine{"1.2.3", 1, "IPv4"},
                      BadLine{"[fe80::1", 1, "closing"}, BadLine{"[fe80::1]x", 1, "after ']'"},
                      BadLine{"[node1]:2", 1, "only for IPv6"},
                      BadLine{"fe80::g", 1, "IPv6"}, BadLine{"a:1\nb:1\na:2", 3, "twice"},
                      BadLine{":4", 1, "empty host"},
                      BadLine{"hello world!", 1, "the character '!'"},
                      BadLine{"Traceback (most recent call last):", 1, "the character '('"},
                      BadLine{"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 1, "63"}));

// `host[:slots] draining` marks a host that leaves; nothing else may follow
// a host, and the mark is no host of its own nor valid on -H.
TEST(DiscoveryOutput, DrainingMark) {
  auto r = parse_discovery_output("a:2\nb:1 draining\n  c\tdraining  # leaving\n[fe80::1]:2 draining\n", 3);
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(r->hosts(), ElementsAre(Host{"a", 2}, Host{"b", 1, true}, Host{"c", 3, true}, Host{"fe80::1", 2, true}));
  EXPECT_TRUE(r->any_draining());
  auto none = parse_discovery_output("a:2\nb:1\n", 1);
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->any_draining());
  EXPECT_TRUE(*none == *parse_discovery_output("a:2\nb:1", 1));
  EXPECT_FALSE(*none == *parse_discovery_output("a:2\nb:1 draining", 1)) << "a new mark is a change";
  for (const char* bad : {"b:1 drain", "b:1 draining now", "b:1 DRAINING"}) {
    auto e = parse_discovery_output(bad, 1);
    EXPECT_FALSE(e) << bad;
    if (!e) {
      EXPECT_THAT(e.message(), HasSubstr("host[:slots] draining")) << e.message();
    }
  }
  EXPECT_FALSE(parse_hosts_flag("a:1 draining", 1));
  auto merged = parse_discovery_output("a:1\na:1 draining\n", 1, DuplicatePolicy::kMerge);
  ASSERT_TRUE(merged) << merged.message();
  EXPECT_THAT(merged->hosts(), ElementsAre(Host{"a", 2, true}));
}

// `rack=NAME` after a host, with or without `draining`, in either order:
// the host's rack (standbys are taken nearest); a bad or repeated word is an
// error naming it.
TEST(DiscoveryOutput, RackWord) {
  auto r = parse_discovery_output("a:2 rack=r1\nb draining rack=r-2.x_y\nc:1 rack=r1 draining\nd:1\n", 1);
  ASSERT_TRUE(r) << r.message();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ(r->hosts()[0], (Host{"a", 2, false, "r1"}));
  EXPECT_EQ(r->hosts()[1], (Host{"b", 1, true, "r-2.x_y"}));
  EXPECT_EQ(r->hosts()[2], (Host{"c", 1, true, "r1"}));
  EXPECT_EQ(r->hosts()[3], (Host{"d", 1, false, ""}));
  EXPECT_FALSE(*r == *parse_discovery_output("a:2 rack=r9\nb draining rack=r-2.x_y\nc:1 rack=r1 draining\nd:1\n", 1))
      << "another rack is a change";
  for (const char* bad : {"a:1 rack=", "a:1 rack=r1 rack=r2", "a:1 rack=r:1", "a:1 draining draining", "a:1 Rack=r1",
                          "a:1 rack=r1 x"}) {
    auto e = parse_discovery_output(bad, 1);
    EXPECT_FALSE(e) << bad;
    if (!e) {
      EXPECT_THAT(e.message(), HasSubstr("rack=NAME")) << e.message();
      EXPECT_THAT(e.message(), HasSubstr("line 1")) << e.message();
    }
  }
  EXPECT_FALSE(parse_discovery_output(std::string("a:1 rack=") + std::string(65, 'r'), 1));
  EXPECT_TRUE(parse_discovery_output(std::string("a:1 rack=") + std::string(64, 'r'), 1));
}

TEST(DiscoveryOutput, DuplicatePolicy) {
  auto rejected = parse_discovery_output("a:1\nb:1\na:2\n", 1, DuplicatePolicy::kReject);
  ASSERT_FALSE(rejected);
  EXPECT_THAT(rejected.message(), HasSubstr("lines 1 and 3"));
  auto merged = parse_discovery_output("a:1\nb:1\na:2\n", 1, DuplicatePolicy::kMerge);
  EXPECT_THAT(hosts_of(merged), ElementsAre(Host{"a", 3}, Host{"b", 1}));
  auto over = parse_discovery_output("a:65536\na:1\n", 1, DuplicatePolicy::kMerge);
  ASSERT_FALSE(over);
  EXPECT_THAT(over.message(), HasSubstr("limit"));
}

TEST(ValidateHostname, AcceptsAndRejects) {
  for (const char* good : {"a", "node01", "A-b.c-d.example", "127.0.0.2", "::1", "fe80::1%eth0",
                           "2001:db8::8a2e:370:7334", "1host", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}) {
    EXPECT_TRUE(validate_hostname(good)) << good << ": " << validate_hostname(good).message();
  }
  for (const char* bad : {"", "a_b", "a b", "-a", "a-", "a..b", ".a", "256.1.1.1", "fe80::1%",
                          "::1::2", "a/b", "ho$t"}) {
    EXPECT_FALSE(validate_hostname(bad)) << bad;
  }
  EXPECT_FALSE(validate_hostname(std::string(254, 'a')));
  EXPECT_THAT(validate_hostname("a_b").message(), HasSubstr("\"a_b\""));
}

TEST(HostsFlag, Forms) {
  EXPECT_THAT(hosts_of(parse_hosts_flag("a:4,b:4", 1)), ElementsAre(Host{"a", 4}, Host{"b", 4}));
  EXPECT_THAT(hosts_of(parse_hosts_flag("a,b", 2)), ElementsAre(Host{"a", 2}, Host{"b", 2}));
  EXPECT_THAT(hosts_of(parse_hosts_flag(" a:1 , [::1]:2 ,127.0.0.2", 3)),
              ElementsAre(Host{"a", 1}, Host{"::1", 2}, Host{"127.0.0.2", 3}));
}

TEST(HostsFlag, Errors) {
  auto r = parse_hosts_flag("a:4,b:x", 1);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("-H item 2 \"b:x\""));
  EXPECT_THAT(r.message(), HasSubstr("positive integer"));
  EXPECT_THAT(parse_hosts_flag("a,,b", 1).message(), HasSubstr("item 2 is empty"));
  EXPECT_THAT(parse_hosts_flag("", 1).message(), HasSubstr("empty"));
  EXPECT_THAT(parse_hosts_flag("a,a", 1).message(), HasSubstr("twice"));
  EXPECT_THAT(parse_hosts_flag("a,b_c", 1).message(), HasSubstr("item 2"));
}

TEST(Hostfile, Forms) {
  auto r = parse_hostfile(
      "# cluster\n"
      "node1:4\n"
      "node2 slots=2 max_slots=8\n"
      "node3\n"
      "node4\tslots=3   # rack 2\n"
      "node5 max-slots=4\n"
      "\n"
      "[fe80::1]:2\n"
      "node1 slots=1\n",
      5);
  EXPECT_THAT(hosts_of(r), ElementsAre(Host{"node1", 5}, Host{"node2", 2}, Host{"node3", 5},
                                       Host{"node4", 3}, Host{"node5", 5}, Host{"fe80::1", 2}));
}

TEST(Hostfile, Errors) {
  auto r = parse_hostfile("a\nb slots=x\n", 1);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.message(), HasSubstr("hostfile line 2 \"b slots=x\""));
  EXPECT_THAT(parse_hostfile("a slots=0", 1).message(), HasSubstr("positive"));
  EXPECT_THAT(parse_hostfile("a:2 slots=3", 1).message(), HasSubstr("twice"));
  EXPECT_THAT(parse_hostfile("a slots=2 slots=3", 1).message(), HasSubstr("twice"));
  EXPECT_THAT(parse_hostfile("a cpus=2", 1).message(), HasSubstr("unknown key"));
  EXPECT_THAT(parse_hostfile("a b", 1).message(), HasSubstr("unexpected \"b\""));
  EXPECT_THAT(parse_hostfile("a max_slots=x", 1).message(), HasSubstr("line 1"));
}

TEST(SlurmHostlist, Expands) {
  auto r = expand_slurm_hostlist("node[01-04,07],gpu1");
  ASSERT_TRUE(r) << r.message();
  EXPECT_THAT(*r, ElementsAre("node01", "node02", "node03", "node04", "node07", "gpu1"));
  EXPECT_THAT(*expand_slurm_hostlist("n[8-11]"), ElementsAre("n8", "n9", "n10", "n11"));
  EXPECT_THAT(*expand_slurm_hostlist("n[098-101]"), ElementsAre("n098", "n099", "n100", "n101"));
  EXPECT_THAT(*expand_slurm_hostlist("single"), ElementsAre("single"));
  EXPECT_THAT(*expand_slurm_hostlist("a[1-2]-b,c"), ElementsAre("a1-b", "a2-b", "c"));
  EXPECT_THAT(*expand_slurm_hostlist("x[3],y[5-5] z"), ElementsAre("x3", "y5", "z"));
}

TEST(SlurmHostlist, SeveralBracketGroupsAreACrossProduct) {
  EXPECT_THAT(*expand_slurm_hostlist("rack[1-2]-n[01-02]"),
              ElementsAre("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"));
}

TEST(SlurmHostlist, Errors) {
  for (const char* bad : {"node[1-2", "node1-2]", "node[]", "node[4-1]", "node[a-b]", "node[1-]",
                          "n[[1]]", "", " , ", "bad_[1-2]", "n[1-99999999]"}) {
    auto r = expand_slurm_hostlist(bad);
    EXPECT_FALSE(r) << bad;
    EXPECT_THAT(r.message(), HasSubstr("Slurm hostlist")) << bad;
  }
  EXPECT_THAT(expand_slurm_hostlist("node[4-1]").message(), HasSubstr("backwards"));
  EXPECT_THAT(expand_slurm_hostlist("node[1-2").message(), HasSubstr("closing"));
}

TEST(SlurmCounts, Expands) {
  EXPECT_THAT(*expand_slurm_counts("2(x3),1"), ElementsAre(2, 2, 2, 1));
  EXPECT_THAT(*expand_slurm_counts("4"), ElementsAre(4));
  EXPECT_THAT(*expand_slurm_counts("1,2(x1),3"), ElementsAre(1, 2, 3));
  for (const char* bad : {"", "x", "2(3)", "2(x)", "2(x0)", "0", "-1", "2(x3", "1,,2", "2(x3)4"}) {
    EXPECT_FALSE(expand_slurm_counts(bad)) << bad;
  }
}

TEST(SlurmHosts, CombinesNamesAndCounts) {
  EXPECT_THAT(hosts_of(slurm_hosts("n[1-2]", "4,2")), ElementsAre(Host{"n1", 4}, Host{"n2", 2}));
  EXPECT_THAT(hosts_of(slurm_hosts("n[1-3]", "2(x3)")),
              ElementsAre(Host{"n1", 2}, Host{"n2", 2}, Host{"n3", 2}));
  EXPECT_THAT(hosts_of(slurm_hosts("n[1-3]", "8")),
              ElementsAre(Host{"n1", 8}, Host{"n2", 8}, Host{"n3", 8}));
  EXPECT_THAT(hosts_of(slurm_hosts("n[1-2]", "")), ElementsAre(Host{"n1", 1}, Host{"n2", 1}));
  auto mismatch = slurm_hosts("n[1-3]", "1,2");
  ASSERT_FALSE(mismatch);
  EXPECT_THAT(mismatch.message(), HasSubstr("3 hosts"));
  EXPECT_THAT(mismatch.message(), HasSubstr("2 counts"));
  EXPECT_FALSE(slurm_hosts("n[1-2],n1", "1"));
  EXPECT_FALSE(slurm_hosts("n[1-2", "1"));
}

}  // namespace
}  // namespace erun

namespace erun {
namespace {

// Hostile input: bytes are checked before parsing, and the error shows the
// line with every control byte escaped and long lines cut.
TEST(HostileInput, NulAndShellMetacharactersRejectTheLineEscaped) {
  std::string line = std::string("127.0.0.9\0';touch${IFS}/tmp/x;':1", 34);
  ASSERT_EQ(line.size(), 34u);
  auto r = parse_discovery_output("127.0.0.1:2\n" + line + "\n", 1);
  ASSERT_FALSE(r.is_ok());
  const auto& m = r.message();
  EXPECT_THAT(m, HasSubstr("discovery output line 2"));
  EXPECT_THAT(m, HasSubstr("127.0.0.9\\0';touch${IFS}/tmp/x;':1"));
  EXPECT_THAT(m, HasSubstr("byte 10 is the control character '\\0'"));
  EXPECT_EQ(m.find('\0'), std::string::npos);
}

TEST(HostileInput, EachMetacharacterAndControlByteRejects) {
  for (char c : std::string("';|&$`\"\\<>(){}*?!~/ ,@^+\x01\x1b\x7f")) {
    std::string line = std::string("node") + c + "1:2";
    auto r = parse_discovery_output(line, 1);
    EXPECT_FALSE(r.is_ok()) << "byte " << int(c);
    if (r.is_ok()) continue;
    for (char m : r.message()) {
      EXPECT_TRUE(static_cast<unsigned char>(m) >= 0x20 && m != 0x7f) << r.message();
    }
  }
  // A control byte is refused even in a comment; other bytes there are fine.
  EXPECT_FALSE(parse_discovery_output("a:1 # x\x1b[2J", 1).is_ok());
  EXPECT_TRUE(parse_discovery_output("a:1 # it's (fine); $HOME", 1).is_ok());
  // CRLF line ends and tabs stay allowed.
  EXPECT_THAT(hosts_of(parse_discovery_output("a:1\r\n\tb:2\r\n", 1)),
              ElementsAre(Host{"a", 1}, Host{"b", 2}));
}

TEST(HostileInput, HostfileAndHostsFlagCheckBytesToo) {
  auto f = parse_hostfile(std::string("a slots=2\nb\0;rm slots=1\n", 24), 1);
  ASSERT_FALSE(f.is_ok());
  EXPECT_THAT(f.message(), HasSubstr("hostfile line 2 \"b\\0;rm slots=1\""));
  auto h = parse_hosts_flag("a:1,b$(id):2", 1);
  ASSERT_FALSE(h.is_ok());
  EXPECT_THAT(h.message(), HasSubstr("-H item 2"));
  EXPECT_THAT(h.message(), HasSubstr("'$'"));
}

TEST(HostileInput, LongJunkLineIsCutInTheError) {
  std::string junk(1 << 20, 'x');
  junk[5000] = '\x07';
  auto r = parse_discovery_output("a:1\n" + junk + "\n", 1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_LT(r.message().size(), 700u) << r.message().substr(0, 600);
  EXPECT_THAT(r.message(), HasSubstr("... (1048576 bytes)"));
  EXPECT_THAT(r.message(), HasSubstr("byte 5001 is the control character '\\x07'"));
  // A long line of valid-looking characters: cut too.
  auto r2 = parse_discovery_output(std::string(300000, 'a') + "\n", 1);
  ASSERT_FALSE(r2.is_ok());
  EXPECT_LT(r2.message().size(), 700u);
}

TEST(HostileInput, SummaryCutsLongHostLists) {
  HostSet s;
  for (int i = 0; i < 100; ++i) s.add({"h" + std::to_string(i), 2});
  EXPECT_EQ(s.summary(2), "h0:2,h1:2,... (100 hosts, 200 slots)");
  EXPECT_EQ(HostSet({{"a", 1}}).summary(2), "a:1");
  auto d = diff_hosts(HostSet(), s);
  EXPECT_EQ(d.summary(2), "+h0 +h1 ... (100 added, 0 removed, 0 changed)");
}

// Linear parsing and diffing: 20,000 hosts (a quadratic parse took seconds).
TEST(HostileInput, TwentyThousandHostsParseAndDiff) {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "node" + std::to_string(i) + ":8\n";
  text += "node7:8\n";
  auto dup = parse_discovery_output(text, 1);
  ASSERT_FALSE(dup.is_ok());
  EXPECT_THAT(dup.message(), HasSubstr("lines 8 and 20001"));
  auto merged = parse_discovery_output(text, 1, DuplicatePolicy::kMerge);
  ASSERT_TRUE(merged.is_ok());
  EXPECT_EQ(merged->size(), 20000u);
  EXPECT_EQ(merged->slots_of("node7"), 16);
  EXPECT_EQ(merged->total_slots(), 160008);
}

}  // namespace
}  // namespace erun
