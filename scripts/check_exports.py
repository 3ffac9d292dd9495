#!/usr/bin/env python3
"""Checks that liberun.so exports exactly the public API of include/erun.

Reads `nm -DC --defined-only LIB` and the headers of INCLUDE_DIR, and reports
  - every exported symbol outside namespace erun (spdlog, fmt, Gloo, std::...),
  - every exported erun:: symbol whose top-level name (erun::X, or
    erun::detail::X) is not declared at namespace scope in the headers: the
    library's internals (TcpCommunicator, RendezvousServer, ShmCommunicator,
    Driver, wire::..., ...),
  - every key public symbol that is missing (erun::init, erun::State's
    members, the exceptions' typeinfo, ...).
Exit 0: none of them. The header parser relies on the headers' layout: names
declared at namespace scope start at column 0, and a namespace closes with
`}  // namespace NAME`.

  check_exports.py LIB INCLUDE_DIR
  check_exports.py --self-test
"""
import os
import re
import subprocess
import sys

# Internal classes named in the failure so that a leak of the usual suspects is plain.
INTERNAL = ["TcpCommunicator", "RendezvousServer", "ShmCommunicator", "Driver"]

# Exported symbols (demangled, matched as prefixes) that a program needs.
REQUIRED = [
    "erun::init()",
    "erun::shutdown()",
    "erun::State::State(erun::Context&)",
    "erun::State::~State()",
    "erun::State::commit()",
    "erun::State::restore()",
    "erun::State::sync()",
    "erun::State::register_bytes(",
    "erun::State::register_string(",
    "erun::State::check_size(",
    "erun::State::set_checkpoint_dir(",
    "erun::Context::gpu()",
    "erun::GpuCommunicator::allreduce(",
    "erun::ElasticSampler::ElasticSampler(",
    "erun::detail::rejoin(",
    "erun::detail::no_retry(",
    "erun::data_type_size(",
    "typeinfo for erun::Error",
    "typeinfo for erun::CommError",
    "typeinfo for erun::CollectiveMismatch",
    "typeinfo for erun::HostsUpdated",
]

# What nm -C puts before the entity a symbol belongs to.
PREFIXES = ["typeinfo name for ", "typeinfo for ", "construction vtable for ", "vtable for ", "VTT for ",
            "non-virtual thunk to ", "virtual thunk to ", "covariant return thunk to ", "guard variable for ",
            "TLS init function for ", "TLS wrapper function for ", "reference temporary #0 for "]

TYPE_DECL = re.compile(r"^(?:class|struct|union|enum(?:\s+class)?)\s+(?:ERUN_API\s+)?(\w+)")
FUNC_DECL = re.compile(r"(\w+)\s*\(")
NAMESPACE_OPEN = re.compile(r"^namespace\s+(\w+)\s*\{")
NAMESPACE_CLOSE = re.compile(r"^}\s*//\s*namespace")
NOT_A_FUNCTION = ("template", "using", "#", "//", "}", "namespace", "inline constexpr", "static_assert")


def declared_names(texts):
    """Top-level names declared in namespace erun by the header texts:
    'Name' for erun::Name, 'detail::Name' for erun::detail::Name."""
    names = set()
    for text in texts:
        stack = []
        for line in text.splitlines():
            if (m := NAMESPACE_OPEN.match(line)):
                stack.append(m.group(1))
                continue
            if NAMESPACE_CLOSE.match(line):
                if stack:
                    stack.pop()
                continue
            if not stack or stack[0] != "erun" or not line or line[0].isspace():
                continue
            scope = "::".join(stack[1:])
            name = None
            if (m := TYPE_DECL.match(line)):
                name = m.group(1)
            elif not line.startswith(NOT_A_FUNCTION) and (m := FUNC_DECL.search(line)):
                name = m.group(1)
            if name:
                names.add(f"{scope}::{name}" if scope else name)
    return names


def strip_prefixes(name):
    changed = True
    while changed:
        changed = False
        for p in PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p):], True
    return name


def qualified_components(name):
    """The components of the qualified name at the start of `name`
    (template arguments skipped): 'erun::X<int>::f(int)' -> ['erun', 'X', 'f']."""
    parts, i = [], 0
    while True:
        m = re.match(r"[A-Za-z_]\w*", name[i:])
        if not m:
            return parts
        parts.append(m.group(0))
        i += m.end()
        if name.startswith("<", i):
            depth = 0
            while i < len(name):
                depth += {"<": 1, ">": -1}.get(name[i], 0)
                i += 1
                if depth == 0:
                    break
        if not name.startswith("::", i):
            return parts
        i += 2


