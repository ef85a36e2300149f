"""A pip-installed platform plugin: discovery, selection and kernel registration.

The fake plugin (tests/plugins/fake_platform) is built into a wheel and
installed, with deepinfer-core's wheel, into a throwaway environment; a driver
process there runs the loader under each environment setting. The registry
rules that involve a plugin are checked in-process on the plugin's own classes.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.plugins._venvs import LayeredVenv, clean_env

from deepinfer_core.kernels.ops import register_builtin_ops
from deepinfer_core.kernels.registry import KernelRegistry
from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.testing.conformance import check_impl

pytestmark = pytest.mark.packaging

_MARK = "@@DEEPINFER-SCENARIOS@@"

# One process runs every scenario: the loader reads DEEPINFER_ACCELERATOR and
# scans entry points on each load_platform() call, and the fake plugin reads
# its switches on each detect(), so setting os.environ between calls is
# equivalent to starting a process per scenario, at a fraction of the time.
_DRIVER = f"""
import importlib, json, os, sys
scenarios = json.loads(sys.argv[1])
from deepinfer_core.platform.loader import PlatformNotAvailableError, installed_platforms, load_platform
import deepinfer_core.platform.interface as iface
results = {{}}
base_env = dict(os.environ)
base_path = list(sys.path)
for name, spec in scenarios.items():
    os.environ.clear(); os.environ.update(base_env); os.environ.update(spec.get("env", {{}}))
    sys.path[:] = base_path + spec.get("path", []); importlib.invalidate_caches()
    out = {{"installed": sorted(installed_platforms())}}
    try:
        p = load_platform()
        out["platform"] = type(p).__module__ + ":" + type(p).__qualname__
        out["name"] = p.name
        out["memory"] = p.total_memory_bytes()
    except PlatformNotAvailableError as exc:
        out["error"] = str(exc)
    results[name] = out
results["_core_file"] = iface.__file__
print({_MARK!r} + json.dumps(results))
"""

_REGISTRATION = """
import os
from deepinfer_core.kernels.ops import register_builtin_ops
from deepinfer_core.kernels.registry import KernelRegistry
from deepinfer_core.kernels.resolve import resolve_kernels
from deepinfer_core.platform.loader import load_kernel_packs, load_platform

