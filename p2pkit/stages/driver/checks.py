"""driver: the pinned userspace driver is installed, with its GSP firmware, and guarded (P01, P02)."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.core.role_defaults import role_default
from p2pkit.rules.findings import FAIL, PASS, Check, changed, failed, figure, judge, reading, reads, unknown
from p2pkit.rules.hints import RESTORE_FIX

PINNED = "615.71.09"
P01 = ("driver 595's GSP firmware cannot build the BAR1 P2P mailbox, and the P2P patch is tested on "
       f"{PINNED}: set driver.version = \"{PINNED}\" (and p2p_module.branch = \"{PINNED}-p2p\"), or set "
       "driver.allow_other_version = true if you have proven another version")


def precheck(p: Profile) -> list[Check]:
    """Refusals before anything is downloaded or run."""
    v = p.driver.version
    pin_ok = v == PINNED or p.driver.allow_other_version
    out = [judge("driver.pin", "driver version is the proven pin", pin_ok, v, PINNED, P01, pitfall="P01")]
    if v.startswith("595.") and p.driver.allow_other_version:
        out[0] = Check("driver.pin", "driver version is the proven pin", "warn", v, PINNED,
                       "allowed by driver.allow_other_version, but " + P01, "P01")
    out.append(judge("driver.installer_sha256", "installer checksum pinned", len(p.driver.installer_sha256) == 64,
                     p.driver.installer_sha256 or "(empty)", "64 hex digits",
                     "`sudo p2pkit up --pin` pins the installer at driver.installer_url after NVIDIA's own check "
                     "(or `p2pkit pin --installer FILE|URL --out PROFILE.toml --yes` for a file you downloaded); "
                     "p2pkit never runs an unpinned installer"))
    return out


def installer_arch(machine: str, p: Profile) -> Check:
    """The profile's installer is NVIDIA's build for this host's architecture."""
    from p2pkit.host.arch import ARCHES

    name = p.driver.installer_url.rsplit("/", 1)[-1]
    want = ARCHES[machine].installer(p.driver.version) if machine in ARCHES else f"an installer for {machine}"
    return judge("driver.installer_arch", "the installer is built for this host's architecture", name == want,
                 f"{name} on {machine}", want,
                 f"this host is {machine}: point driver.installer_url at {want} (and its sha256), or use the "
                 "profile made for this machine (dual-spark-vllm is aarch64, the 5090 profiles x86_64)")


@reads("arch", "userspace_driver", "driver_guards", "package_holds")
def check(f: dict, p: Profile) -> list[Check]:
    out = precheck(p)
    m = f.get("arch")
    if isinstance(m, str):
        out.append(installer_arch(m, p))
    elif m is not None:
        out.append(unknown("driver.installer_arch", "the installer is built for this host's architecture", m,
                           "the host's architecture"))
    u = f.get("userspace_driver")
    want = p.driver.version
    if failed(u):
        out.append(unknown("driver.userspace_version", "installed userspace driver", u, want))
        return out
    versions = u["versions"]
    out.append(judge("driver.userspace_version", "installed userspace driver", versions == [want],
                     ", ".join(versions), want,
                     "another userspace driver is installed beside or instead of the pin: uninstall it "
                     "(`nvidia-uninstall`, or `apt-get purge` the nvidia packages) and run `p2pkit up --from driver`",
                     pitfall="P02"))
    gsp = u.get("gsp_firmware", {}).get(want, [])
    out.append(judge("driver.gsp_firmware", f"GSP firmware for {want}", bool(gsp),
                     ", ".join(gsp) or f"none in /lib/firmware/nvidia/{want}/",
                     f"gsp_*.bin in /lib/firmware/nvidia/{want}/",
                     "the open modules fail to load (error -2) without the GSP firmware of exactly this version: "
                     "rerun the installer (`p2pkit up --from driver --force`); check it was not run with "
                     "--no-kernel-modules in a version that skips firmware"))
    g = f.get("driver_guards", {})
    if failed(g):
        out.append(unknown("driver.guards", "apt and unattended-upgrades guards", g, "all in place", pitfall="P02"))
    else:
        missing = [k for k, v in g.items() if not v]
        out.append(Check("driver.guards", "apt and unattended-upgrades guards", FAIL if missing else PASS,
                         ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in g.items()), "all in place",
                         RESTORE_FIX if missing else "", "P02"))
    if "package_holds" in f:  # absent from facts recorded by older versions
        out.append(holds(f["package_holds"]))
    return out


