"""Model weights downloaded during a build: recognised by shape, dropped, and suggested as a weight_dirs
entry whose `source` fetches them at run time (porting/weights.py promotes the pinned ones)."""

from __future__ import annotations

import posixpath
import re
from typing import Optional

from envport.porting.report import DROPPED
from envport.porting.shell.context import Outcome, ShellContext

# A weight file by its extension, at the end of a word (a URL, an -o target), not only of the line.
WEIGHT_FILE = re.compile(r"\.(pt|pth|ckpt|safetensors|bin|h5|onnx|gguf|npz|msgpack|pb|tflite|params)"
                         r"(\?\S*)?(?=$|[\s'\";|&)])", re.I)
# An archive whose name says what it holds: alphafold_params_2022-12-06.tar, weights.tar.gz, checkpoints.zip.
WEIGHT_ARCHIVE = re.compile(r"[\w.-]*(params|weights?|checkpoints?|ckpts?|models?)[\w.-]*"
                            r"\.(tar(\.(gz|bz2|xz|zst))?|tgz|zip)(?=$|[\s'\";|&)?])", re.I)
WEIGHT_HINT = re.compile(r"huggingface\.co|zenodo\.org|/(weights?|models?|checkpoints?)(/|$)|\bhf_hub|"
                         r"from_pretrained|snapshot_download|hf_hub_download|torch\.hub\.load|"
                         # hosts that serve model weights: ESM and fairseq, RoseTTAFold, AlphaFold's params,
                         # torchvision's, NGC's model registry
                         r"dl\.fbaipublicfiles\.com|files\.ipd\.uw\.edu|storage\.googleapis\.com/alphafold|"
                         r"download\.pytorch\.org/models|api\.ngc\.nvidia\.com", re.I)
# A model's own downloader (transformers, the HF hub, torch.hub, a tool's `download-models`).
MODEL_DOWNLOADER = re.compile(r"from_pretrained|snapshot_download|hf_hub_download|torch\.hub\.load|"
                              r"download[-_]?models?\b|install[-_]models\b|fetch[-_]weights|"
                              # download_alphafold_params.sh, download-weights, download_checkpoints.py
                              r"download[-_]\w*?(params|weights?|checkpoints?|models?)\b|"
                              # a tool's downloader module: python -m colabfold.download DIR
                              r"(^|\s)-m\s+[\w.]+\.download(_\w+)?(\s|$)", re.I)
# What unpacks or tidies a download in the same RUN: it belongs to the download's `source`, not the image.
UNPACK = {"tar", "unzip", "gunzip", "zstd", "rm", "mv"}


def weights_family(words, seg, line, ctx) -> Optional[Outcome]:
    """Model weights downloaded during the build: dropped, suggested as weight_dirs fetched at run time."""
    cmd = posixpath.basename(words[0])
    sub = words[1] if len(words) > 1 else ""
    hub = cmd in ("huggingface-cli", "hf") and sub == "download"
    fetch = cmd in ("wget", "curl") and weighty(seg)
    if not (hub or fetch or MODEL_DOWNLOADER.search(seg)):
        return None
    ctx.note(line, seg, DROPPED, "downloads model weights during the build; envport never bakes weights",
             "see its weight_dirs entry in the spec (commented out where its command cannot write to "
             "$ENVPORT_WEIGHT_DIR): once its files are pinned, `envport weights fetch` runs that `source` at run time")
    suggest_weights(seg, ctx)
    return Outcome.DONE


def weighty(text: str) -> bool:
    """A download that fetches model weights, by shape: a weight file, a weights archive, a known host."""
    return bool(WEIGHT_FILE.search(text) or WEIGHT_ARCHIVE.search(text) or WEIGHT_HINT.search(text))


def suggest_weights(text: str, ctx: ShellContext) -> None:
    path, name = _weight_target(text, ctx), _weight_name(text)
    entry = {"path": path if path and path != "/" else f"/weights/{name}"}
    if not path and re.search(r"huggingface|from_pretrained|snapshot_download|hf_hub_download|\bhf\s", text):
        entry["env"] = "HF_HOME"  # the hub's cache: the downloader and the tool both look there
    entry["source"] = text
    ctx.draft.suggested_weights.append((name, entry))


def _weight_target(text: str, ctx: ShellContext) -> str:
    """Where the weights land: an unpack's -C/-d folder (the archive itself is transient), a download's
    folder option, an output file's folder, or a downloader's one absolute folder argument."""
    found = (re.search(r"\s(-C|--directory|-d)[ =](\S+)", text)
             or re.search(r"(-P|--directory-prefix|--local-dir|--cache-dir)[ =](\S+)", text)
             or re.search(r"(-O|-o|--output)[ =](\S+)", text))
    target = found.group(2).strip("'\"") if found else ""
    if target and found.group(1) in ("-O", "-o", "--output"):
        target = posixpath.dirname(target)
    if not target and not re.search(r"https?://", text):
        folders = [w for w in text.split() if w.startswith("/") and not WEIGHT_FILE.search(w)]
        target = folders[-1].strip("'\"") if folders else ""
    if target and not target.startswith("/"):
        target = posixpath.normpath(posixpath.join(ctx.cwd, target))
    return target


def _weight_name(text: str) -> str:
    url = re.search(r"(https?://\S+)", text)
    repo = re.search(r"download\s+([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)", text) or \
        re.search(r"(?:from_pretrained|snapshot_download|hf_hub_download)\(\s*(?:repo_id=)?['\"]([^'\"]+)['\"]", text)
    module = re.search(r"-m\s+([\w]+)[\w.]*\.download", text)
    script = re.search(r"([\w-]*download[\w-]*)\.(sh|py)\b", text)
    stem = (repo.group(1).split("/")[-1] if repo else
            url.group(1).rstrip("/").rsplit("/", 1)[-1].split("?")[0] if url else
            module.group(1) if module else script.group(1) if script else "weights")
    return re.sub(r"[^a-z0-9-]+", "-", stem.lower().split(".")[0]).strip("-")[:40] or "weights"
