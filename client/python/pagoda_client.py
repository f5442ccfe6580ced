"""The module name of earlier releases: everything is in the `pagoda` package now."""
from pagoda import *  # noqa: F401,F403
from pagoda import import_stubs  # noqa: F401
