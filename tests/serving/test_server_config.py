"""ServerConfig defaults and the exact message of each bad field."""

from __future__ import annotations

import pytest

from spanrl.errors import ConfigError
from spanrl.serving import PolicyServer, ServerConfig, default_config


def test_default_config_validates_with_a_model() -> None:
    config = default_config()
    assert config is not default_config()
    config.model = "some/folder"
    assert config.validate() is config
    assert config.model_name == "folder"
    assert ServerConfig(model="x/SmolLM2.Q4.gguf").model_name == "SmolLM2.Q4"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model", "", "model must be a model folder, a .gguf file or 'smollm2', got ''"),
        ("backend", "onnx", "backend must be one of transformers, vllm; got 'onnx'"),
        ("dtype", "int8", "dtype must be one of float32, bfloat16, float16, auto; got 'int8'"),
        ("port", 70000, "port must be an integer in 0..65535, got 70000"),
        ("max_batch_size", 0, "max_batch_size must be a positive integer, got 0"),
        ("max_batch_delay_ms", -1.0, "max_batch_delay_ms must be >= 0, got -1.0"),
        ("max_context_tokens", 1, "max_context_tokens must be >= 2 or None, got 1"),
        ("gpu_memory_utilization", 1.5, "gpu_memory_utilization must be in (0, 1], got 1.5"),
        ("enable_prefix_caching", "yes", "enable_prefix_caching must be true or false, got 'yes'"),
        ("prefix_cache_bytes", 0, "prefix_cache_bytes must be a positive integer, got 0"),
    ],
)
def test_bad_field_fails_with_its_message(field, value, message) -> None:
    config = ServerConfig(model="m")
    setattr(config, field, value)
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert str(info.value) == message


def test_missing_model_folder_is_a_clear_error(tmp_path) -> None:
    from spanrl.errors import ServingError

    with pytest.raises(ServingError, match="is not a Hugging Face model folder"):
        PolicyServer(ServerConfig(model=tmp_path, port=0, otlp_endpoint=None)).start()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "vllm", "max_loras": 0}, "max_loras must be an integer >= max(1, the 0 lora_modules), got 0"),
        ({"backend": "vllm", "max_lora_rank": 4},
         "max_lora_rank must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (vLLM's ranks), got 4"),
        ({"max_loras": 2}, "max_loras, max_lora_rank size vLLM's LoRA slots; backend 'transformers' adds adapters "
                           "without them (leave them unset)"),
    ],
)
def test_lora_slots_are_checked(fields, message) -> None:
    with pytest.raises(ConfigError) as info:
        ServerConfig(model="m", **fields).validate()
    assert str(info.value) == message
    assert ServerConfig(model="m", backend="vllm", max_loras=3, max_lora_rank=8).validate()


def test_sleep_mode_needs_the_vllm_backend() -> None:
    from spanrl.rollouts.policy_pool import ServingConfig

    with pytest.raises(ConfigError) as info:
        ServerConfig(model="m", enable_sleep_mode=True).validate()
    assert str(info.value) == "enable_sleep_mode is vLLM's sleep mode: true needs backend 'vllm', got True with " \
                              "backend 'transformers'"
    with pytest.raises(ConfigError, match="serving.enable_sleep_mode .* needs serving.backend 'vllm'"):
        ServingConfig.of({"enable_sleep_mode": True})
    assert ServingConfig.of({"enable_sleep_mode": True, "backend": "vllm"}).enable_sleep_mode