def entity(symbol):
    """(components of the erun:: entity a demangled symbol belongs to), or None
    when it is not in namespace erun."""
    name = strip_prefixes(symbol)
    if not name.startswith("erun::"):
        # A function template instance starts with its return type.
        head = name.split("(", 1)[0]
        at = head.find(" erun::")
        if at < 0:
            return None
        name = name[at + 1:]
    return qualified_components(name)


def problems(symbols, declared):
    out = []
    for s in symbols:
        parts = entity(s)
        if parts is None:
            out.append(f"not in namespace erun: {s}")
            continue
        top = parts[1] if len(parts) > 1 else ""
        if top == "detail" and len(parts) > 2:
            top = "detail::" + parts[2]
        if top in INTERNAL:
            out.append(f"internal class {top} is exported: {s}")
        elif top not in declared:
            out.append(f"erun::{top} is not declared in include/erun: {s}")
    for r in REQUIRED:
        if not any(s.startswith(r) for s in symbols):
            out.append(f"public symbol missing: {r}...")
    return out


def exported_symbols(lib):
    text = subprocess.run(["nm", "-DC", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    symbols = []
    for line in text.splitlines():
        fields = line.split(None, 2)
        if len(fields) == 3:
            symbols.append(fields[2])
    return symbols


def self_test():
    header = """namespace erun {
class Context;
class ERUN_API State {
 public:
  void commit();
};
struct WorkerInfo {
  int rank = 0;
};
ERUN_API Context& init();
template <typename Fn>
auto run(State& state, Fn&& fn) -> decltype(fn(state)) {
  return fn(state);
}
namespace detail {
ERUN_API void rejoin(State& state);
}  // namespace detail
}  // namespace erun
"""
    declared = declared_names([header])
    assert declared == {"Context", "State", "WorkerInfo", "init", "run", "detail::rejoin"}, declared
    assert entity("typeinfo for erun::CommError") == ["erun", "CommError"]
    assert entity("non-virtual thunk to erun::TcpCommunicator::rank() const") == ["erun", "TcpCommunicator", "rank"]
    assert entity("erun::Result<std::vector<int, std::allocator<int> > >::value() &") == ["erun", "Result", "value"]
    assert entity("std::vector<char> erun::wire::encode<int>(int)") == ["erun", "wire", "encode"]
    assert entity("fmt::v9::format_error::~format_error()") is None
    good = [r + "int)" if r.endswith("(") else r for r in REQUIRED]
    declared_all = declared | {"shutdown", "Error", "CommError", "CollectiveMismatch", "HostsUpdated",
                               "GpuCommunicator", "ElasticSampler", "data_type_size", "detail::no_retry"}
    assert problems(good, declared_all) == [], problems(good, declared_all)
    bad = problems(good + ["erun::RendezvousServer::start()", "erun::wire::send_all(int)", "spdlog::info()",
                           "typeinfo for erun::ShmCommunicator"], declared_all)
    assert len(bad) == 4, bad
    assert "internal class RendezvousServer" in bad[0] and "internal class ShmCommunicator" in bad[3], bad
    assert "erun::wire is not declared" in bad[1] and "not in namespace erun" in bad[2], bad
    missing = problems([g for g in good if not g.startswith("erun::init")], declared_all)
    assert missing == ["public symbol missing: erun::init()..."], missing
    print("check_exports self-test: ok")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    lib, include = argv[1], argv[2]
    texts = []
    for name in sorted(os.listdir(include)):
        if name.endswith(".hpp"):
            with open(os.path.join(include, name)) as f:
                texts.append(f.read())
    declared = declared_names(texts)
    if not declared:
        print(f"check_exports: no declarations found in {include}", file=sys.stderr)
        return 1
    symbols = exported_symbols(lib)
    found = problems(symbols, declared)
    for p in found:
        print(p)
    erun_count = sum(1 for s in symbols if "erun::" in s)
    print(f"check_exports: {lib}: {len(symbols)} exported symbols ({erun_count} erun::), "
          f"{len(found)} problem(s); public names: {', '.join(sorted(declared))}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
