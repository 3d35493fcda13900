"""`envport show`: the resolved spec, its content hash and what fed the hash."""

from __future__ import annotations

import json

from envport.commands._common import load_one, project_root


def register(sub) -> None:
    p = sub.add_parser("show", help="print the resolved spec, its hash and the hash inputs",
                       description="Print a spec after `extends` merging, the identity `envport build` gives it "
                       "on the site (which names every built artefact), the portable identity of images/ "
                       "(labelled as such) and the inputs that fed the hash.")
    p.add_argument("spec", metavar="NAME|PATH")
    p.add_argument("--site", default=None, metavar="NAME|FILE",
                   help="the site profile whose build hash is shown beside the portable one (default: local)")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    import yaml

    from envport.plan.site import load_site
    from envport.recipe.identity import hash_inputs, portable, resolve, site_differences

    loaded = load_one(args, args.spec)
    identity = portable(loaded)
    site = load_site(args.site, project_root(args))
    built = resolve(loaded, site, "docker").identity
    data = {
        "name": identity.name,
        "hash": identity.hash,
        "hash12": identity.hash12,
        "files": [str(p) for p in loaded.chain],
        "spec": loaded.spec.model_dump(mode="json"),
        "hash_inputs": hash_inputs(loaded),
        "site": {"name": site.name, "hash": built.hash, "key": built.key, "image": built.image_tag,
                 "sif": built.sif_name, "differs_by": site_differences(loaded, site)},
    }
    if args.json:
        print(json.dumps({"command": "show", "exit_code": 0, "steps": [], "problems": [], **data},
                         indent=2, ensure_ascii=False))
        return 0
    # The identity `envport build` uses comes first; the portable one is labelled (issue 27 row 9).
    print(f"# built on site {site.name}: {built.ref}  (image {built.image_tag}, {built.sif_name}, "
          "the venv's recorded hash and the ledger key all use it)")
    print(f"# portable (images/, no site; not what `envport build` names): {identity.ref}  (sha256 {identity.hash})")
    for line in data["site"]["differs_by"] or ["the site adds nothing to the recipe: the two hashes are equal"]:
        print(f"#   {line}")
    print(f"# from: {', '.join(data['files'])}")
    print(yaml.safe_dump({"spec": data["spec"], "hash_inputs": data["hash_inputs"]},
                         sort_keys=False, allow_unicode=True), end="")
    return 0
