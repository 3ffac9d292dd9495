// Small string helpers shared by the parsers, the CLI and the launchers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace erun {

std::string_view trim(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);
bool starts_with(std::string_view s, std::string_view prefix);
// Parses a whole string as a base-10 integer; false on junk, sign or overflow issues.
bool parse_int(std::string_view s, long& out);
// Quotes s for a POSIX shell: a word that needs no quoting is returned as is.
std::string shell_quote(std::string_view s);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// For logs and error messages from untrusted bytes: control, DEL and non-ASCII
// bytes become escapes (\0, \t, \n, \r, \xNN; a backslash doubles), so no raw
// control byte reaches a terminal or log; text longer than `max_bytes` input
// bytes is cut and ends with "... (N bytes)".
std::string escape_for_log(std::string_view s, size_t max_bytes = 200);
// A host name as one file-name component: letters, digits, '.', '-' and '_'
// kept, any other byte '_', at most 64 bytes; a name that had to change gets
// a hash of the original appended, so two hosts never share one.
std::string host_file_name(std::string_view host);

}  // namespace erun
