"""S3 URIs, as every backend that reads or writes S3 checks them (SageMaker; local and Docker
jobs that stage a SageMaker notebook's S3 channels): a module of its own so no backend imports
another backend's package for it."""

from __future__ import annotations

import re
from typing import Any

from meshtrain.contract.errors import ConfigError

BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
MAX_URI = 1024  # SageMaker's limit on an S3 URI


def parse_s3_uri(uri: Any, what: str) -> tuple[str, str]:
    """(bucket, key) of an ``s3://bucket/key`` URI, or a ConfigError naming `what`."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        fix = " File URIs work in local mode only." if str(uri).startswith("file://") else ""
        raise ConfigError(f"{what}={uri!r} must be an S3 URI such as 's3://my-bucket/data/'."
                          f"{fix} Upload the data to S3 first.")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not BUCKET.match(bucket) or ".." in bucket:
        raise ConfigError(f"{what}={uri!r}: {bucket!r} is not a valid S3 bucket name (3-63 "
                          "lower-case letters, digits, '.' and '-').")
    if len(uri) > MAX_URI:
        raise ConfigError(f"{what} is {len(uri)} characters long; SageMaker allows {MAX_URI}.")
    return bucket, key
