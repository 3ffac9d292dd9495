"""scripts/discover_hosts.sh's Kubernetes sources (k8s-service, kubectl), run
for real with a fake `getent` and a fake `kubectl` first on PATH: each fake
records its arguments and answers from a list of canned responses, the next
one at every call, as a cluster whose pods come and go would. No network, no
real kubectl, no erun build."""
import ipaddress
import os
import pathlib
import re
import shutil
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "discover_hosts.sh"
SH = "/bin/sh"
# The template the kubectl source must ask for; the fake answers as kubectl
# prints it (render_pods below).
JSONPATH = ('jsonpath={range .items[*]}{"ip="}{.status.podIP}{" deleting="}'
            '{.metadata.deletionTimestamp}{"\\n"}{end}')

FAKE = """#!/bin/sh
# A fake {name}: records its arguments, answers with the next canned response.
d={dir}
n=$(cat "$d/count" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$d/count"
printf '%s\\0' "$@" > "$d/argv.$n"
if [ ! -f "$d/rc.$n" ]; then
  echo "fake {name}: no response $n" >&2
  exit 99
fi
[ -f "$d/err.$n" ] && cat "$d/err.$n" >&2
[ -f "$d/out.$n" ] && cat "$d/out.$n"
exit "$(cat "$d/rc.$n")"
"""


class Fake:
    """A command of that name in `bin`, answering `responses` in order."""

    def __init__(self, bin_dir, name):
        self.dir = bin_dir.parent / f"fake-{name}"
        self.dir.mkdir()
        path = bin_dir / name
        path.write_text(FAKE.format(name=name, dir=self.dir))
        path.chmod(0o755)
        self.n = 0

    def respond(self, out="", rc=0, err=""):
        self.n += 1
        (self.dir / f"out.{self.n}").write_text(out)
        (self.dir / f"err.{self.n}").write_text(err)
        (self.dir / f"rc.{self.n}").write_text(str(rc))

    @property
    def calls(self):
        count = int((self.dir / "count").read_text()) if (self.dir / "count").exists() else 0
        return [(self.dir / f"argv.{i}").read_bytes().decode().split("\0")[:-1] for i in range(1, count + 1)]


@pytest.fixture
def cluster(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    class Cluster:
        getent = Fake(bin_dir, "getent")
        kubectl = Fake(bin_dir, "kubectl")
        bin = bin_dir

        def run(self, *args, env=None, path=None):
            e = {k: v for k, v in os.environ.items() if not k.startswith(("ERUN_", "SLURM_"))}
            e["PATH"] = path or f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
            e.update(env or {})
            return subprocess.run([SH, str(SCRIPT), *args], env=e, capture_output=True, text=True, timeout=30,
                                  cwd=tmp_path)

    return Cluster()


def getent_lines(*addresses, name="train-workers.default.svc.cluster.local"):
    """What `getent ahosts NAME` prints: three lines per address, the name on the first."""
    out = []
    for a in addresses:
        out += [f"{a:<15} STREAM {name}", f"{a:<15} DGRAM  ", f"{a:<15} RAW    "]
    return "".join(line + "\n" for line in out)


def render_pods(*pods):
    """What kubectl prints for JSONPATH over pods given as (podIP or None, deletionTimestamp or None)."""
    return "".join(f"ip={ip or ''} deleting={deleting or ''}\n" for ip, deleting in pods)


HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def parse_host(item):
    """erun's `host[:slots]` (docs/discovery.md, "The script contract"): (host, slots or None)."""
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", item)
    if m:
        host, slots = m.group(1), m.group(2)
        assert isinstance(ipaddress.ip_address(host.split("%")[0]), ipaddress.IPv6Address), item
    elif item.count(":") > 1:
        host, slots = item, None
        ipaddress.IPv6Address(host.split("%")[0])
    else:
        host, _, slots = item.partition(":")
        slots = slots or None
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            assert HOSTNAME.match(host), f"bad host {host!r} in {item!r}"
    if slots is not None:
        assert slots.isdigit() and 1 <= int(slots) <= 65536, f"bad slots in {item!r}"
        slots = int(slots)
    return host, slots


def discovery(stdout):
    """The lines as erun reads them: [(host, slots, draining)], each host once."""
    out = []
    for line in stdout.splitlines():
        assert line == line.strip() and line, f"unexpected line {line!r}"
        item, sep, mark = line.partition(" ")
        assert not sep or mark == "draining", f"bad line {line!r}"
        host, slots = parse_host(item)
        out.append((host, slots, bool(sep)))
    hosts = [h for h, _, _ in out]
    assert len(hosts) == len(set(hosts)), f"a host named twice: {stdout!r}"
    return out


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}, stderr: {result.stderr}"
    discovery(result.stdout)
    return result.stdout.splitlines()


