"""What the seeds' authors hit and what owners of such boxes report (P28-P39: docs/field-pitfalls.md), by id;
checks name the id that applies. docs/pitfalls.md is this table written out (`python3 -m p2pkit.rules.pitfalls`;
tests/test_pitfalls_doc.py holds them equal)."""

PITFALLS = {
    "P01": "driver 595's GSP firmware cannot build the BAR1 P2P mailbox: pin 615.71.09",
    "P02": "Ubuntu updates replaced the pinned driver or module: hold, blacklist, restore timer",
    "P03": "idle PCIe shows Gen1 (ASPM): judge link speed only under load",
    "P04": "nvidia-smi -lgc locks clocks, does not fill the link, skews benchmarks: reset with -rgc / -rac",
    "P05": "CMAKE_CUDA_ARCHITECTURES must be 120a",
    "P06": "libavformat not found: PKG_CONFIG_PATH must reach the FFmpeg deps",
    "P07": "build success: CUDAToolkit 13.1 found, libavformat found, no CMake Error, links ninfer-serve",
    "P08": "run the convert tool as `python3 -m` from the source root",
    "P09": "a DFlash2 artifact needs an engine recent enough for TP2 DFlash2",
    "P10": "--spec dflash2 at TP2 needs --lm-head-draft",
    "P11": "KV dtype decides the pool size: use --kv-capacity auto",
    "P12": "a server started in a memory-capped cgroup gets OOM-killed: system service, no memory cap",
    "P13": "benchmarks must fix prompt and output lengths",
    "P14": "compare wall throughput, not acceptance rates across speculative methods",
    "P15": "client-side SSE timing is off: read tok/s from the server's log",
    "P16": "system libnccl 2.18.3 hangs on SM120: link the profile's NCCL (RUNPATH, ldd)",
    "P17": "built with NCCL is not NCCL fast: P2P must be OK both ways",
    "P18": "MTP draft layers cost VRAM: fit context and KV with headroom",
    "P19": "prove MTP runs: startup line, spec_decode counters, acceptance lines",
    "P20": "MTP only pays at one concurrent slot",
    "P21": "sm_121 (GB10) needs a patch and a pinned vLLM branch",
    "P22": "CUDA graphs with MTP at TP2 lose 28% decode on GB10: --enforce-eager",
    "P23": "Docker silently drops NCCL to TCP sockets: run natively, prove NET/IB",
    "P24": "RoCE device names change across reboots: resolve HCAs from sysfs at each start",
    "P25": "flashinfer 0.6.17 crashes NVFP4 MoE on GB10: pin 0.6.18",
    "P26": "mmap of the n-gram table needs MADV_RANDOM on local NVMe",
    "P27": "the worker node starts about 30 s after the head",
    "P28": "topo says OK yet NCCL hangs: the driver must use the static full-VRAM BAR1 mapping (RMForceStaticBar1=1)",
    "P29": "ACS request/completion redirect on the bridges sends P2P through the root complex",
    "P30": "NCCL's default P2P level stops at PXB (except AMD with two GPUs): set NCCL_P2P_LEVEL or it takes SHM",
    "P31": "BAR1 boots at 256 MiB and the resize fails: Above 4G decoding and Resizable BAR in the BIOS",
    "P32": "a translating IOMMU makes P2P copies return zeros or NaN with no error",
    "P33": "a display on one GPU turns its static BAR1 off: P2P fails for pairs with it",
    "P34": "the patched module never loads: updates/dkms, the initramfs or a busy nvidia_drm keep the stock one",
    "P35": "after a hung collective the GPUs stay wedged (busy, no process; WPR2 already up): reboot",
    "P36": "a new kernel breaks the module build: keep the working kernel as the boot default",
    "P37": "NCCL before 2.29.3 leaks proxy slots on aarch64: check the NCCL the engine has mapped",
    "P38": "the RoCE GID index differs per node and drifts; the MTU falls back to 1500",
    "P39": "CUDA 13 builds can drop sm_121: check the built architectures (cuobjdump --list-elf)",
}


