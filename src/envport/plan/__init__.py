"""The plan: a spec as the ordered list of typed steps every renderer consumes.

The renderers (top-level renderers/) import their vocabulary from here.  Their
source is digested into RENDERER_VERSION, which feeds every env's content hash,
so this name stays stable across moves inside the package.
"""

from envport.plan.steps import PipStep, Plan, step_marker

__all__ = ["Plan", "PipStep", "step_marker"]
