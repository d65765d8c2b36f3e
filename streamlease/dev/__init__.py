"""Local stand-ins for development, tests, ``make run`` and the load test: an embedded
DynamoDB, the reference upstream, and the plumbing to run them as child processes."""

from __future__ import annotations


def local_aws_env(endpoint: str | None = None) -> dict[str, str]:
    """AWS settings for a local endpoint: a region and dummy credentials, no account."""
    env = {
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    if endpoint:
        env["AWS_ENDPOINT_URL_DYNAMODB"] = endpoint
    return env
