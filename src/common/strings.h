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

}  // namespace erun
