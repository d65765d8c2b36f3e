"""moto's server (Kinesis, SQS, S3, ...) in a thread of the test process, on loopback.

``ThreadedMotoServer`` binds 0.0.0.0 unless told otherwise, and ``verbose=False`` does not
quiet werkzeug's request log: both are set here. ``aws_env(url)`` is what a worker needs to
reach it: the local region and dummy credentials plus the per-service endpoint variables
botocore reads itself (not ``AWS_ENDPOINT_URL``, which would redirect DynamoDB too).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from moto.server import ThreadedMotoServer

from streamlease.dev import local_aws_env

SERVICES = ("KINESIS", "SQS", "S3")


@contextlib.contextmanager
def running() -> Iterator[str]:
    """Start the server on a free 127.0.0.1 port; yield its URL; stop it."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        assert host == "127.0.0.1", host
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def aws_env(url: str) -> dict[str, str]:
    env = local_aws_env()
    for service in SERVICES:
        env[f"AWS_ENDPOINT_URL_{service}"] = url
    return env
