"""Flags in a recipe that turn a check off (package signatures, TLS): never carried into a spec, always named.

A recipe that passed `--allow-unauthenticated` installed packages whose signatures apt did not check; an
import that silently drops the flag hides that the original env was built that way, and one that kept it
would carry the hole into every target.  So each flag is kept out of the spec and named as a `security` note.
"""

from __future__ import annotations

from envport.porting.report import SECURITY

APT_UNSIGNED = ("apt installed packages without checking their signatures: anyone between the build and the "
                "mirror could have served them", "drop it; if a repository is unsigned, add its key (signed-by=) in a "
                "run command, or serve it from a signed mirror")
FLAGS = {
    "apt": {
        "--allow-unauthenticated": APT_UNSIGNED,
        "--allow-insecure-repositories": ("apt read repositories whose Release files are unsigned or missing: "
                                          "their package lists could be anyone's", APT_UNSIGNED[1]),
        "--force-yes": APT_UNSIGNED,
    },
    "pip": {
        "--trusted-host": ("pip accepted any certificate (or plain http) from that host: anyone on the path could "
                           "serve the packages", "trust the host's CA through a site profile's CA bundle instead "
                           "(`ca_bundle:`), and give the index as https"),
    },
}


def insecure_flags(family: str, words: list[str]) -> list[tuple[str, str, str]]:
    """(flag as written, why, fix) for each check-disabling flag in WORDS of a FAMILY ("apt", "pip") command."""
    table, out = FLAGS[family], []
    for i, word in enumerate(words):
        flag = word.split("=", 1)[0]
        if flag in table:
            value = word.split("=", 1)[1] if "=" in word else ""
            if family == "pip" and not value and i + 1 < len(words):
                value = words[i + 1]
            out.append((f"{flag} {value}".strip(), *table[flag]))
    return out


def note_insecure(draft, family: str, words: list[str], line, file) -> None:
    for written, why, fix in insecure_flags(family, words):
        draft.note(line, written, SECURITY, why, fix, file=file)
