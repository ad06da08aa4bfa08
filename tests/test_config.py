"""Profiles: the built-ins load; broken ones are refused with every key path named."""

import tomllib

import pytest

from p2pkit.core import config
from p2pkit.core.errors import ProfileError

BASE = tomllib.loads(config.builtin_path("dual-5090-ninfer").read_text())


def broken(**changes) -> dict:
    import copy

    d = copy.deepcopy(BASE)
    for path, value in changes.items():
        sec, _, key = path.partition("__")
        if value is DELETE:
            if key:
                del d[sec][key]
            else:
                del d[sec]
        elif key:
            d[sec][key] = value
        else:
            d[sec] = value
    return d


DELETE = object()


@pytest.mark.parametrize("name", config.builtin_names())
def test_builtin_profiles_load_and_validate(name):
    p = config.load(name)
    assert p.name == name


def test_default_is_the_seed_000_box():
    p = config.load(None)
    assert p.name == "dual-5090-ninfer"
    assert (p.gpus.count, p.pcie.min_gen, p.pcie.min_width, p.driver.version) == (2, 5, 8, "615.71.09")


@pytest.mark.parametrize("changes,path,fragment", [
    ({"driver__version": "615"}, "driver.version", 'expected X.Y.Z, got "615"'),
    ({"gpus__count": "two"}, "gpus.count", 'expected an integer, got "two"'),
    ({"gpus__count": True}, "gpus.count", "expected an integer, got true"),
    ({"pcie__min_gen": 9}, "pcie.min_gen", "expected at most 6, got 9"),
    ({"link__p2p_min_ratio": "high"}, "link.p2p_min_ratio", "expected a number"),
    ({"host__allow_other_os": "yes"}, "host.allow_other_os", "expected true or false"),
    ({"gpus__pci_device_ids": ["2b85"]}, "gpus.pci_device_ids", "PCI device ids like 0x2b85"),
    ({"driver__installer_sha256": "abc"}, "driver.installer_sha256", "64 lowercase hex digits"),
    ({"engine__recipe": "tgi"}, "engine.recipe", "expected one of ninfer, llamacpp, vllm"),
    ({"driver__colour": "green"}, "driver.colour", "unknown key"),
    ({"drivers": {"version": "1.2.3"}}, "drivers", "unknown section"),
    ({"driver": DELETE}, "driver", "missing section"),
    ({"gpus__model": DELETE}, "gpus.model", "missing"),
    ({"p2p_module__branch": "610.57.04-p2p"}, "p2p_module.branch", "615.71.09-p2p to match driver.version"),
    ({"serve__host": "0.0.0.0"}, "serve.host", "exposes the API"),
])
def test_broken_profile_names_the_key(changes, path, fragment):
    with pytest.raises(ProfileError) as e:
        config.from_dict(broken(**changes), "broken.toml")
    msgs = dict(e.value.problems)
    assert path in msgs, e.value.problems
    assert fragment in msgs[path]


def test_every_problem_reported_at_once():
    with pytest.raises(ProfileError) as e:
        config.from_dict(broken(driver__version="6", gpus__count="x", pcie__colour=1), "b.toml")
    assert {p for p, _ in e.value.problems} >= {"driver.version", "gpus.count", "pcie.colour"}


def test_digest_changes_only_with_its_sections():
    a = config.load(None)
    b = config.from_dict(broken(driver__version="615.71.10", p2p_module__branch="615.71.10-p2p"), "b")
    assert a.digest(("driver",)) != b.digest(("driver",))
    assert a.digest(("pcie", "gpus")) == b.digest(("pcie", "gpus"))


def test_cli_validate_broken_file(cli, tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(config.builtin_path("dual-5090-ninfer").read_text().replace('version = "615.71.09"',
                                                                             'version = "615"'))
    r = cli("profile", "validate", str(f))
    assert r.code == 2
    assert 'driver.version: expected X.Y.Z, got "615"' in r.err
    r = cli("--json", "profile", "validate", str(f))
    assert r.code == 2
    doc = r.json()
    assert doc["valid"] is False and doc["problems"][0]["key"] == "driver.version"


def test_cli_validate_not_toml(cli, tmp_path):
    f = tmp_path / "p.toml"
    f.write_text("[driver\nversion = ")
    r = cli("profile", "validate", str(f))
    assert r.code == 2 and "(toml): not valid TOML" in r.err and "Traceback" not in r.err


def test_cli_unknown_profile_name(cli):
    r = cli("--profile", "no-such-box", "plan")
    assert r.code == 2 and "no profile named 'no-such-box'" in r.err and "dual-5090-ninfer" in r.err


def test_cli_profile_list_and_show(cli):
    r = cli("--json", "profile", "list")
    assert {p["name"] for p in r.json()["profiles"]} == set(config.builtin_names())
    r = cli("--json", "profile", "show", "dual-spark-vllm")
    assert r.json()["profile"]["profile"]["nodes"] == 2


def test_set_overrides_a_key_and_a_flag_and_stays_typed():
    p = config.load("dual-spark-vllm", ["serve.port=8001", "serve.flags.node-rank=1", "serve.flags.headless=true",
                                        'network.fabric_netdevs=["enp1s0f1np1"]', "serve.flags.master-addr=10.0.0.1"])
    assert p.serve.port == 8001 and isinstance(p.serve.port, int)
    assert p.serve.flags["node-rank"] == 1 and p.serve.flags["headless"] is True
    assert p.serve.flags["master-addr"] == "10.0.0.1"  # not a TOML value: taken as a string
    assert p.network.fabric_netdevs == ["enp1s0f1np1"]
    assert p.source == "dual-spark-vllm"
    # the same profile again from what a unit or hook would be given
    args = p.cli_args()
    again = config.load(args[1], [args[i + 1] for i, a in enumerate(args) if a == "--set"])
    assert again == p
    # an override is an input: the stages that read it go stale
    assert p.digest(("serve",)) != config.load("dual-spark-vllm").digest(("serve",))


@pytest.mark.parametrize("item, fragment", [
    ("serve.port=0", "serve.port: expected at least 1"),
    ("serve.prot=80", "serve.prot: unknown key"),
    ('driver.version="615"', 'driver.version: expected X.Y.Z, got "615"'),
    ("driver.version=615", "driver.version: expected X.Y.Z, got 615"),
])
def test_set_is_validated_like_the_file(item, fragment):
    with pytest.raises(ProfileError) as e:
        config.load("dual-5090-ninfer", [item])
    assert "with --set" in e.value.source
    assert fragment in "\n".join(f"{k}: {m}" for k, m in e.value.problems)


def test_cli_set_malformed_and_invalid(cli):
    r = cli("--set", "serve.port", "profile", "show")
    assert r.code == 2 and "section.key=VALUE" in r.err and "Traceback" not in r.err
    r = cli("profile", "show", "--set", "serve.port=70000")
    assert r.code == 2 and "serve.port" in r.err and "65535" in r.err
    r = cli("--json", "--set", "serve.port=8123", "profile", "show")
    assert r.code == 0 and r.json()["profile"]["serve"]["port"] == 8123
