"""`envport show`: the resolved spec, its content hash and what fed the hash."""

from __future__ import annotations

import json

from ._common import load_one, project_root


def register(sub) -> None:
    p = sub.add_parser("show", help="print the resolved spec, its hash and the hash inputs",
                       description="Print a spec after `extends` merging, its content hash (which names "
                       "every built artefact) and the inputs that fed the hash.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--site", default=None,
                   help="also show the hash as this site builds it (the name of its docker image and .sif)")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    import yaml

    from ..hashing import content_hash, hash_inputs
    from ..site import load_site

    loaded = load_one(args, args.spec)
    data = {
        "name": loaded.spec.name,
        "hash": loaded.hash,
        "hash12": loaded.hash12,
        "files": [str(p) for p in loaded.chain],
        "spec": loaded.spec.model_dump(mode="json"),
        "hash_inputs": hash_inputs(loaded),
    }
    if args.site:
        site = load_site(args.site, project_root(args))
        data["site"] = {"name": site.name, "hash": content_hash(loaded, site)}
    if args.json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(f"# {data['name']}@{data['hash12']}  (sha256 {data['hash']})")
        print(f"# from: {', '.join(data['files'])}")
        if "site" in data:
            print(f"# built on site {data['site']['name']}: {data['name']}@{data['site']['hash'][:12]} "
                  "(the site's CA bundle, pip sources and base rewrites enter the hash)")
        print(yaml.safe_dump({"spec": data["spec"], "hash_inputs": data["hash_inputs"]},
                             sort_keys=False, allow_unicode=True), end="")
    return 0
