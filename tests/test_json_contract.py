"""The --json contract: every document carries kind and schema and validates against the JSON
Schema shipped for its kind (the `cli` fixture validates every document it sees); errors under
--json are documents too; the profile's schema accepts every built-in profile."""

from __future__ import annotations

import json
import tomllib

import jsonschema
import pytest
from conftest import check_document

from p2pkit import schemas
from p2pkit.core import config


def test_every_shipped_schema_is_a_valid_schema():
    assert len(schemas.kinds()) >= 15
    for kind in schemas.kinds():
        s = schemas.load(kind)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["properties"]["kind"] == {"const": kind}


@pytest.mark.parametrize("name", ["dual-5090-ninfer", "dual-5090-llamacpp", "dual-spark-vllm"])
def test_profile_schema_accepts_the_builtin_profiles(cli, name):
    r = cli("profile", "schema")
    assert r.code == 0
    schema = json.loads(r.out)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(tomllib.loads(config.builtin_path(name).read_text()), schema)


def test_profile_schema_refuses_what_validate_refuses(cli):
    schema = json.loads(cli("profile", "schema").out)
    doc = tomllib.loads(config.builtin_path("dual-5090-ninfer").read_text())
    for bad in ({**doc, "serve": {**doc.get("serve", {}), "port": 0}}, {**doc, "bogus": {}},
                {**doc, "engine": {**doc["engine"], "recipe": "tensorrt"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_documents_of_the_commands_validate(cli, sim):
    root = str(sim("healthy"))
    kinds = {}
    for args in (["sim", "list"], ["profile", "list"], ["profile", "show"], ["--root", root, "plan"],
                 ["--root", root, "status"], ["--root", root, "doctor"],
                 ["profile", "validate", "dual-spark-vllm"]):
        r = cli("--json", *args)
        kinds[check_document(r.out)["kind"]] = r.code
    assert set(kinds) == {"p2pkit-sim-list", "p2pkit-profile-list", "p2pkit-profile-show", "p2pkit-plan",
                          "p2pkit-status", "p2pkit-doctor", "p2pkit-profile-validate"}


def test_status_and_verify_share_the_check_shape(cli, sim):
    root = str(sim("healthy"))
    assert cli("--root", root, "up", "--to", "preflight").code == 0
    st = check_document(cli("--json", "--root", root, "status").out)
    ve = check_document(cli("--json", "--root", root, "verify", "preflight").out)
    a = next(s for s in st["stages"] if s["stage"] == "preflight")["checks"]
    b = ve["stages"][0]["checks"]
    assert a and b and [set(c) for c in a] == [set(c) for c in b]
    assert [c["id"] for c in a] == [c["id"] for c in b]


@pytest.mark.parametrize("args", [["stauts"], ["--root", "/nonexistent/p2pkit-root", "status"],
                                  ["--set", "serve.port=0", "plan"]])
def test_an_error_under_json_is_a_document(cli, args):
    r = cli("--json", *args)
    doc = check_document(r.out)
    assert doc["kind"] == "p2pkit-error" and doc["exit_code"] == r.code == 2 and doc["message"]
    assert "error" in r.err.lower()  # the human message still goes to stderr


def test_a_document_of_an_unknown_kind_fails_the_contract():
    with pytest.raises(AssertionError, match="no JSON Schema"):
        check_document(json.dumps({"kind": "p2pkit-nothing", "schema": 1}))
    with pytest.raises(jsonschema.ValidationError):
        check_document(json.dumps({"kind": "p2pkit-error", "schema": 1, "exit_code": "2", "message": "", "fix": ""}))
