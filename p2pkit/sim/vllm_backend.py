"""SIMULATED vLLM build backend, copied into the simulated PR-branch tree as sim_backend.py (PEP 517, in the
tree: pip builds it with --no-build-isolation, needing no wheel of its own); a wheel in pip's own layout, its
version as vLLM's setuptools-scm gives a tree of the PR branch (the commit's short id after +g)."""
# SIMULATED vLLM build backend (p2pkit's simulated host): builds the tree's vllm package as a wheel
import base64
import hashlib
import os
import subprocess
import zipfile

TAG = "py3-none-any"


def _version():
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return f"0.11.1.dev53896+g{head[:7] or 'unknown'}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    info = f"vllm-{version}.dist-info"
    name = f"vllm-{version}-{TAG}.whl"
    here = os.path.dirname(os.path.abspath(__file__))
    files = {}
    for top, _dirs, names in os.walk(os.path.join(here, "vllm")):
        for n in names:
            if n.endswith(".pyc"):
                continue
            full = os.path.join(top, n)
            with open(full, "rb") as fh:
                files[os.path.relpath(full, here)] = fh.read()
    files["vllm/__init__.py"] = files["vllm/__init__.py"].replace(b"@VERSION@", version.encode())
    files[info + "/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()
    files[info + "/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: p2pkit-sim\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(info + "/RECORD,,")
    files[info + "/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in sorted(files.items()):
            z.writestr(path, data)
    return name
