"""The pytest plugin that turns a spec's checks into test items.

The spec file itself is the collected "file": each check becomes one item
named by its id, so pytest, JUnit and `-k` all read
`specs/demo-cpu.yaml::pip[torch==2.13.0]`.  User tests under tests/images/
run in the same session against the same env through testinfra's `host`
fixture; they may also use the fixtures below, and restrict themselves to
some envs with `@pytest.mark.envport_env("demo-cpu", ...)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pytest

from envport.verify.checks import Check, CheckFailed, CheckSkipped, Facts, judge

MARKER = "envport_env"


class SpecItem(pytest.Item):
    def __init__(self, *, check: Check, plugin: "VerifyPlugin", **kwargs):
        super().__init__(**kwargs)
        self.check = check
        self.plugin = plugin

    def runtest(self) -> None:
        try:
            self.plugin.seen[self.check.id] = judge(self.check, self.plugin.facts())
        except CheckSkipped as exc:
            pytest.skip(str(exc))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.check.id


class SpecFile(pytest.File):
    def __init__(self, *, plugin: "VerifyPlugin", **kwargs):
        super().__init__(**kwargs)
        self.plugin = plugin

    def collect(self):
        for check in self.plugin.checks:
            yield SpecItem.from_parent(self, name=check.id, check=check, plugin=self.plugin)


class VerifyPlugin:
    """Registered with `pytest.main(..., plugins=[VerifyPlugin(...)])`."""

    def __init__(self, *, spec, spec_path: Path, checks: list[Check], make_facts: Callable[[], Facts],
                 image: Optional[str] = None, on_result: Optional[Callable[[dict], None]] = None):
        self.spec = spec
        self.spec_path = Path(spec_path).resolve()
        self.checks = checks
        self._make_facts = make_facts
        self._facts: Optional[Facts] = None
        self.image = image
        self.on_result = on_result
        self.results: list[dict] = []
        self.seen: dict[str, str] = {}
        self.spec_nodeid = "\0"  # set when the spec file is collected

    def facts(self) -> Facts:
        if self._facts is None:
            self._facts = self._make_facts()
        return self._facts

    # --- hooks ---------------------------------------------------------------

    def pytest_configure(self, config) -> None:
        config.addinivalue_line("markers", f"{MARKER}(*names): run this image test only against these envs")

    def pytest_collect_file(self, file_path: Path, parent):
        if Path(file_path).resolve() == self.spec_path:
            node = SpecFile.from_parent(parent, path=Path(file_path), plugin=self)
            self.spec_nodeid = node.nodeid
            return node
        return None

    def pytest_collection_modifyitems(self, config, items) -> None:
        keep, drop = [], []
        for item in items:
            mark = item.get_closest_marker(MARKER)
            (drop if mark and self.spec.name not in mark.args else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            spec_item = report.nodeid.startswith(f"{self.spec_nodeid}::")
            item_id = report.nodeid.split("::", 1)[1] if spec_item else report.nodeid
            outcome = report.outcome if report.when == "call" or report.skipped else "error"
            message = ""
            if report.skipped and isinstance(report.longrepr, tuple):
                message = str(report.longrepr[2]).removeprefix("Skipped: ")
            elif not report.passed:
                crash = getattr(report.longrepr, "reprcrash", None)
                message = crash.message if crash is not None else report.longreprtext.strip().splitlines()[-1:]
                message = message if isinstance(message, str) else " ".join(message)
            rec = {"id": item_id, "nodeid": report.nodeid, "outcome": outcome, "message": message.strip(),
                   "seconds": round(report.duration, 3)}
            if not spec_item:
                rec["user_test"] = True
            self.results.append(rec)
            if self.on_result:
                self.on_result(rec)

    # --- fixtures for user tests --------------------------------------------

    @pytest.fixture
    def envport_spec(self):
        """The resolved Spec being verified."""
        return self.spec

    @pytest.fixture
    def envport_name(self) -> str:
        return self.spec.name

    @pytest.fixture
    def envport_image(self) -> Optional[str]:
        return self.image
