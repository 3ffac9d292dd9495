#!/usr/bin/env bash
# Checks an installed erun Python package as Debian's /usr/bin/python3 meets
# it: the package and its compiled module are in PYDIR, the interpreter
# searches SEARCHED (the system path PYDIR stands for: a scratch prefix or an
# unpacked .deb replaces the real one), `import erun` from there works, and
# allreduce gives the right sum alone (a world of one) and on two ranks under
# the installed ERUN. Used by install_test.sh (/usr/local layout) and
# deb_test.sh (the .deb's /usr/lib/python3/dist-packages).
#
#   tests/install/python_package_check.sh PYDIR ERUN SEARCHED
set -euo pipefail
pydir=$1
erun=$2
searched=$3
py=/usr/bin/python3
fail() { echo "python_package_check: FAIL: $*" >&2; exit 1; }

[ -f "$pydir/erun/__init__.py" ] || fail "no $pydir/erun/__init__.py"
# Subpackages too (erun.horovod.torch.elastic, three levels down).
[ -f "$pydir/erun/horovod/torch/elastic/state.py" ] || fail "no $pydir/erun/horovod/torch/elastic/state.py"
compgen -G "$pydir/erun/_erun*.so" >/dev/null || fail "no compiled module $pydir/erun/_erun*.so"
"$py" -c "import sys; sys.exit(0 if '$searched' in sys.path else 1)" ||
  fail "$py does not search $searched (its sys.path: $("$py" -c 'import sys; print(sys.path)'))"

PYTHONPATH="$pydir" "$py" - "$pydir" <<'PY' || fail "import erun from $pydir and allreduce alone"
import sys
import numpy as np
import erun
assert erun.__file__.startswith(sys.argv[1]), f"erun came from {erun.__file__}, not {sys.argv[1]}"
erun.init()
x = np.full(4, 3.0)
erun.allreduce_(x, op=erun.Sum)
assert erun.size() == 1 and (x == 3).all(), (erun.size(), x)
PY

script='import erun, numpy as np
erun.init()
x = np.full(4, 1.0 + erun.rank())
erun.allreduce_(x, op=erun.Sum)
assert erun.size() == 2 and (x == 3).all(), x
print("python rank", erun.rank(), "sum ok")'
out=$(PYTHONPATH="$pydir" "$erun" -np 2 "$py" -c "$script" 2>&1) || { echo "$out" >&2; fail "two Python ranks under $erun"; }
[ "$(grep -c "python rank [01] sum ok" <<<"$out")" -eq 2 ] || { echo "$out" >&2; fail "two Python ranks did not both report"; }
echo "python_package_check: $pydir ok (alone and 2 ranks)" >&2
