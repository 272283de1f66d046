"""Architecture adapters: head geometry from the config, clear errors, registration."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from juice.architectures import (
    ArchitectureAdapter,
    ModelHeads,
    UnsupportedArchitectureError,
    adapter_for,
    config_geometry,
    register_architecture,
    supported_model_types,
)


def test_geometry_uses_query_heads_and_config_head_dim(tiny):
    g = tiny.heads.geometry
    config = tiny.model.config.get_text_config()
    n_heads = getattr(config, "num_attention_heads", None) or config.n_head
    assert g.n_heads == n_heads  # query heads, never KV heads
    assert g.n_layers == 3
    assert g.n_heads * g.head_dim == tiny.heads.projection_in_features(tiny.heads.projections[0])


def test_the_config_alone_gives_the_built_models_geometry(tiny):
    assert config_geometry(tiny.model.config) == tiny.heads.geometry


def test_gemma_head_dim_differs_from_hidden_size(tiny_models):
    from conftest import build_tiny

    lm = build_tiny("gemma3_text")
    assert lm.heads.geometry.head_dim == 16
    assert lm.heads.geometry.n_heads * 16 != lm.model.config.hidden_size


def test_unknown_architecture_names_the_supported_ones():
    with pytest.raises(UnsupportedArchitectureError, match="llama") as err:
        adapter_for("my_new_model")
    assert "register_architecture" in str(err.value)


def test_registering_a_new_architecture(monkeypatch):
    import juice.architectures as arch

    monkeypatch.setattr(arch, "_REGISTRY", dict(arch._REGISTRY))
    config = AutoConfig.for_model("llama", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, vocab_size=50)
    model = AutoModelForCausalLM.from_config(config)
    model.config.model_type = "my_llama_variant"
    with pytest.raises(UnsupportedArchitectureError):
        ModelHeads(model)
    register_architecture(ArchitectureAdapter(("my_llama_variant",)))
    assert "my_llama_variant" in supported_model_types()
    assert ModelHeads(model).geometry.n_heads == 2
    with pytest.raises(ValueError, match="already has an adapter"):
        register_architecture(ArchitectureAdapter(("my_llama_variant",)))


def test_the_vllm_plugin_steers_what_the_one_architecture_table_names(monkeypatch):
    """Issue 91: one table (the adapters' `vllm`) names each architecture's adapter and its vLLM
    steered class; the plugin's list (:func:`juice.vllm.steered_architectures`) is read from it,
    so an adapter registered with a vLLM class is steered there too."""
    import juice.architectures as arch
    from juice.vllm import steered_architectures

    assert steered_architectures() == {c: f"Juice{c}" for c in (
        "Gemma3ForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
        "Phi3ForCausalLM", "Gemma2ForCausalLM")}
    assert arch.vllm_architectures()["Gemma3ForCausalLM"] == "gemma3"
    monkeypatch.setattr(arch, "_REGISTRY", dict(arch._REGISTRY))
    register_architecture(ArchitectureAdapter(("my_llama_variant",),
                                              vllm=(("my_llama_variant", "llama", "MyLlamaForCausalLM"),)))
    assert steered_architectures()["MyLlamaForCausalLM"] == "JuiceMyLlamaForCausalLM"
    with pytest.raises(ValueError, match="'other', which this adapter does not serve"):
        ArchitectureAdapter(("mine",), vllm=(("other", "llama", "LlamaForCausalLM"),))
    register_architecture(ArchitectureAdapter(("qwen2",)), overwrite=True)   # qwen2 now has no vLLM class
    assert "Qwen2ForCausalLM" not in steered_architectures() and "LlamaForCausalLM" in steered_architectures()