# Where each pitfall is checked, and when: doctor says this as the "n/a" reason when no finding names the
# pitfall on a profile (its check does not apply there, or it is judged only from a stage's own run).
# None: no stage checks it (a benchmark's rule, judged by `p2pkit bench` on its own run, or no check).
CHECKED_BY: dict[str, tuple[str | None, str]] = {
    "P01": ("driver", "the driver stage's GSP firmware check"),
    "P02": ("p2p-module", "the driver's holds and, once the patched module is built, the p2p-module stage's "
                          "restore safeguards and pending-kernel checks"),
    "P03": ("link", "the link stage's load test (`p2pkit verify link`): doctor puts no load on the GPUs"),
    "P04": ("link", "the link stage's clock check, from NVML"),
    "P05": ("engine", "the engine stage's CUDA architecture and CMake checks, from its build (doctor builds nothing)"),
    "P06": ("engine", "the engine stage's pkg-config check (NInfer's FFmpeg), from its build (doctor builds nothing)"),
    "P07": ("engine", "the engine stage's build criteria (NInfer), from its build (doctor builds nothing)"),
    "P08": ("model", "the model stage's conversion, from its run (doctor converts nothing)"),
    "P09": ("engine", "the engine and model stages, only for a DFlash2 artifact (model.components has dflash2)"),
    "P10": ("service", "the service precheck, only for NInfer with --spec dflash2 at TP2"),
    "P11": ("service", "the service precheck of NInfer's KV dtype, and the started engine's own fit"),
    "P12": ("service", "preflight's and the service's memory-cap checks"),
    "P13": (None, "a benchmark's rule: `p2pkit bench` fixes the prompt and output lengths of its own run and "
                  "checks the server ran them; no host fact shows it"),
    "P14": (None, "no check: a rule for reading benchmark results; `p2pkit bench` reports wall throughput beside "
                  "acceptance and judges neither"),
    "P15": (None, "a benchmark's rule: `p2pkit bench` reads tok/s from the server's own accounting; no host fact "
                  "shows it"),
    "P16": ("engine", "the engine and service stages, for llama.cpp with engine.nccl_root and engine.nccl_min"),
    "P17": ("link", "the link stage's P2P load test and the service's NCCL environment, for a GPU pair"),
    "P18": ("service", "the service stage's VRAM fit"),
    "P19": ("service", "the service stage's first completion and speculative counters, from its run (doctor does "
                       "not wait on the service), when the profile runs a draft"),
    "P20": ("service", "the service stage's speculative slots check"),
    "P21": ("engine", "the engine stage, for vLLM on sm_121 (GB10), from its build"),
    "P22": ("service", "the service precheck, for vLLM with MTP at TP2"),
    "P23": ("service", "the service stage's NCCL transport lines, from its run, for an engine over RoCE"),
    "P24": ("topology", "the topology and link stages, when the profile requires RoCE"),
    "P25": ("engine", "the engine stage, for vLLM with flashinfer, from its build"),
    "P26": ("model", "the model stage's NVMe check, when the profile names NVMe paths"),
    "P27": ("service", "the service stage, on a worker node of a multi-node engine"),
    "P28": ("p2p-module", "the p2p-module stage, for a GPU pair with the patched module and its RegistryDwords"),
    "P29": ("topology", "the topology stage, for a GPU pair"),
    "P30": ("service", "the service stage, for a GPU pair"),
    "P31": ("rebar", "the rebar stage (BAR1, bridge windows, kernel log)"),
    "P32": ("topology", "the topology stage and the link stage's integrity pattern, for a GPU pair"),
    "P33": ("topology", "the topology stage, for a GPU pair"),
    "P34": ("p2p-module", "the p2p-module stage, for a GPU pair with the patched module"),
    "P35": ("link", "the link stage, from NVML and the kernel log"),
    "P36": ("p2p-module", "the p2p-module stage, from the kernel hook's boot-default hold"),
    "P37": ("service", "the service stage, when the profile sets engine.nccl_min (the NCCL the engine mapped)"),
    "P38": ("link", "the link stage, when the profile requires RoCE"),
    "P39": ("engine", "the engine stage, from the built engine's kernels (cuobjdump)"),
}


def markdown() -> str:
    """docs/pitfalls.md: every pitfall with what it is and the stage that checks it."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [f"| {pid} | {cell(text)} | {CHECKED_BY[pid][0] or '(bench)'} | {cell(CHECKED_BY[pid][1])} |"
            for pid, text in PITFALLS.items()]
    return ("# The pitfalls p2pkit checks\n\n"
            "<!-- Written by `python3 -m p2pkit.rules.pitfalls > docs/pitfalls.md` from p2pkit/rules/pitfalls.py: "
            "do not edit by hand. -->\n\n"
            "`p2pkit doctor` names these ids beside its findings and ends with every id's status; a finding's fix "
            "says what to do. P28-P39 come from public trackers, each with its sources: docs/field-pitfalls.md.\n\n"
            "| id | what it is | stage | checked by |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    print(markdown(), end="")
