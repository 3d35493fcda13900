"""The docs witness for real: demo-cpu's USAGE.md and drifted docs run verbatim inside the built env
(the session's venv, docker image, SIF and SSH venv: no env is built here; for podman, tests/test_podman.py's
six-only env, built by its rootless user), the ledger's skip of an
unchanged doc and --rerun-docs, `validate`'s warning for a missing doc, and the weights completeness
check of a folder fetched by its `source` without pinned files."""

from __future__ import annotations

import json
import os
import pwd
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

from .sif_fixtures import BuiltSif, require_sif_tools, sif_env
from .support import ENV_NAME, as_json, cli_env, fail_with, run_envport, write_spec
from .test_podman import USER as PODMAN_USER
from .test_podman import envport as podman_envport
from .test_podman import tiny, user_venv  # noqa: F401  (the podman case's env, built by its user)

pytest_plugins = ["tests.sif_fixtures"]

DOC_STEP = "docs files/demo-cpu/USAGE.md"

# Each drift the docs level exists to catch, one per block, on known lines.
DRIFTED = """\
# Using demo-cpu (drifted)

```console
$ python -c 'import six; print(six.__version__)'
1.17.0
$ pip show --files-only six
...
$ python -c 'import sys; print("bye"); sys.exit(3)'
bye
```

<!-- envport: norun -->
```console
$ pip install --no-dep six
```
"""


# What a user of tests/support.py's small spec (six only) reads; it passes there.
TINY_DOC = """\
```console
$ python -c 'import six; print(six.__version__)'
1.16.0
$ echo "$TINY_GREETING"
hello from tiny
$ pip show --files six
Name: six
Version: 1.16.0
...
```
"""


def drift_lines(doc: Path) -> list[str]:
    return [f"{doc}:5: expected 1.17.0, got 1.16.0",
            f"{doc}:6: $ pip show --files-only six: pip show has no --files-only (closest: --files)",
            f"{doc}:8: $ python -c 'import sys; print(\"bye\"); sys.exit(3)': exited 3",
            f"{doc}:14: $ pip install --no-dep six: pip install has no --no-dep (closest: --no-deps)"]


def _docs(root: Path, *args: str, env: dict | None = None, ledger: bool = False,
          name: str = ENV_NAME) -> tuple[int, dict]:
    extra = () if ledger else ("--no-ledger",)
    proc = run_envport("witness", name, "--only", "docs", "--json", *extra, *args, root=root,
                       env=env or cli_env(), timeout=600)
    out = as_json(proc)
    assert proc.returncode in (0, 1), fail_with(proc, "envport witness --only docs")
    return proc.returncode, {s["step"]: s for s in out["steps"]}


def _passes(root: Path, *where: str, env: dict | None = None) -> None:
    code, steps = _docs(root, *where, env=env)
    assert code == 0 and list(steps) == [DOC_STEP], steps
    row = steps[DOC_STEP]
    assert row["verdict"] == "OK", row
    assert row["data"]["commands"] == 8 and row["data"]["norun"] == 1 and row["data"]["flags"] >= 3, row


def _drifts(root: Path, tmp_path: Path, *where: str, env: dict | None = None, name: str = ENV_NAME) -> None:
    doc = tmp_path / "DRIFTED.md"
    doc.write_text(DRIFTED)
    code, steps = _docs(root, *where, "--docs", str(doc), env=env, name=name)
    assert code == 1 and list(steps) == [f"docs {doc}"], steps
    row = steps[f"docs {doc}"]
    said = [re.sub(r" \(\+\d+ more\)$", "", row["detail"])] + row["lines"]
    assert row["verdict"] == "FAILED" and said[0] == drift_lines(doc)[0], row
    for line in drift_lines(doc):
        assert line in said, (line, said)


# --- one pair of tests per backend, each naming its session fixture ------------------------------------


def test_the_demo_doc_passes_in_the_venv(local_venv):
    _passes(local_venv.root, "--target", "venv", "--python", local_venv.python)


def test_a_drifted_doc_fails_naming_each_line_in_the_venv(local_venv, tmp_path):
    _drifts(local_venv.root, tmp_path, "--target", "venv", "--python", local_venv.python)


