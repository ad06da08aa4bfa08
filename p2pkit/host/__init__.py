"""Probes: the only code that reads the host. Every path goes through a host root (default /)
and every command through one runner, so a test can point p2pkit at a directory laid out like
a real host (the simulated host) and at recorded NVML facts."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from p2pkit.core.errors import MissingError, ProbeError
from p2pkit.core.runner import Runner

SIM_MARKER = ".p2pkit-sim/state.json"
HOST_ROOT_SIGNS = ("etc/os-release", "proc", "sys")  # what a host's root filesystem holds
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}  # an ELF header's e_machine (EM_X86_64, EM_AARCH64)


class NotThisMachine(ImportError):
    """A library of the host's that p2pkit cannot load here: the host is a tree at another root, not
    this machine (its NVML would answer for this machine's GPUs)."""


@dataclass
class Host:
    root: Path = Path("/")
    runner: Runner = field(default_factory=Runner)
    simulated: bool = False  # its GPUs are not real: everything it shows says SIMULATED
    # a simulated host laid out in a directory (stand-in commands, its own /sys and /proc); False for a
    # real host and for a container host (a real OS booted with systemd, only its GPUs simulated:
    # p2pkit.sim.container), where p2pkit takes a real box's path
    tree: bool = False

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.runner.root != self.root:  # commands are the host's own: looked up under its root, never here
            self.runner = dataclasses.replace(self.runner, root=self.root)

    @classmethod
    def at(cls, root: Path | str = "/") -> Host:
        root = Path(root).resolve()
        simulated = (root / SIM_MARKER).is_file()
        host = cls(root=root, runner=Runner(root=root), simulated=simulated)
        if simulated:
            host.tree = host.sim.get("layout") != "container"
            if root == Path("/") and host.tree:  # a directory host's state at / is not a host p2pkit made
                host.simulated = host.tree = False
        if host.tree:  # the commands of this machine it lends by name (the build's toolchain, systemd's verifier)
            host.runner.lent = tuple(host.sim.get("lends", ()))
        return host

    @property
    def sim(self) -> dict | None:
        """The simulated host's state, read anew each time: stand-ins change it under us."""
        if not self.simulated:
            return None
        return json.loads((self.root / SIM_MARKER).read_text())

    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def host_path(self, real: Path) -> str:
        """A path on this machine as the host sees it (the root prefix removed)."""
        real = Path(real).resolve()
        return "/" + str(real.relative_to(self.root)) if real.is_relative_to(self.root) else str(real)

    def read(self, p: str, what: str | None = None) -> str:
        try:
            return self.path(p).read_text(errors="replace")
        except FileNotFoundError:
            raise ProbeError(what or p, f"{p} does not exist") from None
        except PermissionError:
            raise ProbeError(what or p, f"{p} is not readable (permission denied; run as root)") from None
        except OSError as e:
            raise ProbeError(what or p, f"{p}: {e.strerror}") from None

    def read_bytes(self, p: str, what: str | None = None) -> bytes:
        try:
            return self.path(p).read_bytes()
        except OSError as e:
            raise ProbeError(what or p, f"{p}: {e.strerror}") from None

    def exists(self, p: str) -> bool:
        return self.path(p).exists()

    def listdir(self, p: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(p)))
        except OSError:
            return []

    def realpath(self, p: str) -> str:
        """The resolved path as the host sees it: symlinks followed inside the host root, an
        absolute target meaning the host's / (as a chroot would), never this machine's."""
        if self.root == Path("/"):
            return os.path.realpath(p)
        todo, done, hops = [x for x in p.split("/") if x], [], 0
        while todo:
            c = todo.pop(0)
            if c in (".", ""):
                continue
            if c == "..":
                done = done[:-1]
                continue
            here = self.root.joinpath(*done, c)
            if not here.is_symlink():
                done.append(c)
                continue
            hops += 1
            if hops > 40:  # a loop: say where it stopped, as the kernel says ELOOP
                break
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            todo = [x for x in target.split("/") if x] + todo
        return "/" + "/".join(done)

    def refuse_lost_standins(self) -> None:
        """A simulated host whose stand-ins' Python is gone (the venv that laid it out removed): refused once,
        naming the command that lays the host out again (core.runner.refuse_lost_interpreter). Nothing on a real
        host."""
        if self.simulated:
            from p2pkit.core.runner import refuse_lost_interpreter

            refuse_lost_interpreter(str(self.path("/usr/bin/systemctl")), self.root)

    @property
    def lent_dirs(self) -> tuple[str, ...]:
        """Directories (host paths) a simulated directory host lends from this machine as links (the tests'
        shared build cache, its state's lent_dirs): p2pkit's writes walk through them as the host's own
        layout. None on a real or a container host."""
        return tuple(str(d).rstrip("/") for d in self.sim.get("lent_dirs", ())) if self.tree else ()

    def kernel_realpath(self, p: str) -> str:
        """Where p2pkit's own writes to host path `p` land on this machine: every link followed as the kernel
        follows it (a simulated host's link to an absolute path leaves its root), except a lent directory,
        taken as in place (lent_dirs)."""
        real = os.path.realpath(self.path(p))
        for d in self.lent_dirs:
            if p == d or p.startswith(d + "/"):
                lent = os.path.realpath(self.path(d))
                if real == lent or real.startswith(lent + "/"):
                    return str(self.path(d)) + real[len(lent):]
        return real

    def library(self, name: str):
        """The host's library `name` as p2pkit calls it: "nvml" is nvidia-ml-py's pynvml module on a
        real host. A simulated host names its own stand-in for it in its state (a module with an
        `open(root)`), so the same calling code runs against it. ImportError when it is missing."""
        if not self.simulated and self.root != Path("/"):
            raise NotThisMachine(f"the host at {self.root} is not this machine: p2pkit cannot load its {name} "
                                 "library from here (run p2pkit on that host)")
        if not self.simulated:
            return importlib.import_module({"nvml": "pynvml"}[name])
        plug = self.sim.get("libraries", {}).get(name)
        if plug is None:
            raise ImportError(f"the simulated host at {self.root} provides no {name} library")
        return importlib.import_module(plug).open(self.root)

    def load_backend(self) -> dict | None:
        """Which device backend the load worker drives: None for the real GPUs (torch); a simulated
        host names its simulated devices (module and root), which the worker opens the same way."""
        if not self.simulated and self.root != Path("/"):
            raise MissingError(f"the link stage puts a load on the host's GPUs, and the host at {self.root} is not "
                               "this machine (its GPUs are not these)", hint="run p2pkit on that host itself")
        if not self.simulated:
            return None
        plug = self.sim.get("libraries", {}).get("devices")
        return {"module": plug, "root": str(self.root)} if plug else None

    def reboot_in_place(self) -> bool:
        """A simulated host reboots in place (its machine stand-in boots it again: a new boot id, the
        pending command line, kernel and module) and the run goes on: True. A real host: False, it
        reboots for real through systemd and the run resumes after boot."""
        if not self.tree:
            return False
        self.library("machine").reboot()
        return True

    def machine(self) -> str:
        """What `uname -m` prints, without starting it: the kernel's own answer (os.uname) on a real
        host; a simulated host's architecture from its state, as its uname stand-in prints it."""
        if self.tree:
            return self.sim.get("arch", "x86_64")
        if self.root == Path("/"):
            return os.uname().machine
        return self._elf_machine()

    def _elf_machine(self) -> str:
        """A host tree's architecture, from the ELF header of its own /bin/sh (this machine's kernel
        answers only for this machine): "unknown (...)" when there is none to read."""
        for p in ("/usr/bin/sh", "/bin/sh"):
            try:
                with open(self.path(self.realpath(p)), "rb") as fh:  # a link resolved inside the host
                    head = fh.read(20)
            except OSError:
                continue
            if head[:4] == b"\x7fELF" and len(head) == 20:
                code = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
                return ELF_MACHINES.get(code, f"unknown (ELF machine {code:#x} in {p})")
        return f"unknown (no ELF /bin/sh in the host at {self.root})"

    def is_host_root(self) -> bool:
        """Whether the root can be a host's: / itself, a simulated host, or a tree holding one of
        HOST_ROOT_SIGNS (a typo in --root must not read as an empty host)."""
        return self.root == Path("/") or self.simulated or any(self.path(p).exists() for p in HOST_ROOT_SIGNS)

    def default_profile(self) -> str | None:
        """The profile this host runs when none is given or recorded: a simulated host's state names
        the one laid out with it (its pins filled in); a real host has none (the built-in default applies)."""
        return self.sim.get("profile") if self.simulated else None

    def own_profile(self, name: str | None) -> str | None:
        """What the built-in profile `name` means on this host: on a simulated host laid out with that
        profile, its own pinned copy (the host's installer, fork and engine, pinned: the built-in's pins are
        empty and its sources are NVIDIA's and GitHub's, which a simulated host never reaches); None
        elsewhere, and for any other name."""
        doc = self._own_profile_doc()
        return self.sim.get("profile") if doc and name and doc.get("profile", {}).get("name") == name else None

    def own_sources(self) -> dict[str, str]:
        """The sources a simulated host offers in place of the network it never reaches: its downloads and
        repositories, as its own profile names them (driver.installer_url, p2p_module.repo and .branch,
        engine.recipe and .repo). Empty on a real host: a profile's own sources are the ones to use."""
        doc = self._own_profile_doc()
        if not doc:
            return {}
        return {f"{sec}.{key}": str(doc.get(sec, {}).get(key, "")) for sec, key in (
            ("driver", "installer_url"), ("p2p_module", "repo"), ("p2p_module", "branch"), ("engine", "recipe"),
            ("engine", "repo"))}

    def _own_profile_doc(self) -> dict | None:
        import tomllib

        if not self.simulated:
            return None
        path = Path(self.sim.get("profile") or "")
        if path.is_file():  # its sources and pins are used as the host's own: never one another user could write
            from p2pkit.core import safefs

            safefs.check_trusted(path, f"the simulated host's profile {path}", "or lay the host out again")
        try:
            return tomllib.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def reboots_for_real(self) -> bool:
        """Whether a reboot takes this machine down (a real host: p2pkit asks for --yes and the resume
        unit carries on after boot) or happens in place (a simulated host: `up --reboot` goes on)."""
        return not self.tree

    def reboot_command(self) -> str | None:
        """The command that reboots this host, for a message to print: `p2pkit sim reboot ROOT` on a
        simulated host; None on a real one (its operator reboots it the way they do)."""
        return f"p2pkit sim reboot {self.root}" if self.tree else None

    def engine_left_serving(self) -> str | None:
        """What `up` says after a service stage on a host whose engine is a process of this machine, left serving
        on purpose (a simulated host's: it listens on loopback for real), with the command that stops it; None on
        a real host, where the engine is the service it is meant to be."""
        if not self.tree:
            return None
        return ("the simulated engine keeps serving on loopback, as a real service would: `p2pkit serve status` "
                f"shows it, `p2pkit sim stop {shlex.quote(str(self.root))}` stops it")

    def banner(self) -> str | None:
        """What `up` says first about the host when it is not an ordinary one: a simulated host's scenario."""
        if not self.simulated:
            return None
        if not self.tree:
            return (f"this host's operating system is real (a container host: systemd, dpkg, kbuild); its GPUs are "
                    f"simulated (scenario {self.sim.get('scenario')}): nothing GPU-facing is real")
        return (f"host root {self.root} is a simulated host (scenario {self.sim.get('scenario')}): nothing real "
                "is changed or measured")

    def wrote(self, doc: dict, machine_id: str | None) -> bool:
        """Whether an artifact was written on this host: the same machine id, and simulated exactly when
        this host is (a simulated host's artifact never passes for a real one's, nor the reverse)."""
        return doc.get("simulated") == self.simulated and doc.get("host", {}).get("machine_id") == machine_id

    def offers_simulator(self) -> bool:
        """Whether pointing the user at p2pkit's simulated host can help here: not on one already."""
        return not self.simulated

    def sim_fact(self, key: str, default=None):
        return (self.sim or {}).get("facts", {}).get(key, default)