platform = load_platform()
assert platform.name == "fake", platform
reg = KernelRegistry()
register_builtin_ops(reg)
table = resolve_kernels(["norm.rms", "rope.interleaved"], platform, registry=reg)
assert table["norm.rms"].__module__ == "deepinfer_fake_platform.kernels", table["norm.rms"]
assert table["rope.interleaved"] is reg.op("rope.interleaved").reference
assert load_kernel_packs(reg) == ["fake_pack"]
assert reg.resolve("norm.rms_unweighted", ("fake_pack",))[0] == "fake_pack"
os.environ["DEEPINFER_KERNELS"] = "reference"
assert resolve_kernels(["norm.rms"], platform, registry=reg)["norm.rms"] is reg.op("norm.rms").reference
print("REGISTRATION-OK")
"""

TWIN_ENTRY_POINTS = "[deepinfer.platforms]\ntwin = deepinfer_fake_platform:detect\n"


@pytest.fixture(scope="module")
def fake_env(wheels, tmp_path_factory) -> LayeredVenv:
    env = LayeredVenv(tmp_path_factory.mktemp("fake-venv") / "venv")
    env.install(wheels["deepinfer-core"], wheels["deepinfer-fake-platform"])
    return env


@pytest.fixture(scope="module")
def twin_dir(tmp_path_factory):
    """A second installed distribution whose platform entry point also answers (a real dist-info)."""
    root = tmp_path_factory.mktemp("twin")
    info = root / "deepinfer_fake_twin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepinfer-fake-twin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(TWIN_ENTRY_POINTS)
    return root


@pytest.fixture(scope="module")
def scenarios(fake_env, twin_dir) -> dict:
    specs = {
        "explicit_fake": {"env": {"DEEPINFER_ACCELERATOR": "fake"}},
        "auto": {},
        "explicit_cpu": {"env": {"DEEPINFER_ACCELERATOR": "cpu"}},
        "ascend_missing": {"env": {"DEEPINFER_ACCELERATOR": "ascend"}},
        "unknown": {"env": {"DEEPINFER_ACCELERATOR": "tpu9000"}},
        "auto_absent": {"env": {"DEEPINFER_FAKE_PLATFORM_ABSENT": "1"}},
        "explicit_absent": {"env": {"DEEPINFER_ACCELERATOR": "fake", "DEEPINFER_FAKE_PLATFORM_ABSENT": "1"}},
        "explicit_broken": {"env": {"DEEPINFER_ACCELERATOR": "fake", "DEEPINFER_FAKE_PLATFORM_BROKEN": "1"}},
        "auto_broken": {"env": {"DEEPINFER_FAKE_PLATFORM_BROKEN": "1"}},
        "auto_two": {"path": [str(twin_dir)]},
        "explicit_twin": {"env": {"DEEPINFER_ACCELERATOR": "twin"}, "path": [str(twin_dir)]},
    }
    proc = fake_env.run(_DRIVER, json.dumps(specs))
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(_MARK))
    return json.loads(line[len(_MARK):])


FAKE = "deepinfer_fake_platform.platform:FakePlatform"
CPU = "deepinfer_core.platform.cpu:CpuPlatform"


def test_installed_copy_of_core_is_used(scenarios, fake_env):
    assert scenarios["_core_file"].startswith(str(fake_env.site_packages)), scenarios["_core_file"]
    assert scenarios["auto"]["installed"] == ["cpu", "fake"]


def test_env_var_selects_the_installed_plugin(scenarios):
    got = scenarios["explicit_fake"]
    assert got["platform"] == FAKE and got["name"] == "fake"
    assert got["memory"] == 3 << 30  # FakePlatform's own answer, not the host's RAM


def test_single_detected_platform_is_chosen_without_env_var(scenarios):
    assert scenarios["auto"]["platform"] == FAKE


def test_cpu_is_always_available(scenarios):
    assert scenarios["explicit_cpu"]["platform"] == CPU
    assert scenarios["auto_absent"]["platform"] == CPU  # nothing detected -> cpu
    assert scenarios["auto_broken"]["platform"] == CPU  # a broken plugin does not take auto-selection down


@pytest.mark.parametrize("case, requested", [("ascend_missing", "ascend"), ("unknown", "tpu9000")])
def test_requesting_a_platform_that_is_not_installed_names_the_installed_ones(scenarios, case, requested):
    err = scenarios[case].get("error")
    assert err is not None, f"expected PlatformNotAvailableError, got {scenarios[case]}"
    assert repr(requested) in err and "installed platforms: cpu, fake" in err


def test_requesting_an_installed_but_unusable_plugin_says_why(scenarios):
    absent = scenarios["explicit_absent"]["error"]
    assert "'fake'" in absent and "no usable device" in absent
    broken = scenarios["explicit_broken"]["error"]
    assert "RuntimeError" in broken and "told to break" in broken


def test_two_detected_platforms_require_a_choice(scenarios):
    assert scenarios["auto_two"]["installed"] == ["cpu", "fake", "twin"]
    err = scenarios["auto_two"]["error"]
    assert "several platforms detected" in err and "fake" in err and "twin" in err
    assert "DEEPINFER_ACCELERATOR" in err
    assert scenarios["explicit_twin"]["platform"] == FAKE


def test_registration_through_the_installed_plugin(fake_env):
    proc = fake_env.run(_REGISTRATION, env=clean_env())
    assert "REGISTRATION-OK" in proc.stdout


# ---- registry rules through the plugin's classes, in-process --------------------------


def _registry() -> KernelRegistry:
    reg = KernelRegistry()  # a private registry: the process-wide one stays untouched
    register_builtin_ops(reg)
    return reg


def test_plugin_impl_is_registered_and_resolved_when_preferred(monkeypatch):
    from deepinfer_fake_platform import kernels
    from deepinfer_fake_platform.platform import FakePlatform

    monkeypatch.delenv("DEEPINFER_KERNELS", raising=False)
    reg, platform = _registry(), FakePlatform()
    platform.register_kernels(reg)
    assert reg.providers("norm.rms") == ["reference", "fake"]
    assert reg.resolve("norm.rms")[0] == "reference"  # not preferred -> reference
    provider, fn = reg.resolve("norm.rms", preferred=platform.default_providers)
    assert (provider, fn) == ("fake", kernels.rms_norm)
    # The startup path: resolve_kernels lets the platform register (once), then picks.
    assert resolve_kernels(["norm.rms"], platform, registry=_registry())["norm.rms"] is kernels.rms_norm
    # The fake kernel really computes RMSNorm: the shared harness compares it to the reference.
    assert check_impl("norm.rms", "fake", "cpu", dtypes=(torch.float32, torch.bfloat16), registry=reg) > 0


def test_force_reference_overrides_the_plugin(monkeypatch):
    from deepinfer_fake_platform.platform import FakePlatform

    reg, platform = _registry(), FakePlatform()
    platform.register_kernels(reg)
    monkeypatch.setenv("DEEPINFER_KERNELS", "reference")
    provider, fn = reg.resolve("norm.rms", preferred=platform.default_providers, overrides={"norm.rms": "fake"})
    assert provider == "reference" and fn is reg.op("norm.rms").reference


def test_duplicate_registration_by_a_plugin_raises():
    from deepinfer_fake_platform import pack
    from deepinfer_fake_platform.platform import FakePlatform

    reg = _registry()
    FakePlatform().register_kernels(reg)
    with pytest.raises(ValueError, match="already has a 'fake' implementation"):
        FakePlatform().register_kernels(reg)
    pack.register(reg)
    with pytest.raises(ValueError, match="already has a 'fake_pack' implementation"):
        pack.register(reg)


def test_plugin_cannot_register_for_an_op_core_does_not_define():
    from deepinfer_fake_platform.platform import FakePlatform

    with pytest.raises(KeyError, match="unknown op 'norm.rms'"):
        FakePlatform().register_kernels(KernelRegistry())