def test_the_demo_doc_passes_in_the_image(demo_image):
    _passes(demo_image.root, "--target", "docker", "--image", demo_image.tag)


def test_a_drifted_doc_fails_naming_each_line_in_the_image(demo_image, tmp_path):
    _drifts(demo_image.root, tmp_path, "--target", "docker", "--image", demo_image.tag)


def test_a_doc_passes_and_drift_fails_in_the_sif(tiny_sif: BuiltSif, tmp_path):
    # demo-cpu's own doc runs in its SIF with every other witness (test_sif_witness.py, which asserts every row
    # OK); here the small SIF keeps the drift cases cheap.
    require_sif_tools()
    where = ("--target", "apptainer", "--sif", str(tiny_sif.path), "--site", tiny_sif.site)
    good = tmp_path / "TINY.md"
    good.write_text(TINY_DOC)
    code, steps = _docs(tiny_sif.root, *where, "--docs", str(good), env=sif_env(), name=tiny_sif.name)
    assert code == 0 and steps[f"docs {good}"]["verdict"] == "OK", steps
    _drifts(tiny_sif.root, tmp_path, *where, env=sif_env(), name=tiny_sif.name)


def test_a_doc_passes_and_drift_fails_in_rootless_podman(tiny):
    # tests/test_podman.py's six-only env, built by its unprivileged user (rootless podman is that user's alone).
    project, name, _, _ = tiny
    pw = pwd.getpwnam(PODMAN_USER)
    good, drifted = project / "TINY.md", project / "DRIFTED.md"
    good.write_text(TINY_DOC)
    drifted.write_text(DRIFTED)
    for doc in (good, drifted):
        os.chown(doc, pw.pw_uid, pw.pw_gid)
    where = ("witness", name, "--target", "podman", "--only", "docs", "--no-ledger")
    steps, _ = podman_envport(PODMAN_USER, *where, "--docs", str(good), project=project)
    assert [(r["step"], r["verdict"]) for r in steps] == [(f"docs {good}", "OK")], steps
    steps, _ = podman_envport(PODMAN_USER, *where, "--docs", str(drifted), project=project, exit_code=1)
    [row] = steps
    said = [re.sub(r" \(\+\d+ more\)$", "", row["detail"])] + row["lines"]
    assert row["step"] == f"docs {drifted}" and row["verdict"] == "FAILED", row
    for line in drift_lines(drifted):
        assert line in said, (line, said)


def test_the_demo_doc_passes_and_drift_fails_over_ssh(ssh_venv, tmp_path):
    where = ("--target", "venv", "--host", "test")
    env = cli_env(ENVPORT_ENVS_DIR=ssh_venv.envs_dir)
    _passes(ssh_venv.root, *where, env=env)
    _drifts(ssh_venv.root, tmp_path, *where, env=env)


# --- when it runs: the ledger ------------------------------------------------------------------------


def test_an_unchanged_doc_is_skipped_until_it_changes_or_rerun_docs(local_venv, tmp_path):
    env = cli_env(ENVPORT_STATE_DIR=str(tmp_path / "state"))
    doc = tmp_path / "USAGE.md"
    doc.write_text((local_venv.root / "specs" / "files" / "demo-cpu" / "USAGE.md").read_text())
    where = ("--target", "venv", "--python", local_venv.python, "--docs", str(doc))
    step = f"docs {doc}"

    def verdict(*extra: str) -> dict:
        code, steps = _docs(local_venv.root, *where, *extra, env=env, ledger=True)
        assert code == 0, steps
        return steps[step]

    assert verdict()["verdict"] == "OK"
    again = verdict()
    assert again["verdict"] == "present" and "unchanged since it passed on" in again["detail"], again
    assert "--rerun-docs" in again["detail"] and again["seconds"] < 1, again
    forced = verdict("--rerun-docs")
    assert forced["verdict"] == "OK" and "ran as the doc shows" in forced["detail"], forced
    doc.write_text(doc.read_text() + "\nOne more line of prose.\n")  # the doc changed: its sha256 did
    assert verdict()["verdict"] == "OK"


