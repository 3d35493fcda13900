"""`envport rebuild-check FILE.sif`: rebuild a SIF from the spec and lock it embeds; same sha256 or not."""

from __future__ import annotations

from pathlib import Path

from envport.commands._common import add_json_arg, root_or_here


def register(sub) -> None:
    p = sub.add_parser(
        "rebuild-check", help="rebuild a SIF from the spec and lock it embeds, from nothing, and say whether "
        "the sha256 is the same (and which objects and files differ when not)",
        description="Trust a SIF without trusting its builder: read the spec it embeds (envport-spec.json), "
        "take the shim files and the lock from this project's specs/ and the site profile the SIF names from "
        "sites/ (--site to choose), check they hash to the SIF's envport hash (else exit 3, inputs_differ), "
        "then build it with envport's own .def builder in a temporary project, from nothing (no phase cache), "
        "with SOURCE_DATE_EPOCH set to the SIF's created time, and compare. Same bytes: exit 0. Different: "
        "exit 1 (not_reproducible), naming the header fields, the objects (Def.FILE, the JSON objects, the "
        "partition, the SBOM) and the files in the partition that differ. Exit 3: no embedded spec "
        "(no_embedded_spec: a SIF apptainer built), inputs_differ, or this host cannot build a SIF (not_root, "
        "missing_tool); 2: bad arguments or an unknown site. The rebuild takes as long as a cold build.")
    p.add_argument("sif", metavar="FILE.sif")
    p.add_argument("--site", default=None, metavar="NAME|FILE",
                   help="site profile to rebuild for (default: the one the SIF says it was built for)")
    p.add_argument("--work-dir", default=None, metavar="DIR",
                   help="where the temporary project goes (default: the system's temp dir); removed after")
    add_json_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from envport.builders.apptainer.rebuild import rebuild_check
    from envport.core.untrusted import shown
    from envport.core.verdict import envelope, exit_code, print_json

    sif = Path(args.sif)
    result = rebuild_check(sif, root_or_here(args), args.site, lambda line: print(line, file=sys.stderr),
                           Path(args.work_dir) if args.work_dir else None)
    code = exit_code(result.steps)
    if args.json:
        print_json(envelope("rebuild-check", code, result.steps, sif=str(sif), sha256=result.original,
                            rebuilt_sha256=result.rebuilt or None))
        return code
    for step in result.steps:
        print(shown(step.line()))
        for line in step.lines:
            print("  " + shown(line))
    return code
