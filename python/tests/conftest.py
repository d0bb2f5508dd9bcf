"""Test set-up: the bundled plugins come from the cargo build of this
checkout (target/debug, else target/release), Ferrite first, then Cobalt,
so device 0 is Ferrite's (host-visible memory) and the last is Cobalt's
(private memory). `scripts/test` builds the workspace before the tests."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _plugins():
    for profile in ("debug", "release"):
        d = ROOT / "target" / profile
        ferrite, cobalt = d / "libpolychip_vendor_ferrite.so", d / "libpolychip_vendor_cobalt.so"
        if ferrite.exists() and cobalt.exists():
            return f"{ferrite}:{cobalt}", d
    raise RuntimeError("build the workspace first (cargo build --workspace): the bundled plugins are missing")


PLUGIN_PATH, PROFILE_DIR = _plugins()
os.environ["POLYCHIP_PLUGIN_PATH"] = PLUGIN_PATH
os.environ["POLYCHIP_NO_BUNDLED_PLUGINS"] = "1"

import polychip  # noqa: E402 - after the environment is set


@pytest.fixture(scope="session")
def ferrite():
    return next(d for d in polychip.devices() if d.vendor == "Ferrite")


@pytest.fixture(scope="session")
def cobalt():
    return next(d for d in polychip.devices() if d.vendor == "Cobalt")
