"""`envport build NAME --target docker|apptainer` answers `present` before argparse: only that exact form takes
the shortcut; every other command line goes to the full path (None), where argparse judges it."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from envport.commands.fast import fast_argv


@pytest.mark.parametrize("argv", [
    ["build", "demo-cpu"],                                     # default target is venv
    ["build", "demo-cpu", "--target", "venv"],
    ["build", "demo-cpu", "--target", "docker", "--rebuild"],  # a flag the shortcut does not know
    ["build", "demo-cpu", "--target", "docker", "--no-lock"],
    ["build", "demo-cpu", "--target", "apptainer", "--from-docker"],
    ["build", "demo-cpu", "--target", "conda"],
    ["build", "--target", "docker", "demo-cpu"],               # NAME not first
    ["build", "demo-cpu", "--target"],
    ["render", "--all"],
    ["-C", "/nonexistent", "build", "demo-cpu", "--target", "docker"],  # no specs/ there: full path
])
def test_anything_but_the_plain_docker_form_takes_the_full_path(argv):
    assert fast_argv(argv) is None


def _modules_after(root, name: str, target: str, watched: tuple[str, ...]) -> str:
    """`<exit code> <sorted loaded modules that are one of WATCHED or inside one>` after the shortcut, in a fresh
    process."""
    inside = tuple(w + "." for w in watched)
    code = ("import sys; from envport.commands.fast import fast_argv; "
            f"code = fast_argv(['-C', sys.argv[1], 'build', {name!r}, '--target', {target!r}]); "
            f"print(code, sorted(m for m in sys.modules if m in {watched!r} or m.startswith({inside!r})))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()[-1]


def test_the_shortcut_imports_no_command_module_but_build(tmp_path):
    (tmp_path / "specs").mkdir()
    got = _modules_after(tmp_path, "x", "docker", ("envport.commands", "argparse", "docker", "http", "pydantic",
                                                   "jinja2"))
    assert got == "None ['envport.commands', 'envport.commands.fast']"


def test_the_plain_answer_is_the_verdict_modules_line(demo_image, capsys):
    """The shortcut writes StepResult.line() itself (so it need not import the verdict module): same text."""
    from envport.core.verdict import StepResult, Verdict

    code = fast_argv(["-C", str(demo_image.root), "build", "demo-cpu", "--target", "docker"])
    assert code is not None, "a build that ended OK remembers its image, so the shortcut must answer"
    out = capsys.readouterr().out.splitlines()
    size = demo_image.result["steps"][-1]["data"]["size"]
    want = StepResult(f"image {demo_image.tag}", Verdict.PRESENT, f"{demo_image.id[:19]} ({size / 1e9:.2f} GB)")
    assert code == 0 and out[0] == want.line()


def test_the_json_answer_is_the_verdict_modules_json(demo_image, capsys):
    from envport.core.verdict import StepResult, Verdict, report

    code = fast_argv(["-C", str(demo_image.root), "build", "demo-cpu", "--target", "docker", "--json"])
    assert code == 0
    data = demo_image.result["steps"][-1]["data"]
    want = io.StringIO()
    report([StepResult(f"image {demo_image.tag}", Verdict.PRESENT,
                       f"{demo_image.id[:19]} ({data['size'] / 1e9:.2f} GB)",
                       data={"image": demo_image.tag, "image_id": demo_image.id, "size": data["size"]})],
           True, stream=want, command="build")
    assert capsys.readouterr().out == want.getvalue()


# --- apptainer: the SIF at its identity path, read without sif/format.py -----------------------------------


@pytest.fixture
def present_sif(tmp_path):
    """A project whose demo-cpu SIF exists at its identity path with its hash in the labels, and which the full
    path has already answered once (so the identity is remembered). The partition is a stub: `present` takes
    the file on this machine's build record alone (sif/record.py, written here as the
    builder writes it), never reading the squashfs."""
    from envport.builders.apptainer.builder import sif_path
    from envport.builders.apptainer.singularity_d import inspect_metadata
    from envport.sif.format import write_sif
    from envport.plan.site import load_site
    from envport.recipe.identity import resolve
    from envport.spec.loader import load_spec

    from .support import as_json, copy_project, run_envport

    root = copy_project(tmp_path / "project")
    site = load_site(None, root)
    resolved = resolve(load_spec("demo-cpu", root), site, "apptainer")
    sif = sif_path(site, root, resolved.identity)
    squashfs = tmp_path / "stub.sqfs"
    squashfs.write_bytes(b"hsqs" + bytes(5000))
    write_sif(sif, deffile=b"Bootstrap: docker\n", squashfs_path=squashfs, created=0, uuid=bytes(16),
              inspect_metadata=inspect_metadata(deffile="Bootstrap: docker", environment={},
                                                labels={"envport.hash": resolved.hash, "envport.name": "demo-cpu"}))
    from envport.sif import content as sif_content
    from envport.sif import record as sif_record
    from envport.sif.format import read_sif

    sif_record.write(str(sif), resolved.hash, "0" * 64, sif_content.layout(read_sif(sif)))
    assert fast_argv(["-C", str(root), "build", "demo-cpu", "--target", "apptainer"]) is None  # nothing remembered
    full = run_envport("build", "demo-cpu", "--target", "apptainer", "--json", root=root, timeout=300)
    assert full.returncode == 0, full.stdout + full.stderr
    assert as_json(full)["steps"][-1]["verdict"] == "present"
    return root, sif, resolved.hash, as_json(full)


def _fast_sif(root, *extra):
    return fast_argv(["-C", str(root), "build", "demo-cpu", "--target", "apptainer", *extra])


def test_sif_answers_are_the_full_paths(present_sif, capsys):
    """The line and the JSON the shortcut writes are what the full path (builder.present + core.verdict) wrote,
    but for the seconds it took."""
    from envport.core.verdict import StepResult, Verdict, report

    root, sif, hash_, full = present_sif
    capsys.readouterr()
    assert _fast_sif(root, "--json") == 0
    fast = json.loads(capsys.readouterr().out)
    full["steps"][-1]["seconds"] = 0.0
    assert fast == full
    assert _fast_sif(root) == 0
    out = capsys.readouterr().out.splitlines()
    step = full["steps"][-1]
    assert out[0] == StepResult(step["step"], Verdict.PRESENT, step["detail"]).line()
    assert out[1] == f"present demo-cpu@{hash_[:12]} --target apptainer"
    want = io.StringIO()
    report([StepResult(step["step"], Verdict.PRESENT, step["detail"], data=step["data"])], True, stream=want,
           command="build")
    assert json.loads(want.getvalue()) == fast


def test_sif_missing_truncated_foreign_or_relabelled_takes_the_full_path(present_sif, tmp_path):
    root, sif, hash_, _ = present_sif
    assert _fast_sif(root) == 0
    whole = sif.read_bytes()
    for size in (len(whole) - 1, 36000, 4096 + 585, 100, 0):  # cut inside the partition, an object, the table...
        sif.write_bytes(whole[:size])
        assert _fast_sif(root) is None, f"cut to {size} bytes"
    sif.write_bytes(b"\x7fELF" + bytes(len(whole) - 4))  # a foreign file under the SIF's name
    assert _fast_sif(root) is None
    sif.write_bytes(whole.replace(hash_.encode(), b"0" * len(hash_)))  # another env's labels
    assert _fast_sif(root) is None
    sif.unlink()
    assert _fast_sif(root) is None
    sif.write_bytes(whole)
    assert _fast_sif(root) is None  # the same bytes back, but not the file this machine's build wrote


def test_sif_stale_inputs_take_the_full_path(present_sif):
    """An edited spec (another hash, another SIF name) is never answered from the remembered identity."""
    root, sif, hash_, _ = present_sif
    assert _fast_sif(root) == 0
    spec = root / "specs" / "demo-cpu.yaml"
    spec.write_text(spec.read_text() + "\n# an edit\n")
    assert _fast_sif(root) is None
    assert _fast_sif(root, "--site", "elsewhere") is None  # another site: nothing remembered


def test_the_sif_shortcut_loads_neither_the_sif_module_nor_the_spec(present_sif):
    got = _modules_after(present_sif[0], "demo-cpu", "apptainer", (
        "envport.sif.format", "envport.spec", "envport.core.verdict", "dataclasses", "argparse", "hashlib", "json",
        "yaml", "pydantic", "jinja2"))
    assert got == "0 []"


@pytest.mark.parametrize("text", [
    '{"Id": "sha256:ab", "Size": 1080000000, "Config": {"Labels": {"envport.hash": "f00"}}, "RepoTags": []}\n',
    '  [1, -2.5e3, true, false, null, "\\u00e9\\n", {"a": [NaN, Infinity, -Infinity]}] ',
    '"caf\u00e9"', "0", "{}",
])
def test_the_c_scanner_reads_json_as_json_loads_does(text):
    from envport.core.cjson import loads

    assert repr(loads(text.encode())) == repr(json.loads(text))  # repr: NaN == NaN


@pytest.mark.parametrize("text", ["", "   ", '{"a": 1} x', '{"a": 1', "[1,]", "nul", b"\xff{}"])
def test_the_c_scanner_refuses_what_json_loads_refuses(text):
    from envport.core.cjson import loads

    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        loads(text if isinstance(text, bytes) else text.encode())
