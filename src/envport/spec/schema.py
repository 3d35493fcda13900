"""The spec's JSON Schema, for editors (yaml-language-server) and for docs."""

from __future__ import annotations

import json
from pathlib import Path

from envport.spec.model import Spec

SCHEMA_PATH = Path("docs") / "spec.schema.json"


def schema_text() -> str:
    schema = Spec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://envport.dev/spec.schema.json"
    schema["title"] = "envport env spec"
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