def failed(result, *words):
    assert result.returncode != 0, f"expected a failure, got stdout {result.stdout!r}"
    assert result.stdout == "", f"a failure printed hosts: {result.stdout!r}"
    for w in words:
        assert w in result.stderr, f"{w!r} not in stderr: {result.stderr!r}"


# ---- k8s-service ---------------------------------------------------------------------------------------

SERVICE = {"ERUN_K8S_SERVICE": "train-workers.default.svc.cluster.local"}


def test_service_grows_and_shrinks_sorted_and_once(cluster):
    cluster.getent.respond(getent_lines("10.1.2.3"))
    cluster.getent.respond(getent_lines("10.1.2.9", "10.1.2.3", "10.1.2.10", "10.1.2.9"))
    cluster.getent.respond(getent_lines("10.1.2.10", "10.1.2.3"))
    cluster.getent.respond(getent_lines("10.1.2.3", "10.1.2.10"))
    assert ok(cluster.run("k8s-service", env=SERVICE)) == ["10.1.2.3:1"]
    assert ok(cluster.run("k8s-service", env=SERVICE)) == ["10.1.2.10:1", "10.1.2.3:1", "10.1.2.9:1"]
    assert ok(cluster.run("k8s-service", env=SERVICE)) == ["10.1.2.10:1", "10.1.2.3:1"]
    # The same set in another order: the same output (a stable host order).
    assert ok(cluster.run("k8s-service", env=SERVICE)) == ["10.1.2.10:1", "10.1.2.3:1"]
    assert cluster.getent.calls == [["ahosts", "train-workers.default.svc.cluster.local"]] * 4


def test_service_slots_and_source_from_environment(cluster):
    cluster.getent.respond(getent_lines("10.0.0.2", "10.0.0.1"))
    out = ok(cluster.run(env={**SERVICE, "ERUN_DISCOVERY_SOURCE": "k8s-service", "ERUN_K8S_SLOTS": "8"}))
    assert out == ["10.0.0.1:8", "10.0.0.2:8"]


def test_service_ipv6_in_brackets(cluster):
    cluster.getent.respond(getent_lines("fd00:10:244::5", "10.244.0.7", "fd00:10:244::5", "fd00:10:244::1a"))
    out = ok(cluster.run("k8s-service", env={**SERVICE, "ERUN_K8S_SLOTS": "2"}))
    assert out == ["10.244.0.7:2", "[fd00:10:244::1a]:2", "[fd00:10:244::5]:2"]
    assert discovery("\n".join(out)) == [("10.244.0.7", 2, False), ("fd00:10:244::1a", 2, False),
                                         ("fd00:10:244::5", 2, False)]


def test_service_without_addresses_is_an_empty_host_set(cluster):
    # getent exits 2 when the name has no address: no worker pod is ready yet.
    cluster.getent.respond("", rc=2)
    cluster.getent.respond(getent_lines("10.1.2.3"))
    cluster.getent.respond("", rc=2)
    r = cluster.run("k8s-service", env=SERVICE)
    assert (r.returncode, r.stdout) == (0, "")
    assert ok(cluster.run("k8s-service", env=SERVICE)) == ["10.1.2.3:1"]
    r = cluster.run("k8s-service", env=SERVICE)
    assert (r.returncode, r.stdout) == (0, "")


@pytest.mark.parametrize("rc", [1, 3])
def test_service_getent_failure_is_an_error(cluster, rc):
    cluster.getent.respond("", rc=rc, err="getent: something broke\n")
    failed(cluster.run("k8s-service", env=SERVICE), "getent ahosts train-workers.default.svc.cluster.local",
           f"exit code {rc}")


@pytest.mark.parametrize("value", [None, ""])
def test_service_name_required(cluster, value):
    env = {} if value is None else {"ERUN_K8S_SERVICE": value}
    failed(cluster.run("k8s-service", env=env), "ERUN_K8S_SERVICE is not set")
    assert cluster.getent.calls == []


@pytest.mark.parametrize("source,env", [("k8s-service", SERVICE), ("kubectl", {"ERUN_K8S_SELECTOR": "app=w"})])
@pytest.mark.parametrize("slots", ["0", "x", "-1", "2x", "08"])
def test_bad_slots(cluster, source, env, slots):
    failed(cluster.run(source, env={**env, "ERUN_K8S_SLOTS": slots}), "ERUN_K8S_SLOTS", "positive integer")
    assert cluster.getent.calls == [] and cluster.kubectl.calls == []


# ---- kubectl -------------------------------------------------------------------------------------------

SELECTOR = {"ERUN_K8S_SELECTOR": "app=train-workers,job-name=train"}


def test_kubectl_arguments(cluster):
    cluster.kubectl.respond(render_pods(("10.1.0.4", None)))
    cluster.kubectl.respond(render_pods(("10.1.0.4", None)))
    ok(cluster.run("kubectl", env=SELECTOR))
    ok(cluster.run("kubectl", env={**SELECTOR, "ERUN_K8S_NAMESPACE": "ml-team"}))
    without_ns, with_ns = cluster.kubectl.calls
    assert without_ns == ["get", "pods", "-l", "app=train-workers,job-name=train",
                          "--field-selector=status.phase=Running", "-o", JSONPATH]
    assert with_ns == without_ns + ["-n", "ml-team"]


