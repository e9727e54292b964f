"""`longhaul-cpp soak`: llama-server in longhaul mode under long mixed traffic (run.py), the traffic (clients.py),
the injected read faults (eio_shim.py) and the verdict (report.py)."""
from .report import text
from .run import SoakConfig, run_soak

__all__ = ["SoakConfig", "run_soak", "text"]