def test_a_failed_doc_is_not_skipped_next_time(local_venv, tmp_path):
    env = cli_env(ENVPORT_STATE_DIR=str(tmp_path / "state"))
    doc = tmp_path / "DRIFTED.md"
    doc.write_text(DRIFTED)
    for _ in range(2):
        code, steps = _docs(local_venv.root, "--target", "venv", "--python", local_venv.python, "--docs", str(doc),
                            env=env, ledger=True)
        assert code == 1 and steps[f"docs {doc}"]["verdict"] == "FAILED", steps


def test_junit_has_a_row_per_doc(local_venv, tmp_path):
    doc = tmp_path / "DRIFTED.md"
    doc.write_text(DRIFTED)
    junit = tmp_path / "witness.xml"
    code, _ = _docs(local_venv.root, "--target", "venv", "--python", local_venv.python, "--docs", str(doc),
                    "--junit", str(junit))
    assert code == 1
    [case] = ET.parse(junit).getroot().findall("testcase")
    assert case.get("name") == f"docs {doc}"
    failure = case.find("failure")
    assert failure is not None and failure.get("message").startswith(drift_lines(doc)[0])
    assert drift_lines(doc)[3] in failure.text


def test_up_ends_with_the_docs_level_and_skips_an_unchanged_doc(project, tmp_path):
    # A six-only env (seconds to build): up's witness step runs its doc last, and the next up finds it unchanged.
    (project / "specs" / "files" / "tiny-docs").mkdir(parents=True)
    (project / "specs" / "files" / "tiny-docs" / "USAGE.md").write_text(TINY_DOC)
    write_spec(project, "tiny-docs", witnesses={"imports": ["six"], "docs": ["files/tiny-docs/USAGE.md"]})
    env = cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs"), ENVPORT_STATE_DIR=str(tmp_path / "state"))

    def docs_row() -> dict:
        proc = run_envport("up", "tiny-docs", "--target", "venv", "--json", root=project, env=env, timeout=900)
        assert proc.returncode == 0, fail_with(proc, "envport up tiny-docs --target venv")
        witness = next(s for s in as_json(proc)["steps"] if s["step"] == "witness")
        [row] = witness["data"]["docs"]
        assert row["step"] == "docs files/tiny-docs/USAGE.md", witness
        return row

    first = docs_row()
    assert first["verdict"] == "OK" and first["data"]["commands"] == 3, first
    again = docs_row()
    assert again["verdict"] == "present" and "unchanged since it passed" in again["detail"], again


# --- no env needed --------------------------------------------------------------------------------------


def test_validate_warns_when_a_named_doc_is_missing(project):
    spec = project / "specs" / f"{ENV_NAME}.yaml"
    data = yaml.safe_load(spec.read_text())
    data["witnesses"]["docs"] = ["files/demo-cpu/USAGE.md", "files/demo-cpu/GONE.md"]
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = run_envport("validate", ENV_NAME, root=project, env=cli_env())
    assert proc.returncode == 0, fail_with(proc, "envport validate")
    assert "witnesses.docs[1]: files/demo-cpu/GONE.md does not exist" in proc.stderr, proc.stderr
    assert "USAGE.md does not exist" not in proc.stderr


def test_only_docs_on_a_spec_without_docs_is_skipped_saying_so():
    from envport.spec.model import Spec
    from envport.witness.plan import WitnessOptions, plan_witnesses

    spec = Spec(name="nodocs", base="debian:bookworm-slim", python="3.11", witnesses={"imports": ["six"]})
    planned = plan_witnesses(spec, WitnessOptions(only=["docs"], docs=[]))
    assert planned.calls == []
    assert [(r.step, r.verdict.value, r.detail) for r in planned.skipped] == [
        ("docs", "skipped", "the spec asks for no docs witness")]


