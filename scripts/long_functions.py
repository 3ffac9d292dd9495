#!/usr/bin/env python3
"""Lists the functions of C++ sources longer than a limit.

A rough scanner, not a parser: it blanks comments, string and character
literals and preprocessor lines, then matches braces. A `{` at namespace or
class level opens a function body when the text before it (back to the last
`;`, `{` or `}` at that level) has a parameter list and is not a namespace,
class, struct, union, enum, extern block or a variable's initializer; the
braces of a constructor's member initializers (`a_{x}`) are taken as part of
its signature. A function's length counts its lines from the first line of
its signature (template line included) to its closing brace; lambdas and local
classes count toward the function that holds them.

  long_functions.py [--max N] PATH...   print each function over N lines (default 60)
                                        under PATH (.cc and .h files); exit 1 if any
  long_functions.py --self-test
"""
import os
import re
import sys
import tempfile

CONTAINER = re.compile(r"^(?:template\s*<.*>\s*)?(?:inline\s+)?(namespace|class|struct|union|enum|extern)\b", re.S)
ACCESS = re.compile(r"^\s*(?:public|private|protected)\s*:(?!:)")
NOT_A_BODY = {"const", "noexcept", "override", "final", "mutable", "try"}
RAW_STRING = re.compile(r'R"([^(\s]*)\(')  # R"delim( opens a raw string literal
IDENT_END = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\s*$")


def blank(text):
    """The text with comments, literals and preprocessor lines turned to spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and (raw := RAW_STRING.match(text, i, i + 20)) and not (
                i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            delim = raw.group(1)
            end = text.find(")" + delim + '"', i)
            j = n if end < 0 else end + len(delim) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i and (text[i - 1].isalnum()) and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")  # a digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def top_level_parens(header):
    """The header with everything inside parentheses removed, and whether it had any."""
    depth, kept, had = 0, [], False
    for c in header:
        if c == "(":
            depth += 1
            had = True
        elif c == ")":
            depth -= 1
        elif depth == 0:
            kept.append(c)
    return "".join(kept), had


def function_name(header):
    header = " ".join(header.split())
    op = header.find("operator")
    if op >= 0:
        paren = header.find("(", op + len("operator") + (2 if header[op + 8:op + 11].strip().startswith("()") else 0))
        start = header.rfind(" ", 0, op) + 1
        return header[start:paren].strip()
    paren = header.find("(")
    before = header[:paren].rstrip()
    m = re.search(r"(~?[A-Za-z_][\w]*(?:<[^()]*?>)?(?:::~?[A-Za-z_]\w*(?:<[^()]*?>)?)*)$", before)
    return m.group(1) if m else before.split()[-1] if before.split() else "?"


def functions(text):
    """(name, first line, last line) of each function body in the text of one file."""
    src = blank(text)
    line_of = [0] * (len(src) + 1)
    line = 1
    for i, c in enumerate(src):
        line_of[i] = line
        if c == "\n":
            line += 1
    line_of[len(src)] = line

    found = []
    scopes = []  # 'container' | 'other' | ('function', name, start) | 'init' (a member initializer's braces)
    header_start = 0
    i = 0
    while i < len(src):
        c = src[i]
        in_container = not scopes or scopes[-1] == "container"
        if c == "{":
            if in_container:
                header = src[header_start:i]
                header = ACCESS.sub(lambda m: " " * len(m.group(0)), header)
                stripped = header.strip()
                outside, has_params = top_level_parens(stripped)
                if CONTAINER.match(stripped):
                    kind = "other" if CONTAINER.match(stripped).group(1) == "enum" else "container"
                    scopes.append(kind)
                    header_start = i + 1
                elif has_params and "=" not in outside.replace("operator", "").split("(")[0] \
                        or has_params and re.search(r"\boperator\s*[^\s(]*=", stripped):
                    ident = IDENT_END.search(src[header_start:i])
                    init_list = re.search(r"\)[^()]*?(?<!:):(?!:)", stripped) and "->" not in outside
                    if init_list and ident and ident.group(1) not in NOT_A_BODY:
                        scopes.append("init")
                    else:
                        first = header_start + (len(header) - len(header.lstrip()))
                        scopes.append(("function", function_name(stripped), line_of[first]))
                else:
                    scopes.append("other")
            else:
                scopes.append("other")
        elif c == "}":
            if scopes:
                top = scopes.pop()
                if isinstance(top, tuple):
                    found.append((top[1], top[2], line_of[i]))
                if top != "init" and (not scopes or scopes[-1] == "container"):
                    header_start = i + 1
        elif c == ";" and in_container:
            header_start = i + 1
        i += 1
    return found


def scan(paths, limit):
    out = []
    for root in paths:
        walk = [(os.path.dirname(root), [], [os.path.basename(root)])] if os.path.isfile(root) else os.walk(root)
        for dirpath, dirs, files in walk:
            dirs.sort()
            for name in sorted(files):
                if not name.endswith((".cc", ".h", ".hpp", ".cpp")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, errors="replace") as f:
                    text = f.read()
                for fn, first, last in functions(text):
                    if last - first + 1 > limit:
                        out.append((path, first, fn, last - first + 1))
    return out


SELF_TEST = r'''#include "x.h"
#define LONG_MACRO(a) \
  { a; }
namespace erun {
namespace {
const char* kText = "{ not a brace";  // nor this {
int table[] = {1, 2, 3};
}  // namespace

/* a comment { */
class Thing : public Base {
 public:
  Thing(int a) : a_{a}, b_(a) {
    one();
    two();
    three();
  }
  int get() const { return a_; }

 private:
  int a_{0};
  int b_;
};

template <typename T>
std::vector<T> Thing::many(int n,
                           int m) const {
  auto f = [&](int x) {
    if (x) {
      return 1;
    }
    return 2;
  };
  char c = '{';
  return R"({)";
}

bool operator==(const Thing& a, const Thing& b) {
  return a.get() == b.get();
}

enum class Kind { a, b };
}  // namespace erun
'''


def self_test():
    got = functions(SELF_TEST)
    want = [("Thing", 13, 17), ("get", 18, 18), ("Thing::many", 25, 36), ("operator==", 38, 40)]
    ok = got == want
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "a.cc"), "w") as f:
            f.write(SELF_TEST)
        long_ones = scan([d], 5)
        ok = ok and [(fn, n) for _, _, fn, n in long_ones] == [("Thing::many", 12)]
    if not ok:
        print(f"self-test failed:\n  got  {got}\n  want {want}\n  over 5 lines: {long_ones}")
        return 1
    print("self-test passed")
    return 0


def main(argv):
    args = argv[1:]
    if args == ["--self-test"]:
        return self_test()
    limit = 60
    if args[:1] == ["--max"] and len(args) >= 2:
        limit = int(args[1])
        args = args[2:]
    if not args:
        print(__doc__)
        return 2
    long_ones = scan(args, limit)
    for path, line, name, n in sorted(long_ones, key=lambda r: -r[3]):
        print(f"{path}:{line}: {name} is {n} lines")
    print(f"{len(long_ones)} functions over {limit} lines")
    return 1 if long_ones else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
