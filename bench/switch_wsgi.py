"""bench/http_ab.py's "sw=S" contender: the appliance's WSGI app in workers whose
interpreter hands the GIL on after S seconds (sys.setswitchinterval) instead of CPython's
5 ms; nothing else differs. S comes from WEIR_BENCH_SWITCH_S, set by http_ab.py."""
from __future__ import annotations

import os
import sys

sys.setswitchinterval(float(os.environ["WEIR_BENCH_SWITCH_S"]))

from appliance.wsgi import application  # noqa: E402 - in workers that switch so

__all__ = ["application"]
