"""erun as a Python user gets it: `pip install .` into a fresh venv gives the
`erun` launcher on the venv's PATH and a package that trains under it; the
package imports in any order with a PyPI torch; the pip-installed package is
what the latest-torch pass tests (tests/CMakeLists.txt, pytorch_latest_*)."""
import importlib.util
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import ERUN, PYTHON, SOURCE

# erun/_preload.py is pure Python: load the source tree's copy alone (importing
# the package would need the compiled _erun).
_spec = importlib.util.spec_from_file_location("erun_preload", SOURCE / "python/erun/_preload.py")
assert _spec is not None and _spec.loader is not None
_preload = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_preload)


def test_erun_imports_before_torch_and_torch_still_works():
    # With a PyPI torch, _erun used to bind the CUDA toolkit's older NCCL first and
    # torch then failed to import (undefined symbol). Either order must work.
    for first, second in (("erun", "torch"), ("torch", "erun")):
        code = (f"import {first}, {second}, torch; t = torch.arange(4.0); assert float(t.sum()) == 6.0; "
                f"import erun; print('ok', torch.__version__)")
        r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
        assert r.returncode == 0 and r.stdout.startswith("ok"), (first, r.stdout, r.stderr)


def _touch(path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_environment_cuda_libraries_come_from_the_first_entry_with_nvidia_wheels(tmp_path):
    empty, first, second = tmp_path / "empty", tmp_path / "a", tmp_path / "b"
    empty.mkdir()
    _touch(first / "nvidia/nccl/lib/libnccl.so.2")
    _touch(first / "nvidia/cu13/lib/libcudart.so.13")
    _touch(first / "nvidia/cu13/lib/libcudart.so")          # a development link: not a soname
    _touch(first / "nvidia/cu13/lib/libcudart_static.a")
    _touch(second / "nvidia/cuda_runtime/lib/libcudart.so.12")
    found = _preload.environment_cuda_libraries(["", str(empty), str(first), str(second)])
    assert found == [str(first / "nvidia/cu13/lib/libcudart.so.13"), str(first / "nvidia/nccl/lib/libnccl.so.2")]
    assert _preload.environment_cuda_libraries([str(empty), str(tmp_path / "missing")]) == []


def test_the_latest_torch_pass_tests_the_pip_installed_package():
    if not os.environ.get("ERUN_TEST_INSTALLED"):
        pytest.skip("the Debian pass tests the build tree (PYTHONPATH); this checks the venv pass")
    code = "import erun, erun.torch, sys; print(erun.__file__); print(erun._erun.__file__)"
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120, cwd="/",
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr
    venv = pathlib.Path(PYTHON).parent.parent
    for line in r.stdout.split():
        assert pathlib.Path(line).resolve().is_relative_to(venv.resolve()), (line, venv)
    assert ERUN.parent == venv / "bin", ERUN


def _pip_install_into_fresh_venv(tmp_path, *pip_args):
    """A fresh venv on Debian's python3 (seeing Debian's torch and numpy), `pip install
    *pip_args` into it; (the venv, an environment with its bin/ first on PATH). Runs once,
    in the Debian pass."""
    if os.environ.get("ERUN_TEST_INSTALLED"):
        pytest.skip("runs once, in the Debian pass")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ERUN_BIN")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    if shutil.which("ccache"):
        # As scripts/venv.sh builds: the compiles are ccache's hits. Without
        # it, each of the two installs compiled erun whole, beside the other
        # tests (715 s of a fresh clone's ctest, against about 60 s).
        env.update(CMAKE_C_COMPILER_LAUNCHER="ccache", CMAKE_CXX_COMPILER_LAUNCHER="ccache", CC="cc", CXX="c++")
    r = subprocess.run([str(venv / "bin/pip"), "install", "-q", *pip_args], capture_output=True, text=True,
                       timeout=1500, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return venv, env


def test_pip_install_into_a_fresh_venv_gives_a_launcher_that_trains(tmp_path):
    venv, env = _pip_install_into_fresh_venv(tmp_path, str(SOURCE))
    launcher = venv / "bin/erun"
    assert launcher.is_file() and os.access(launcher, os.X_OK)
    site = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pkg = pathlib.Path(site) / "erun"
    assert (pkg / "py.typed").is_file()
    assert list(pkg.glob("_erun.*.so")) and (pkg / "lib/liberun.so.0").exists()
    assert (pkg / "include/erun/erun.hpp").is_file()
    # Exactly what a user types, from the venv's PATH.
    r = subprocess.run(["erun", "-np", "2", "python", str(SOURCE / "examples/torch/elastic_ddp.py"),
                        "--steps", "200", "--step-ms", "0"], capture_output=True, text=True, timeout=600, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "done: 200 steps" in r.stdout and "step 200 world 2" in r.stdout, r.stdout
    # The workers imported the venv's erun, not a build tree's.
    r = subprocess.run(["python", "-c", "import erun; print(erun.__file__)"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, check=True)
    assert pathlib.Path(r.stdout.strip()).is_relative_to(pathlib.Path(site)), r.stdout


def test_editable_install_reads_the_python_files_from_the_source_tree(tmp_path):
    venv, env = _pip_install_into_fresh_venv(tmp_path, "-e", str(SOURCE))
    r = subprocess.run([str(venv / "bin/python"), "-c", "import erun, erun.torch; print(erun.__file__); "
                        "print(erun.torch.__file__); print(erun.ReduceOp.SUM)"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert pathlib.Path(lines[0]) == SOURCE / "python/erun/__init__.py", lines
    assert pathlib.Path(lines[1]) == SOURCE / "python/erun/torch.py", lines
    r = subprocess.run([str(venv / "bin/erun"), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("erun "), r.stdout + r.stderr
