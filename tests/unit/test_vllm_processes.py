"""The vLLM processes the plugin refuses at its registration (:mod:`juice.vllm.processes`; issue
88): a release it was not verified on, and frontends whose requests skip its checks. vLLM itself
runs these refusals in tests/slow/test_vllm_ways_in.py."""

from __future__ import annotations

import re

import pytest

from juice.vllm.processes import PluginConfigError


def test_a_vllm_release_the_plugin_was_not_verified_on_is_refused_unless_the_variable_allows_it():
    """Issue 88, "vLLM versions": 0.32.x passes; another release is refused in one line saying what
    to install; JUICE_VLLM_ALLOW_UNVERIFIED=1 turns the refusal into a warning."""
    from juice.vllm.processes import ENV_UNVERIFIED, check_process, version_refusal

    for version in ("0.32.0", "0.32.3", "0.32.0+cpu"):
        assert version_refusal(version, {}) == (None, None)
    for version in ("0.33.0", "0.31.2", "1.0.0"):
        refusal, warning = version_refusal(version, {})
        assert warning is None and f"not {version}" in refusal and "vllm==0.32.0" in refusal
        with pytest.raises(PluginConfigError, match=f"verified on vLLM 0.32, not {re.escape(version)}"):
            check_process(["python"], version, {})
        warned = check_process(["python"], version, {ENV_UNVERIFIED: "1"})
        assert warned is not None and "starting anyway" in warned


@pytest.mark.parametrize("argv, environ, match", [
    (["/x/bin/vllm", "run-batch", "-i", "a", "-o", "b"], {}, "does not steer vllm run-batch"),
    (["/v/vllm/entrypoints/openai/run_batch.py", "-i", "a"], {}, "does not steer vllm run-batch"),
    (["/v/vllm/entrypoints/launchers/run_batch.py", "-i", "a"], {}, "does not steer vllm run-batch"),
    (["/x/bin/vllm", "serve", "m", "--grpc"], {}, "gRPC server"),
    (["/v/vllm/entrypoints/launchers/grpc_server.py", "--model", "m"], {}, "gRPC server"),
    (["/x/bin/vllm", "serve", "m"], {"VLLM_USE_RUST_FRONTEND": "1"}, "Rust frontend"),
])
def test_frontends_that_skip_the_request_checks_are_refused_at_start(argv, environ, match):
    """Issue 88, items 3 and 6: `vllm run-batch` and the gRPC and Rust frontends build no HTTP app,
    so a body's juice field would be dropped unchecked: the plugin refuses to start in them. Its
    own batch runner (juice.vllm.batch), vLLM's OpenAI server and juice's offline worker pass."""
    from juice.vllm.processes import check_process, frontend_refusal

    with pytest.raises(PluginConfigError, match=match):
        check_process(argv, "0.32.0", environ)
    for fine in (["/v/juice/vllm/batch.py", "-i", "a"], ["/v/vllm/entrypoints/openai/api_server.py", "--grpc-port", "1"],
                 ["/v/juice/vllm/offline.py"], ["/x/bin/vllm", "serve", "m"]):
        assert frontend_refusal(fine, {"VLLM_USE_RUST_FRONTEND": "0"}) is None, fine
    rust = {"VLLM_USE_RUST_FRONTEND": "1"}   # read by `vllm serve` only: not by the processes below
    for fine in (["/v/vllm/entrypoints/openai/api_server.py", "--model", "m"], ["/v/juice/vllm/batch.py", "-i", "a"],
                 ["/v/juice/vllm/offline.py"], ["/x/bin/vllm", "serve", "m", "--headless"]):
        assert frontend_refusal(fine, rust) is None, fine


def test_grpc_set_in_a_config_file_is_refused_as_the_flag_is(tmp_path):
    """Review of issue 88: `vllm serve --config x.yaml` with `grpc: true` expands into `--grpc`
    after the plugin reads `sys.argv`; the YAML is read too."""
    from juice.vllm.processes import frontend_refusal

    on, off = tmp_path / "on.yaml", tmp_path / "off.yaml"
    on.write_text("grpc: true\nmodel: m\n")
    off.write_text("grpc: false\n")
    assert "gRPC server" in frontend_refusal(["/x/bin/vllm", "serve", "--config", str(on)], {})
    assert "gRPC server" in frontend_refusal(["/x/bin/vllm", "serve", f"--config={on}"], {})
    for argv in (["/x/bin/vllm", "serve", "--config", str(off)], ["/x/bin/vllm", "serve", "--config",
                                                                   str(tmp_path / "missing.yaml")]):
        assert frontend_refusal(argv, {}) is None
