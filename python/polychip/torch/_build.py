"""Builds and loads the C++ half of the PyTorch backend (``csrc/``).

PyTorch's C++ ABI is that of the installed ``torch``, so the extension is
compiled against it on first use (``torch.utils.cpp_extension``; about a
minute, once per torch version and source), into a cache folder:
``$POLYCHIP_TORCH_CACHE``, else ``$XDG_CACHE_HOME/polychip``, else
``~/.cache/polychip``. It links the already-loaded ``polychip._native``
module by path, so PyTorch and the ``polychip`` package share one host.
"""

import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import torch

from .. import _native

_HERE = Path(__file__).resolve().parent
_SOURCES = [_HERE / "csrc" / "backend.cpp", _HERE / "csrc" / "autocast.cpp"]


def _header_dir() -> Path:
    """The folder holding ``libpolychip.h``: the repository's ``include/``
    in a source checkout (editable install), else the copy beside the
    sources in an installed package."""
    repo = _HERE.parents[2]
    checkout = repo / "include" if (repo / "spec" / "ops.toml").is_file() else None
    for d in (checkout, _HERE / "csrc"):
        if d is not None and (d / "libpolychip.h").is_file():
            return d
    raise ImportError(
        f"polychip.torch: libpolychip.h is neither in {_HERE / 'csrc'} nor in the "
        "repository's include/ (reinstall the polychip package)"
    )


def _cache_root() -> Path:
    if os.environ.get("POLYCHIP_TORCH_CACHE"):
        return Path(os.environ["POLYCHIP_TORCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "polychip"


def load() -> ModuleType:
    """The compiled backend module, built if this source, header, torch and
    native module have not been built together before."""
    from torch.utils import cpp_extension

    native = Path(_native.__file__).resolve()
    headers = _header_dir()
    digest = hashlib.sha256()
    for path in [*_SOURCES, headers / "libpolychip.h"]:
        digest.update(path.read_bytes())
    digest.update(f"{torch.__version__}|{native}|{sys.version_info[:2]}".encode())
    key = digest.hexdigest()[:16]
    build = _cache_root() / f"torch-{torch.__version__.replace('+', '-')}-{key}"
    build.mkdir(parents=True, exist_ok=True)
    # cpp_extension runs ninja, which pip installs beside the interpreter.
    path = os.environ.get("PATH", "")
    for scripts in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        if scripts and scripts not in path.split(os.pathsep):
            path = scripts + os.pathsep + path
    os.environ["PATH"] = path
    return cpp_extension.load(
        name=f"polychip_torch_{key}",
        sources=[str(s) for s in _SOURCES],
        extra_include_paths=[str(headers)],
        extra_cflags=["-O2", "-Wall", "-Wno-unused-function"],
        # By path: the loader matches the module Python already loaded.
        extra_ldflags=[str(native)],
        build_directory=str(build),
        verbose=bool(os.environ.get("POLYCHIP_TORCH_VERBOSE_BUILD")),
    )
