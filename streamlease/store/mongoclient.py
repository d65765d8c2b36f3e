"""What building a pymongo client shares between the MongoDB leader backend and the
mongodb:// sink (no I/O here: building a client dials nothing)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

#: The driver's notices about the server it is given, which are not a fault of the URL:
#: Amazon DocumentDB and Azure Cosmos DB hosts are served as MongoDB-compatible.
NOTICES = (r"You appear to be connected to a (DocumentDB|CosmosDB) cluster",)


@contextlib.contextmanager
def driver_warnings() -> Iterator[None]:
    """Warnings raised as errors while a client is built: the driver only warns about an
    option it cannot use, and goes on without it, where a worker must refuse the URL.
    Its notices about DocumentDB and Cosmos DB hosts are let through."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for notice in NOTICES:
            warnings.filterwarnings("ignore", message=notice)
        yield
