"""The plugin's switch and registration, in-process (fast; needs vllm, no engine)."""

from __future__ import annotations

import pytest

from witcert_vllm_helpers import NEEDS_VLLM

pytestmark = [pytest.mark.vllm, NEEDS_VLLM]


@pytest.fixture
def clean_registry(monkeypatch):
    from vllm.v1.attention.backends.registry import _ATTN_OVERRIDES

    saved = dict(_ATTN_OVERRIDES)
    for k in [k for k in list(__import__("os").environ) if k.startswith("WITCERT_VLLM")]:
        monkeypatch.delenv(k)
    yield _ATTN_OVERRIDES
    _ATTN_OVERRIDES.clear()
    _ATTN_OVERRIDES.update(saved)


def test_plugin_off_registers_nothing(clean_registry):
    from witcert.integrations.vllm import register

    before = dict(clean_registry)
    register()
    assert clean_registry == before


def test_plugin_on_overrides_cpu_attention_and_guards_mla(clean_registry, monkeypatch, tmp_path):
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from witcert.integrations.vllm import register

    monkeypatch.setenv("WITCERT_VLLM", "on")
    monkeypatch.setenv("WITCERT_VLLM_STATS_DIR", str(tmp_path))
    register()
    cls = AttentionBackendEnum.CPU_ATTN.get_class()
    assert cls.__name__ == "WitcertCPUAttentionBackend" and issubclass(cls, CPUAttentionBackend)
    with pytest.raises(ValueError, match="witcert: multi-head latent attention"):
        AttentionBackendEnum.CPU_MLA.get_class().get_impl_cls()


def test_bad_preset_is_refused_by_name(clean_registry, monkeypatch):
    from witcert.integrations.vllm import register

    monkeypatch.setenv("WITCERT_VLLM", "no-such-preset")
    with pytest.raises(ValueError, match="WITCERT_VLLM"):
        register()
    monkeypatch.setenv("WITCERT_VLLM", "bypass8")  # needs calibration the plugin does not run
    with pytest.raises(ValueError, match="outlier"):
        register()


def test_native_path_is_built_at_start_up_and_on_fails_loudly_without_gcc(clean_registry,
                                                                          monkeypatch, tmp_path):
    """``WITCERT_VLLM_NATIVE``: the runtime builds the C path when it starts; ``on`` without a
    compiler stops start-up with a ``witcert:`` error, ``auto`` falls back, ``off`` skips."""
    from types import SimpleNamespace

    from witcert import native
    from witcert.integrations.vllm import settings
    from witcert.integrations.vllm.backend import _Runtime

    monkeypatch.setenv("WITCERT_VLLM", "on")
    monkeypatch.setenv("WITCERT_VLLM_STATS_DIR", str(tmp_path))

    def ready(mode: str) -> bool:
        monkeypatch.setenv("WITCERT_VLLM_NATIVE", mode)
        rt = SimpleNamespace(settings=settings.load(), head_dim=64, num_q_heads=9, num_kv_heads=3)
        return _Runtime._native_ready(rt)

    assert ready("off") is False
    if native.available():
        assert ready("auto") is True and ready("on") is True
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setattr(native, "_WARNED", set())
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "native"))
    assert ready("auto") is False
    with pytest.raises(ValueError, match="witcert: WITCERT_VLLM_NATIVE=on .*gcc not found"):
        ready("on")


def test_stats_dir_made_by_the_plugin_is_removed_at_exit_a_given_one_is_kept(tmp_path):
    """register() creates the shared stats directory when none is set and the creating
    process removes it when it exits; a directory named by the user stays."""
    import os
    import subprocess
    import sys

    code = ("import os; from witcert.integrations.vllm import register; register(); "
            "d = os.environ['WITCERT_VLLM_STATS_DIR']; assert os.path.isdir(d); print(d)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WITCERT_VLLM")}
    env.update(WITCERT_VLLM="on", WITCERT_VLLM_NATIVE="off")
    made = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    path = made.stdout.strip().splitlines()[-1]
    assert "witcert-vllm-" in path and not os.path.exists(path)
    given = tmp_path / "stats"
    given.mkdir()
    env["WITCERT_VLLM_STATS_DIR"] = str(given)
    kept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert given.is_dir()
