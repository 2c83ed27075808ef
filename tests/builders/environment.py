"""What many test modules share: the CEL environment and the admission tests' clock.

``ENV`` is the environment the policy loader builds (the Kubernetes CEL libraries and gpuguard's
``gpu`` functions), built once for the whole run instead of once per module; ``ADMISSION_NOW`` the
fixed "now" of admission and engine tests (request times, exception expiry), so that no test
depends on the day it runs.
"""

from __future__ import annotations

import datetime

from policies.cel.gpu import GPU_LIBRARY
from policies.cel.runtime import CelEnvironment

ENV = CelEnvironment(GPU_LIBRARY)
ADMISSION_NOW = datetime.datetime(2026, 11, 29, 12, 0, tzinfo=datetime.UTC)