def guarded_packages() -> tuple[str, ...]:
    """The package name prefixes the driver role holds, stated once in its defaults/main.yml
    (p2pkit_driver_guarded_packages); read when first needed, never at import."""
    return tuple(role_default("p2pkit_driver", "p2pkit_driver_guarded_packages"))


def __getattr__(name: str):
    if name == "GUARDED_PACKAGES":  # the name it had as a constant, read lazily from the role's defaults
        return guarded_packages()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def holds(h: dict) -> Check:
    """P02: every installed NVIDIA package is held (`apt-mark hold`), so apt cannot replace it."""
    if failed(h):
        return unknown("driver.holds", "installed NVIDIA packages held", h, "every one held", pitfall="P02")
    guarded = [n for n in h["installed"] if n.startswith(guarded_packages())]
    unheld = [n for n in guarded if n not in h["held"]]
    return figure("driver.holds", "installed NVIDIA packages held", len(unheld), "==", 0, "count", RESTORE_FIX,
                  "P02", text=f"{{}} of {len(guarded)} without an apt hold", context=", ".join(unheld),
                  expected_context="(every one held)")


DRIVER_FILES_REDO = ("run `p2pkit up --from driver`: p2pkit compares each installed file with the sha256 it "
                     "recorded at the install and runs the installer again where one differs")


@reads("driver_files")
def files_recorded(f: dict, p: Profile) -> list[Check]:
    """The installer's files of the pinned version, as the proof found them (their identities go into the artifact:
    the gate's re-proof compares them; issue 48 item 3)."""
    files = f.get("driver_files")
    if "driver_files" not in f:
        return []
    if failed(files) or not isinstance(files, dict):
        return [unknown("driver.files", "the installer's files are recorded", files, "each file there")]
    return [reading("driver.files", "the installer's files are recorded", PASS if files else FAIL,
                    len(files) or None, "count", f"the libraries, firmware and programs of {p.driver.version}",
                    DRIVER_FILES_REDO, text="{} files", missing="none found")]


def reproved(recorded: dict, now: dict | None, p: Profile) -> list[Check]:
    """What the driver artifact recorded of the installer's files (firmware, nvidia-smi, the libraries), against
    them now: each is still the same file (identity: an edit keeps no change time, whatever mtime says)."""
    id_, title = "driver.files_unchanged", "the installer's files are the ones the stage proved"
    want = "each file the stage proved, unchanged"
    rec = recorded.get("driver_files")
    if not isinstance(rec, dict):
        return []  # an artifact of an earlier p2pkit: its checks on fresh facts judge it
    if failed(now) or not isinstance(now, dict):
        return [unknown(id_, title, now, want)]
    bad = []
    for path, was in sorted(rec.items()):
        got = (now.get(path) or {}).get("identity")
        if not isinstance(was, dict) or not isinstance(was.get("identity"), dict):
            continue
        if got is None:
            bad.append(f"{path} is not there any more")
        elif moved := changed(was["identity"], got):
            bad.append(f"{path} changed since the stage proved it ({'; '.join(moved)})")
    if bad:
        return [Check(id_, title, FAIL, "; ".join(bad[:3]) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""),
                      want, DRIVER_FILES_REDO)]
    return [Check(id_, title, PASS, "unchanged since the stage proved them", want)]
