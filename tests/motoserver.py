"""moto's server (Kinesis, SQS, S3, ...) in a thread of the test process, on loopback.

moto's models are not safe under concurrent requests: a Kinesis shard numbers a record by
reading its highest sequence number and then storing under the next one, so two
``PutRecords`` served at once by the threaded server can take the same number and the
second silently replaces the first (a record lost that no worker lost). The server here
serves one request at a time (``SerializedApp``, as the embedded DynamoDB does), so an
audit of what reached the destination measures the workers, not moto.

It binds 127.0.0.1 and keeps werkzeug's request log quiet. ``aws_env(url)`` is what a
worker needs to reach it: the local region and dummy credentials plus the per-service
endpoint variables botocore reads itself (not ``AWS_ENDPOINT_URL``, which would redirect
DynamoDB too).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

from streamlease.dev import local_aws_env
from streamlease.dev.dynamodb import SerializedApp

SERVICES = ("KINESIS", "SQS", "S3")


@contextlib.contextmanager
def running() -> Iterator[str]:
    """Start the server on a free 127.0.0.1 port; yield its URL; stop it."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = SerializedApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    server.daemon_threads = True  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="moto-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def aws_env(url: str) -> dict[str, str]:
    env = local_aws_env()
    for service in SERVICES:
        env[f"AWS_ENDPOINT_URL_{service}"] = url
    return env
