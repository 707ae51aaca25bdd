"""pipetrain - a Python client of pipeserver (schema/api.fbs over nng).

    import pipetrain
    with pipetrain.Client("tcp://127.0.0.1:7600") as c:
        job = c.submit("examples/digits.json")
        for p in c.watch(job):
            print(p["step"], p["loss"])
        print(c.get(job)["state"])
        c.fetch_checkpoint(job, "digits.safetensors")

The modules named after schema types (pipetrain.Request, pipetrain.JobSpec,
...) are flatc's generated code (client/python/gen.py).
"""
import importlib as _importlib
import pkgutil as _pkgutil

from . import _schema


def _link_generated():
    """flatc 2.0.8's generated accessors name classes their module does not
    import (JobInfo.Last returns a MetricPoint, JobInfoT._UnPack makes a
    MetricPointT, ResponseT.InitFromObj calls ResponseBodyCreator): give
    each generated module every generated class and union creator."""
    names = set(_schema.TABLES) | set(_schema.ENUMS)
    mods = [_importlib.import_module(__name__ + "." + m.name)
            for m in _pkgutil.iter_modules(__path__) if m.name in names]
    classes = {k: v for m in mods for k, v in vars(m).items()
               if getattr(v, "__module__", None) == m.__name__ and
               (isinstance(v, type) or (callable(v) and k.endswith("Creator")))}
    for m in mods:
        for k, v in classes.items():
            if not hasattr(m, k):
                setattr(m, k, v)


_link_generated()

from .client import Client, load_job  # noqa: E402
from .errors import (BadRequest, ChecksumError, Conflict, ConnectError, Internal,  # noqa: E402
                     InvalidJob, NotFound, PipetrainError, ProtocolError, ServerError,
                     Timeout, Unauthorized, Unavailable)

__version__ = "0.1.0"
__all__ = ["Client", "load_job", "PipetrainError", "ConnectError", "Timeout",
           "ProtocolError", "ChecksumError", "ServerError", "BadRequest", "Unauthorized",
           "InvalidJob", "NotFound", "Conflict", "Unavailable", "Internal"]
