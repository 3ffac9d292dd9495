// Hosts and their slots, the parsers for every way a user names them, and the
// diff between two discoveries. Pure functions and values: no I/O here.
//
// Host order is meaningful: it is the order the user (or the script) gave, and
// the Planner fills hosts in that order. Parsers return a clear error naming
// the offending line or item and what to do, never a partial result.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace erun {

struct Host {
  std::string name;  // hostname, IPv4, or IPv6 without brackets
  int slots = 1;
  // Discovery listed it as `host[:slots] draining`: it leaves the job at its
  // workers' next commit (docs/discovery.md).
  bool draining = false;
  // `rack=NAME` on its discovery line ("" when none): a standby is taken
  // from the same host first, then from the same rack (docs/discovery.md).
  std::string rack = {};
  bool operator==(const Host&) const = default;
};

class HostSet {
 public:
  HostSet() = default;
  explicit HostSet(std::vector<Host> hosts) : hosts_(std::move(hosts)) {}

  const std::vector<Host>& hosts() const { return hosts_; }
  bool empty() const { return hosts_.empty(); }
  size_t size() const { return hosts_.size(); }
  int total_slots() const;
  // Index of a host by name, or -1.
  int find(std::string_view name) const;
  int slots_of(std::string_view name) const;  // 0 when absent
  // Adds a host at the end, or adds its slots to an existing entry (linear
  // search: parsers use append_new / add_slots_at with their own index).
  void add(Host h);
  // Appends a host the caller knows is not in the set yet.
  void append_new(Host h);
  // Adds slots to the host at `index`.
  void add_slots_at(size_t index, int slots);
  void mark_draining_at(size_t index);
  void set_rack_at(size_t index, std::string rack);
  bool any_draining() const;
  // One line, e.g. "a:4,b:2" (IPv6 in brackets).
  std::string to_string() const;
  // For logs: to_string() of at most `max_hosts` hosts, then
  // ",... (N hosts, M slots)" when there are more.
  std::string summary(size_t max_hosts = 16) const;
  bool operator==(const HostSet&) const = default;

 private:
  std::vector<Host> hosts_;
};

// How to treat a host named twice in one input.
enum class DuplicatePolicy { kMerge, kReject };

// Discovery script output: one `host[:slots]` per line (`host[:slots]
// draining` for a host that leaves on notice); blank lines and `#`
// comments (whole-line or trailing) ignored; whitespace trimmed; IPv6 as
// `[::1]:2` or a bare address without slots. default_slots applies to lines
// without slots. Duplicates are merged (slots added) or rejected.
Result<HostSet> parse_discovery_output(std::string_view text, int default_slots,
                                       DuplicatePolicy dup = DuplicatePolicy::kReject);

// -H / --hosts: "a:4,b:4" (also "a,b" with default_slots).
Result<HostSet> parse_hosts_flag(std::string_view value, int default_slots);

// --hostfile: lines as `host:4`, `host slots=4` (mpirun; max_slots= ignored),
// or `host`; comments and blank lines ignored.
Result<HostSet> parse_hostfile(std::string_view text, int default_slots);

// Validates one hostname or address (RFC 1123 labels, IPv4, IPv6).
Status validate_hostname(std::string_view name);

// Slurm: "node[01-04,07],gpu1" -> node01..node04,node07,gpu1 (zero padding kept,
// several bracket groups per name, nested commas inside brackets).
Result<std::vector<std::string>> expand_slurm_hostlist(std::string_view expr);
// Slurm: SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE, e.g. "2(x3),1" -> 2,2,2,1.
Result<std::vector<int>> expand_slurm_counts(std::string_view expr);
// Hosts of an allocation: names from the hostlist, slots from the counts (one
// count per host, or a single count for all).
Result<HostSet> slurm_hosts(std::string_view nodelist, std::string_view counts);

struct SlotChange {
  std::string host;
  int old_slots = 0;
  int new_slots = 0;
  bool operator==(const SlotChange&) const = default;
};

struct HostDiff {
  std::vector<std::string> added;    // in the new set's order
  std::vector<std::string> removed;  // in the old set's order
  std::vector<SlotChange> changed;   // in the new set's order
  bool empty() const { return added.empty() && removed.empty() && changed.empty(); }
  std::string to_string() const;     // "+c -a b:2->4" or "no change"
  // For logs: like to_string() but at most `max_items` items, then a count.
  std::string summary(size_t max_items = 16) const;
};

HostDiff diff_hosts(const HostSet& before, const HostSet& after);

}  // namespace erun
