"""`envport build NAME --target docker` answers `present` before argparse: only that exact form takes the
shortcut; every other command line goes to the full path (None), where argparse judges it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from envport.commands.fast import fast_argv


@pytest.mark.parametrize("argv", [
    ["build", "demo-cpu"],                                     # default target is venv
    ["build", "demo-cpu", "--target", "venv"],
    ["build", "demo-cpu", "--target", "docker", "--rebuild"],  # a flag the shortcut does not know
    ["build", "demo-cpu", "--target", "docker", "--no-lock"],
    ["build", "--target", "docker", "demo-cpu"],               # NAME not first
    ["build", "demo-cpu", "--target"],
    ["render", "--all"],
    ["-C", "/nonexistent", "build", "demo-cpu", "--target", "docker"],  # no specs/ there: full path
])
def test_anything_but_the_plain_docker_form_takes_the_full_path(argv):
    assert fast_argv(argv) is None


def test_the_shortcut_imports_no_command_module_but_build(tmp_path):
    (tmp_path / "specs").mkdir()
    code = ("import sys; from envport.commands.fast import fast_argv; "
            "fast_argv(['-C', sys.argv[1], 'build', 'x', '--target', 'docker']); "
            "print(sorted(m for m in sys.modules if m.startswith(('envport.commands', 'argparse', 'docker', "
            "'http', 'pydantic', 'jinja2'))))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['envport.commands', 'envport.commands.fast']"


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
    import io

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
