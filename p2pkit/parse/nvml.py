"""NVML's answers in the words `nvidia-smi -q` prints for them (pure: values in, facts out)."""

from __future__ import annotations

# nvmlEnableState_t (nvml.h): NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1; `nvidia-smi -q` prints
# "Persistence Mode : Enabled" for 1 (tests/fixtures/h200-vm: smi_q.txt and nvml.txt, the same GPU)
ENABLE_STATE = {0: "Disabled", 1: "Enabled"}


def persistence_modes(by_gpu: dict) -> dict:
    """nvmlDeviceGetPersistenceMode per GPU (by PCI bus id) -> "Enabled" / "Disabled"; a GPU NVML could not
    answer for keeps its {"error": ...}, and an answer that is no known state becomes one."""
    return {bus: v if isinstance(v, dict) else ENABLE_STATE.get(v, {"error": f"NVML answered {v}, not a known state"})
            for bus, v in by_gpu.items()}