def test_up_leaves_no_doc_out_and_runs_the_docs_call_last():
    from envport.spec.model import Spec
    from envport.witness.doc_sources import Doc
    from envport.witness.plan import WitnessOptions, plan_witnesses

    spec = Spec(name="d", base="debian:bookworm-slim", python="3.11",
                witnesses={"imports": ["six"], "kernel": True, "docs": ["files/d/USAGE.md"]})
    doc = Doc("files/d/USAGE.md", Path("USAGE.md"), text="```console\n$ true\n```\n", sha256="1")
    calls = plan_witnesses(spec, WitnessOptions(docs=[doc])).calls
    assert [c.script for c in calls] == ["basic.py", "kernel.py", "docs.py"]
    # A caller that reads no docs (None) plans no docs call, and claims nothing about them.
    assert [c.script for c in plan_witnesses(spec, WitnessOptions()).calls] == ["basic.py", "kernel.py"]


# --- weights fetched by `source` without pinned files ------------------------------------------------


def _fetch(project: Path, tmp_path: Path, source: str, size_gb: float) -> dict:
    write_spec(project, "unpinned", weight_dirs={"model": {"path": "/weights/model", "env": "MODEL_DIR",
                                                           "source": source, "size_gb": size_gb}})
    proc = run_envport("weights", "fetch", "unpinned", "--json", root=project,
                       env=cli_env(ENVPORT_WEIGHTS_DIR=str(tmp_path / "weights")), timeout=120)
    out = json.loads(proc.stdout)
    return {"exit": proc.returncode, **out["steps"][-1]}


def test_an_empty_weight_subdirectory_is_named(project, tmp_path):
    got = _fetch(project, tmp_path, 'mkdir -p "$MODEL_DIR/shards" && echo "{}" > "$MODEL_DIR/config.json"', 0)
    shards = tmp_path / "weights" / "unpinned" / "model" / "shards"
    assert got["exit"] == 1 and got["verdict"] == "FAILED" and got["reason"] == "weights_incomplete", got
    assert f"{shards}: empty subdirectory" in got["detail"], got


def test_a_fetch_far_below_its_size_is_failed(project, tmp_path):
    got = _fetch(project, tmp_path, 'echo "{}" > "$MODEL_DIR/config.json"', 1)
    assert got["verdict"] == "FAILED" and "far below its size_gb 1" in got["detail"], got


def test_a_source_that_leaves_nothing_is_failed(project, tmp_path):
    got = _fetch(project, tmp_path, "true", 0)
    assert got["verdict"] == "FAILED" and "left" in got["detail"] and "empty" in got["detail"], got


def test_a_complete_unpinned_fetch_is_ok(project, tmp_path):
    got = _fetch(project, tmp_path, 'mkdir -p "$MODEL_DIR/a" && head -c 2000 /dev/zero > "$MODEL_DIR/a/w.bin"', 1e-6)
    assert got["exit"] == 0 and got["verdict"] == "OK", got


@pytest.mark.parametrize("verdict", ["OK", "FAILED"])
def test_the_ledger_only_counts_a_passed_doc_of_this_env_and_target(verdict):
    from envport.report.ledger import doc_passes

    step = {"step": "docs U.md", "verdict": verdict, "data": {"doc_sha256": "aa"}}
    recs = [{"kind": "witness", "target": "venv", "hash": "h1", "when": "T1", "steps": [step]},
            {"kind": "witness", "target": "docker", "hash": "h1", "when": "T2", "steps": [step]},
            {"kind": "witness", "target": "venv", "hash": "h0", "when": "T3", "steps": [step]}]
    want = {"aa": "T1"} if verdict == "OK" else {}
    assert doc_passes(recs, target="venv", hash_="h1") == want
    assert doc_passes(recs, target="venv", hash_="h1", ssh_host="test") == {}


def test_the_env_doc_says_how_each_doc_last_ran():
    from envport.report.ledger import render_doc

    def rec(when: str, verdict: str) -> dict:
        return {"kind": "witness", "target": "docker", "hash": "a" * 64, "verdict": "OK", "when": when,
                "steps": [{"step": "docs files/d/USAGE.md", "verdict": verdict,
                           "data": {"doc": "files/d/USAGE.md", "doc_sha256": "s"}}]}

    text = render_doc("d", [rec("2026-12-01T00:00:00+00:00", "FAILED"), rec("2026-12-03T00:00:00+00:00", "OK"),
                            rec("2026-12-04T00:00:00+00:00", "present")])
    assert "docs: files/d/USAGE.md OK 2026-12-03 on docker" in text.splitlines(), text
