"""An imported recipe's build-time weights download, run for real as the spec's weight `source`
(porting/weights.py): the recipe's folder became $ENVPORT_WEIGHT_DIR, so `envport weights fetch` puts the
file under the weights root, never at the recipe's absolute path on this host. The file is served by a
plain HTTP server on loopback (no model host is reachable here, and none is needed to prove where it lands).
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import yaml

from envport.porting.weights import pointed_at_weight_dir

from .support import fail_with, run_envport

PAYLOAD = b"\x00weights\x01" * 4096


class _Serve(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD)

    def log_message(self, *args):
        pass


def test_an_imported_weights_download_is_fetched_into_the_weight_folder(tmp_path: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Serve)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    recipe_dir = f"/opt/envport-test-{tmp_path.name}/tool"  # the recipe's folder: must stay untouched here
    try:
        url = f"http://127.0.0.1:{server.server_port}/files/model.ckpt"
        ctx = tmp_path / "ctx"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(
            "FROM python:3.11-slim-bookworm\n"
            "RUN pip install --no-cache-dir six==1.17.0\n"
            f"RUN curl -fsSL {url} -o {recipe_dir}/model.ckpt\n")
        proj = tmp_path / "proj"
        (proj / "specs").mkdir(parents=True)
        proc = run_envport("import", str(ctx / "Dockerfile"), "--name", "wfetch", root=proj, timeout=120)
        assert proc.returncode == 0, fail_with(proc, "envport import")
        assert "weight_dirs.model: turned into weight_dirs" in proc.stdout, proc.stdout
        spec_file = proj / "specs" / "wfetch.yaml"
        spec = yaml.safe_load(spec_file.read_text())
        weight = spec["weight_dirs"]["model"]
        assert weight["path"] == recipe_dir
        assert weight["source"] == f'curl -fsSL {url} -o "$ENVPORT_WEIGHT_DIR"/model.ckpt', weight
        # What the note's fix asks of the user: pin the file; then fetch runs the recipe's own command.
        weight["files"] = [{"path": "model.ckpt", "size": len(PAYLOAD),
                            "sha256": hashlib.sha256(PAYLOAD).hexdigest()}]
        spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
        root = tmp_path / "weights"
        proc = run_envport("weights", "fetch", "wfetch", "--root", str(root), root=proj, timeout=120)
        assert proc.returncode == 0, fail_with(proc, "envport weights fetch")
        assert (root / "wfetch" / "model" / "model.ckpt").read_bytes() == PAYLOAD
        assert not Path(recipe_dir).exists(), "the recipe's absolute folder was written on this host"
    finally:
        server.shutdown()


def test_a_download_that_needs_the_image_stays_a_suggestion():
    # A script copied into the image does not exist where `fetch` runs; single quotes would not expand.
    assert pointed_at_weight_dir("bash /opt/tool/download_params.sh /data/af2", "/data/af2") is None
    assert pointed_at_weight_dir("wget -P '/w' https://h/x.pt", "/w") is None
    assert pointed_at_weight_dir("wget -P /w2 https://h/x.pt", "/w") is None  # another folder, not /w
    assert pointed_at_weight_dir('wget -O "/w/x.pt" https://h/x.pt', "/w") == 'wget -O "$ENVPORT_WEIGHT_DIR/x.pt" https://h/x.pt'
    assert pointed_at_weight_dir("curl -o /tmp/p.tar https://h/p.tar && tar -xf /tmp/p.tar -C /w && rm /tmp/p.tar",
                                 "/w") == 'curl -o /tmp/p.tar https://h/p.tar && tar -xf /tmp/p.tar -C "$ENVPORT_WEIGHT_DIR" && rm /tmp/p.tar'