def test_kubectl_grow_shrink_drain(cluster):
    slots = {**SELECTOR, "ERUN_K8S_SLOTS": "2"}
    cluster.kubectl.respond("")                                                   # no pod yet
    cluster.kubectl.respond(render_pods(("10.1.0.4", None), (None, None)))         # one without an IP yet
    cluster.kubectl.respond(render_pods(("10.1.0.4", None), ("10.1.0.12", None), ("10.1.0.7", None)))
    cluster.kubectl.respond(render_pods(("10.1.0.4", None), ("10.1.0.12", "2025-05-01T10:00:00Z"),
                                        ("10.1.0.7", None)))                        # one is being evicted
    cluster.kubectl.respond(render_pods(("10.1.0.4", None), ("10.1.0.7", None)))   # and is gone
    r = cluster.run("kubectl", env=slots)
    assert (r.returncode, r.stdout) == (0, "")
    assert ok(cluster.run("kubectl", env=slots)) == ["10.1.0.4:2"]
    assert ok(cluster.run("kubectl", env=slots)) == ["10.1.0.12:2", "10.1.0.4:2", "10.1.0.7:2"]
    out = ok(cluster.run("kubectl", env=slots))
    assert out == ["10.1.0.12:2 draining", "10.1.0.4:2", "10.1.0.7:2"]
    assert discovery("\n".join(out)) == [("10.1.0.12", 2, True), ("10.1.0.4", 2, False), ("10.1.0.7", 2, False)]
    assert ok(cluster.run("kubectl", env=slots)) == ["10.1.0.4:2", "10.1.0.7:2"]
    assert len(cluster.kubectl.calls) == 5


def test_kubectl_ipv6_default_slots_and_all_draining(cluster):
    cluster.kubectl.respond(render_pods(("fd00::b", "2025-05-01T10:00:00Z"), ("fd00::a", None), (None, "x")))
    cluster.kubectl.respond(render_pods(("fd00::b", "2025-05-01T10:00:00Z"), ("fd00::a", "2025-05-01T10:00:05Z")))
    assert ok(cluster.run("kubectl", env=SELECTOR)) == ["[fd00::a]:1", "[fd00::b]:1 draining"]
    assert ok(cluster.run("kubectl", env=SELECTOR)) == ["[fd00::a]:1 draining", "[fd00::b]:1 draining"]


def test_kubectl_same_ip_twice_printed_once(cluster):
    # hostNetwork pods share their node's IP: one host, draining when any of them is.
    cluster.kubectl.respond(render_pods(("10.0.0.5", None), ("10.0.0.5", "2025-05-01T10:00:00Z"), ("10.0.0.6", None),
                                        ("10.0.0.6", None)))
    assert ok(cluster.run("kubectl", env=SELECTOR)) == ["10.0.0.5:1 draining", "10.0.0.6:1"]


def test_kubectl_failure_is_an_error(cluster):
    cluster.kubectl.respond("", rc=1, err='Error from server (Forbidden): pods is forbidden: User "x" cannot list\n')
    cluster.kubectl.respond(render_pods(("10.1.0.4", None)))
    r = cluster.run("kubectl", env={**SELECTOR, "ERUN_K8S_NAMESPACE": "ml-team"})
    failed(r, "Forbidden", "kubectl get pods -l app=train-workers,job-name=train -n ml-team", "exit code 1")
    # The next run works again.
    assert ok(cluster.run("kubectl", env=SELECTOR)) == ["10.1.0.4:1"]


@pytest.mark.parametrize("value", [None, ""])
def test_kubectl_selector_required(cluster, value):
    env = {} if value is None else {"ERUN_K8S_SELECTOR": value}
    failed(cluster.run("kubectl", env=env), "ERUN_K8S_SELECTOR is not set")
    assert cluster.kubectl.calls == []


def test_kubectl_missing(cluster, tmp_path):
    # A PATH with the tools the script needs but no kubectl.
    tools = tmp_path / "tools"
    tools.mkdir()
    for t in ("awk", "sort", "cat"):
        os.symlink(shutil.which(t), tools / t)
    failed(cluster.run("kubectl", env=SELECTOR, path=str(tools)), "kubectl not found")


# ---- the rest of the script ----------------------------------------------------------------------------

def test_unknown_source_lists_the_new_ones(cluster):
    r = cluster.run("k8s")
    failed(r, "unknown source 'k8s'", "k8s-service", "kubectl")


def test_static_source_unchanged(cluster):
    assert ok(cluster.run("static", env={"ERUN_STATIC_HOSTS": "a:4,b:4"})) == ["a:4", "b:4"]
