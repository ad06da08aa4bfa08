"""The simulated NInfer source tree: a real CMake project with NInfer's refusals (architecture,
CUDA version, FFmpeg through pkg-config), a real C++ binary that hands over to the SIMULATED
server, and a convert tool that must run as `python3 -m tools.convert` (P08)."""

CMAKELISTS = r'''cmake_minimum_required(VERSION 3.20)
project(ninfer CXX)
# SIMULATED NInfer: the same refusals and the same success lines as the real build (P05-P07).
if(NOT CMAKE_CUDA_ARCHITECTURES STREQUAL "120a")
  message(FATAL_ERROR "NInfer supports only CMAKE_CUDA_ARCHITECTURES=120a")
endif()
execute_process(COMMAND nvcc --version OUTPUT_VARIABLE NVCC_OUT RESULT_VARIABLE NVCC_RC)
string(REGEX MATCH "release ([0-9]+\\.[0-9]+), V([0-9.]+)" _m "${NVCC_OUT}")
set(CUDA_VER "${CMAKE_MATCH_1}")
if(NOT NVCC_RC EQUAL 0 OR CUDA_VER VERSION_LESS 13.1)
  message(FATAL_ERROR "NInfer requires CUDA 13.1 or newer (found '${CUDA_VER}')")
endif()
# Found lines through the modules real CMake uses: printed on the first configure and whenever
# what was found changes, not on a re-configure (tests/fixtures/cmake shows real CMake doing so).
set(CUDAToolkit_INCLUDE_DIR /usr/local/cuda/include)
set(CUDAToolkit_VERSION "${CMAKE_MATCH_2}")
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDAToolkit REQUIRED_VARS CUDAToolkit_INCLUDE_DIR VERSION_VAR CUDAToolkit_VERSION)
find_package(PkgConfig REQUIRED)
pkg_check_modules(AVFORMAT REQUIRED libavformat>=60)
pkg_check_modules(AVCODEC REQUIRED libavcodec)
pkg_check_modules(AVUTIL REQUIRED libavutil)
pkg_check_modules(SWSCALE REQUIRED libswscale)
pkg_check_modules(CURL REQUIRED libcurl)
set(CMAKE_CXX_STANDARD 20)
add_executable(ninfer-serve apps/main.cpp)
# the real build compiles its CUDA kernels for these architectures; this one writes their names where
# the simulated cuobjdump --list-elf reads them (a line `sass=sm_NNN`)
target_compile_definitions(ninfer-serve PRIVATE SIM_PYTHON="${SIM_PYTHON}" SIM_P2PKIT="${SIM_P2PKIT}"
                           NINFER_READS="v2 v3" NINFER_SASS="sm_${CMAKE_CUDA_ARCHITECTURES}")
set_target_properties(ninfer-serve PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/apps)
'''

MAIN_CPP = r'''// SIMULATED ninfer-serve: a real binary that hands over to p2pkit's simulated server.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>
#ifndef SIM_PYTHON
#define SIM_PYTHON "python3"
#endif
// where the p2pkit that laid the host out lives: its simulator is found there as the stand-ins find it,
// installed or not (a checkout run as `python3 bench/NAME.py`)
#ifndef SIM_P2PKIT
#define SIM_P2PKIT ""
#endif
#ifndef NINFER_SASS
#define NINFER_SASS "sm_120a"
#endif
// the architectures the kernels were built for, as lines the simulated cuobjdump lists
extern "C" __attribute__((used)) const char ninfer_sass[] = "\nsass=" NINFER_SASS "\n";
int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::puts("ninfer-serve (SIMULATED) reads artifact " NINFER_READS);
    return 0;
  }
  std::vector<char*> args{const_cast<char*>(SIM_PYTHON), const_cast<char*>("-m"),
                          const_cast<char*>("p2pkit.sim.engine")};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  if (SIM_P2PKIT[0] != '\0') setenv("PYTHONPATH", SIM_P2PKIT, 0);
  execv(SIM_PYTHON, args.data());
  std::perror("execv");
  return 127;
}
'''

SHARD_MAPPING = """// SIMULATED NInfer shard mapping: which tensors each TP rank gets.
const char* shard_branches[] = {"text", "vision", "mtp", "dflash2"};  // dflash2: TP2 split wiring (P09)
"""

SHARD_MAPPING_OLD = """// SIMULATED NInfer shard mapping, from before the TP2 split of the draft head.
const char* shard_branches[] = {"text", "vision", "mtp"};
"""

CONTAINER_PY = '''"""SIMULATED NInfer container writer: magic, u64 LE JSON length, JSON header, 16-byte artifact id."""
import json
import os
import struct

MAGIC_V3 = b"NINFER\\0\\x03"


def write(path, header, payload=b""):
    blob = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(MAGIC_V3 + struct.pack("<Q", len(blob)) + blob + os.urandom(16) + payload)
'''

CONVERT_PY = '''"""SIMULATED `python3 -m tools.convert`: HF safetensors in, a NInfer v3 container out."""
import argparse
import json
import os
import struct
import sys

from tools.container import write  # as a script this import fails (P08): run it as a module


def header_keys(path):
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        return [k for k in json.loads(fh.read(n)) if k != "__metadata__"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--source", action="append", default=[])
    ap.add_argument("--components", required=True)
    ap.add_argument("--proposal", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"error: {a.out} exists; refusing to overwrite")
    sources = dict(s.split("=", 1) for s in a.source)
    q = sources.get("quantized")
    if not q or not os.path.isfile(os.path.join(q, "model.safetensors.index.json")):
        sys.exit(f"error: no quantized source at {q}")
    tensors = []
    index = json.load(open(os.path.join(q, "model.safetensors.index.json")))
    for shard in sorted(set(index["weight_map"].values())):
        tensors += [{"name": k, "format": "nvfp4"} for k in header_keys(os.path.join(q, shard))]
    comps = a.components.split(",")
    if "dflash2" in comps:
        if "dflash2" not in sources:
            sys.exit("error: --components dflash2 needs --source dflash2=DIR")
        tensors += [{"name": f"dflash2.drafter.{i}", "format": "bf16"} for i in range(81)]
    header = {"format": "ninfer", "version": 3, "recipe": a.recipe, "components": comps,
              "proposal_head": a.proposal, "tensors": tensors}
    write(a.out, header, payload=b"\\0" * 4096)
    json.dump({"recipe": a.recipe, "sources": sources, "components": comps},
              open(a.out + ".conversion.json", "w"))
    print(f"wrote {a.out}: {len(tensors)} tensors (SIMULATED)")


if __name__ == "__main__":
    main()
'''

PC = """prefix={prefix}
libdir=${{prefix}}/lib
includedir=${{prefix}}/include

Name: {name}
Description: SIMULATED {name}
Version: {version}
Libs: -L${{libdir}} -l{lib}
Cflags: -I${{includedir}}
"""
