"""Settings for the whole suite: hypothesis keeps no example database, so one run says
nothing about the next, and under CI (``CI`` set, as `.ci/run` does) it is derandomized: each
test draws the same examples every time."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("dev", database=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
