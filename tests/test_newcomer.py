"""The first hour of a new user (issue 27): what the commands typed after the quickstart say.

Each test runs the real CLI on a copy of the project (tests/fixtures.py `project`).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from .support import REPO, as_json, cli_env, copy_tracked, missing, run_envport, unique, write_spec

WORKFLOW = ".github/workflows/envs.yml"


def _fixes(text: str) -> list[str]:
    """Every command a line tells the user to run (`run `X``)."""
    return re.findall(r"run `([^`]+)`", text)


def test_render_one_then_check_all_gives_one_fix(project):
    # The project keeps the generated workflow, as the checkout does. Exit 3: the pairs a hosted runner cannot
    # pass are left out of it, each named with its reason ([lock_source], [unreachable_host]).
    kept = run_envport("matrix", "--format", "github", root=project, timeout=120)
    assert kept.returncode in (0, 3) and "OK       .github/workflows/envs.yml" in kept.stdout, kept.stdout + kept.stderr
    name = unique("newcomer")
    write_spec(project, name)
    run_envport("render", name, root=project, timeout=120, check=True)
    proc = run_envport("render", "--all", "--check", root=project, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"drift: {WORKFLOW}\n" in proc.stderr, proc.stderr
    # One fix, the one that clears the workflow too (`render NAME` just ran and did not).
    assert _fixes(proc.stderr) == ["envport render --all"], proc.stderr
    run_envport("render", "--all", root=project, timeout=120, check=True)
    assert run_envport("render", "--all", "--check", root=project, timeout=120).returncode == 0


def test_render_check_of_named_specs_names_them_in_its_fix(project):
    name = unique("newcomer")
    write_spec(project, name)
    proc = run_envport("render", name, "--check", root=project, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _fixes(proc.stderr) == [f"envport render {name}"], proc.stderr


def _refs(text: str, name: str) -> list[str]:
    return re.findall(rf"\b{re.escape(name)}@([0-9a-f]{{12}})\b", text)


def test_validate_and_show_print_the_identity_build_uses_first_and_label_the_portable_one(project, tmp_path):
    name = unique("newcomer")
    write_spec(project, name)
    # `build --check` builds nothing and names the env it would build (a venv under tmp_path).
    built = run_envport("build", name, "--target", "venv", "--check", root=project, timeout=120,
                        env=cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs")))
    assert built.returncode == 1, built.stdout + built.stderr
    build_ref = set(_refs(built.stdout + built.stderr, name))
    assert len(build_ref) == 1, built.stdout + built.stderr
    validated = run_envport("validate", name, root=project, timeout=120, check=True).stdout
    shown = run_envport("show", name, root=project, timeout=120, check=True).stdout
    # The local site adds a CA bundle and a wheelhouse: the two hashes differ, and each command says which is which.
    for out in (validated, shown):
        first, portable_ref = _refs(out, name)[:2]
        assert {first} == build_ref and portable_ref != first, out
        assert re.search(rf"portable[^\n]*{name}@{portable_ref}", out), out
    assert "built on site local" in validated
    portable = run_envport("validate", name, "--json", root=project, timeout=120, check=True)
    step = as_json(portable)["steps"][0]["data"]
    assert step["hash"][:12] in build_ref and step["site"] == "local" and step["portable_hash"] != step["hash"]


def _ledger(project, name: str, env: dict) -> list[dict]:
    proc = run_envport("ledger", name, "--json", root=project, timeout=60, env=env)
    return as_json(proc).get("records", []) if proc.returncode == 0 else []


def test_build_check_records_nothing_and_an_interrupt_records_interrupted(project, tmp_path):
    name = unique("newcomer")
    # No pip phase (nothing fetched); the run command keeps the build busy until the signal.
    write_spec(project, name, pip_phases=[], env={}, run_commands=["sleep 300"])
    env = cli_env(ENVPORT_ENVS_DIR=str(tmp_path / "envs"), ENVPORT_STATE_DIR=str(tmp_path / "state"))
    for _ in range(2):
        proc = run_envport("build", name, "--target", "venv", "--check", root=project, timeout=120, env=env)
        assert proc.returncode == 1 and "[not_present]" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert _ledger(project, name, env) == []  # a check builds nothing: before, each one was a `build FAILED`
    bg = subprocess.Popen([sys.executable, "-m", "envport", "-C", str(project), "build", name, "--target", "venv"],
                          cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in bg.stderr:  # bounded: the build ends by itself if the signal is never sent
            if "step 2/" in line:
                break
        bg.send_signal(signal.SIGINT)
        bg.communicate(timeout=120)
    finally:
        bg.kill()
    records = _ledger(project, name, env)
    assert [(r["kind"], r["verdict"]) for r in records] == [("build", "interrupted")], records
    assert "SIGINT" in records[0]["summary"], records


def test_matrix_prints_one_short_line_per_pair_and_each_fix_once(project):
    table = run_envport("matrix", root=project, timeout=300, check=True).stdout
    pairs = as_json(run_envport("matrix", "--json", root=project, timeout=300, check=True))["pairs"]
    lines = table.splitlines()
    rows = {ln.split("  ")[0].strip(): ln for ln in lines[1:1 + len(pairs)]}
    assert sorted(rows) == sorted(p["label"] for p in pairs), table
    notes = {int(m.group(1)): m.group(2) for m in (re.match(r"\[(\d+)\] (\w+): ", ln) for ln in lines) if m}
    fixes = [ln.strip() for ln in lines if ln.startswith("    fix: ")]
    assert len(fixes) == len(set(fixes)), table  # each distinct fix once
    for p in pairs:
        row = rows[p["label"]]
        # The fix (never part of a reason cell) and the detail live below the table, not in the row.
        assert len(row) <= 160 and "fix:" not in row, row
        refs = [(reason, int(n)) for reason, n in re.findall(r"(\w+) \[(\d+)\]", row)]
        unmet = [n for n in p["needs"] if n["ok"] is False]
        assert [r for r, _ in refs] == [n["reason"] for n in unmet], (row, unmet)
        for (reason, number), need in zip(refs, unmet):
            assert notes[number] == reason, (row, notes)
            if need.get("fix"):
                assert f"    fix: {need['fix']}" in lines, need
    # Every pair refused for the same fix points at the same note.
    by_fix = {}
    for p in pairs:
        for n in (n for n in p["needs"] if n["ok"] is False and n.get("fix")):
            by_fix.setdefault(n["fix"], set()).update(
                int(x) for r, x in re.findall(r"(\w+) \[(\d+)\]", rows[p["label"]]) if r == n["reason"])
    assert all(len(numbers) == 1 for numbers in by_fix.values()), by_fix


def _just() -> str:
    just = shutil.which("just")
    if just is None:
        missing("just is not installed (PyPI's rust-just: `pip install rust-just`; scripts/demo.sh installs it)")
    return just


def test_just_runs_this_checkouts_envport_or_refuses_in_two_lines(tmp_path):
    just = _just()
    which = subprocess.run([just, "which"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert which.returncode == 0, which.stdout + which.stderr
    command = which.stdout.strip()
    if command != f"{REPO}/.venv/bin/envport":
        python = command.removesuffix(" -m envport")
        where = subprocess.run([python, "-c", "import envport; print(envport.__file__)"], capture_output=True,
                               text=True, timeout=60).stdout.strip()
        assert Path(where).resolve().is_relative_to(REPO / "src"), (command, where)
    # A clone with no envport of its own, where python3 imports another checkout's: refused, not run.
    clone = copy_tracked(tmp_path / "clone")
    proc = subprocess.run([just, "build", "demo-cpu", "--target", "venv"], cwd=clone, capture_output=True,
                          text=True, timeout=60)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode != 0 and len(lines) <= 2, lines
    assert "has no envport installed" in lines[0] and "run: bash scripts/demo.sh" in lines[0], lines


def test_a_cli_witness_written_as_a_string_is_refused_with_the_shape_to_write(project):
    name = unique("newcomer")
    write_spec(project, name, witnesses={"cli": ["python -c 'print(1)'", 5]})
    proc = run_envport("validate", name, root=project, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert "CliCheck" not in text and "instance of" not in text, text
    assert ("witnesses.cli[0]: a CLI witness is a mapping, not a string; write "
            "{cmd: \"python -c 'print(1)'\", expect: \"regex\"}") in text, text
    assert "witnesses.cli[1]: a CLI witness is a mapping {cmd: " in text, text


def test_one_url_string_where_a_list_is_expected_is_a_one_element_list(project):
    name = unique("newcomer")
    write_spec(project, name, pip_phases=[{"packages": ["six==1.16.0"], "find_links": "https://example.org/wheels/",
                                           "extra_index_urls": "https://example.org/simple"}])
    run_envport("validate", name, root=project, timeout=120, check=True)
    shown = as_json(run_envport("show", name, "--json", root=project, timeout=120, check=True))
    phase = shown["spec"]["pip_phases"][0]
    assert phase["find_links"] == ["https://example.org/wheels/"], phase
    assert phase["extra_index_urls"] == ["https://example.org/simple"], phase


def test_one_url_string_in_a_site_profile_is_a_one_element_list():
    from envport.plan.site import PipSources

    pip = PipSources.model_validate({"find_links": "https://example.org/wheels/",
                                     "extra_index_urls": "https://example.org/simple"})
    assert pip.find_links == ["https://example.org/wheels/"] and pip.extra_index_urls == ["https://example.org/simple"]


def test_docs_spec_md_documents_every_witness_field():
    from envport.spec.model import CliCheck, Collectives, DTensorCheck, Witnesses

    doc = (REPO / "docs" / "spec.md").read_text()
    section = doc[doc.index("### Witnesses"):]
    section = section[:section.index("\n### ", 1)]
    for model in (Witnesses, CliCheck, Collectives, DTensorCheck):
        for field in model.model_fields:
            assert f"`{field}`" in section, f"docs/spec.md's Witnesses section does not name `{field}`"
    assert "re.search" in section and "searched" in section


def test_lock_names_what_moved_spec_phases_and_versions_old_to_new(tmp_path):
    from .support import PY
    from .tinywheels import local_phase, make_wheel

    (tmp_path / "specs").mkdir()
    wheels = tmp_path / "wheels"
    for name, version in (("envport-ta", "1.0"), ("envport-tc", "3.0"), ("envport-tc", "3.1"), ("envport-td", "1.0")):
        make_wheel(wheels, name, version, files={f"{name.replace('-', '_')}/__init__.py": f"V = {version!r}\n"})
    write_spec(tmp_path, "tiny", python=PY, pip_phases=[local_phase(tmp_path, "envport-ta==1.0", "envport-tc==3.0")])
    first = as_json(run_envport("lock", "tiny", "--json", root=tmp_path, timeout=600, check=True))
    assert first["steps"][0]["data"]["changes"] == [], first
    write_spec(tmp_path, "tiny", python=PY, pip_phases=[local_phase(tmp_path, "envport-tc==3.1", "envport-td==1.0")])
    proc = run_envport("lock", "tiny", root=tmp_path, timeout=600, check=True)
    out = proc.stdout + proc.stderr
    assert "; 4 change(s) from the lock before" in out, out
    for line in ("spec: phase 1 was ['envport-ta==1.0', 'envport-tc==3.0'] and is now "
                 "['envport-tc==3.1', 'envport-td==1.0']",
                 "envport-ta: gone (was 1.0)", "envport-tc: 3.0 -> 3.1", "envport-td: new, 1.0"):
        assert line in out, out


def test_a_docker_step_of_two_instructions_says_done_once():
    from envport.builders.docker.log import BuildkitLog, instruction_steps

    dockerfile = ("# step 1/3 base: base img\nFROM img\n"
                  "# step 2/3 files: shim files (1)\nCOPY files/a /opt/a\nRUN chmod 0644 /opt/a\n"
                  "# step 3/3 pip-1: pip phase 1: six==1.16.0\nRUN python -m pip install six==1.16.0\n")
    ops, _ = instruction_steps(dockerfile)
    lines: list[str] = []
    log = BuildkitLog(ops, lines.append)
    for line in ["#4 [1/4] FROM docker.io/library/img", "#4 DONE 0.1s",
                 "#5 [2/4] COPY files/a /opt/a", "#5 DONE 0.2s",
                 "#6 [3/4] RUN chmod 0644 /opt/a", "#6 DONE 0.3s",
                 "#7 [4/4] RUN python -m pip install six==1.16.0", "#7 CACHED"]:
        log.feed(line)
    done = [ln for ln in lines if " done " in ln or ln.endswith(" cached")]
    assert done == ["envport: [docker] step 2/3 files done (0.5s, 2 instructions)",
                    "envport: [docker] step 3/3 pip-1 cached"], lines


def test_mksquashfs_progress_is_read_from_its_own_bar(tmp_path):
    from envport.builders.apptainer.squash_progress import BAR, run_mksquashfs

    if shutil.which("mksquashfs") is None:
        missing("mksquashfs not installed (apt-get install squashfs-tools)")
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(40):
        (tree / f"f{i}").write_bytes(bytes(range(256)) * 400 * (i + 1))
    said: list[str] = []
    code, out = run_mksquashfs(["mksquashfs", str(tree), str(tmp_path / "t.sqfs"), "-noappend", "-comp", "gzip",
                                "-progress", "-quiet"], said.append, tick_s=0.01)
    assert code == 0, out
    assert said and re.fullmatch(r"mksquashfs: 100% \((\d+)/\1 blocks, \d+s\)", said[-1]), said
    assert "\r" not in out and BAR.search(out), out


def test_a_stalled_mksquashfs_bar_is_said_again_each_tick(tmp_path):
    # A stand-in for a mksquashfs whose bar stalls (a big file compressing): its real bar format, then
    # a pause of many ticks.
    from envport.builders.apptainer.squash_progress import run_mksquashfs

    script = "printf '\\r[==    ] 1/4  25%%'; sleep 1; printf '\\r[======] 4/4 100%%\\n'"
    said: list[str] = []
    code, _ = run_mksquashfs(["sh", "-c", script], said.append, tick_s=0.1)
    assert code == 0
    quarter = [s for s in said if s.startswith("mksquashfs: 25% (1/4 blocks, ")]
    assert len(quarter) >= 2 and said[-1].startswith("mksquashfs: 100% (4/4 blocks, "), said
