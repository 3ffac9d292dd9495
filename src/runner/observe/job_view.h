// How a job is shown: the live status line, the Prometheus page of
// --metrics-port, and `erun report` (a past job's summary, or its picture
// drawn by python -m erun.report). All read a JobAccount.
#pragma once

#include <string>

#include "runner/observe/job_account.h"

namespace erun {

// "gen 5 | 4 ranks on 2 hosts | last fault 3m12s ago | commit 36, 1.2 s ago | goodput 93.1 %" (ASCII).
std::string status_text(const JobAccount& a, double now);
// The /metrics page in the Prometheus text format (version 0.0.4).
std::string prometheus_text(const JobAccount& a, double now);
// `erun report EVENTS.jsonl [-o FILE.svg|FILE.html] [--format svg|html]`:
// argv[0] is "report". Returns the exit code.
int report_main(int argc, char** argv);

}  // namespace erun
