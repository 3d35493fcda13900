"""What a new build changed since the env it replaces, from this machine's ledger (issue 27 row 6).

`envport build` calls it on its last step's result: it finds the old build's record (the one a venv/conda
script replaced in place, else the target's last good build of another hash) and adds the spec fields and
distributions that moved (plan/changes.py) to the step's lines and data.
"""

from __future__ import annotations


def what_changed(target, root, loaded, site, identity, lock_fact, result):
    """Name what a new build changed since the env it replaces (venv, conda: the one the script found at the
    env's place) or, for an image or SIF made beside the old ones, since this target's last good build: the
    spec fields and distributions, old -> new, as this machine's ledger recorded that build.  Adds them to
    RESULT's lines and data; returns the {name: version} the ledger keeps for this build (None: not known)."""
    from envport.core.verdict import Verdict
    from envport.plan.changes import dist_lines, spec_lines
    from envport.plan.lock import load_for, lock_path
    from envport.report import ledger

    if not result.verdict.ok:
        return None
    dists = target.built_dists(result)
    if dists is None and lock_fact == lock_path(loaded).name:
        lock = load_for(loaded)
        dists = {n: d.version for n, d in lock.final().items()} if lock else None
    if result.verdict is not Verdict.OK:
        return dists  # present: nothing was built
    name, replaced, ssh_host = loaded.spec.name, result.data.get("replaced"), result.data.get("ssh_host")
    records = ledger.read(root, name, getattr(site, "ledger_dir", None))
    if replaced:
        old = ledger.previous_build(records, target.name, ssh_host=ssh_host, hash_prefix=replaced)
    elif not target.replaces_in_place:
        old = ledger.previous_build(records, target.name, ssh_host=ssh_host, other_than=identity.hash)
    else:
        return dists  # a first build: nothing replaced
    if old is None:
        if replaced:
            result.lines.append(f"replaced {name}@{replaced}: what changed is not known (this machine's ledger "
                                "has no good build of it)")
        return dists
    was = str(old["hash"])[:12]
    fields = spec_lines(old["spec"], loaded.spec.model_dump(mode="json")) if isinstance(old.get("spec"), dict) \
        else None
    moved = dist_lines(old["dists"], dists) if isinstance(old.get("dists"), dict) and dists is not None else None
    result.lines.append(f"changed since {name}@{was} (built {old.get('when', '?')}, this machine's ledger): "
                        + ("spec fields not recorded with that build" if fields is None else
                           f"{len(fields)} spec field(s)") + ", "
                        + ("distributions not compared (not recorded for both)" if moved is None else
                           f"{len(moved)} distribution(s)"))
    if fields == []:
        result.lines.append("spec fields unchanged: the hash moved with shim file bytes, the lock, the renderer "
                            "or the site profile")
    result.lines += [f"spec {ln}" for ln in fields or []] + [f"package {ln}" for ln in moved or []]
    result.data["changes"] = {"since": old["hash"], "spec": fields, "distributions": moved}
    return dists
