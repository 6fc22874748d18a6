"""Where an S3 object store is and how every client of it is configured.

Three libraries talk to S3 in this project: boto3 (``comet ship``'s sink, the lake's
lock), pyarrow's S3FileSystem (the lake's files) and delta-rs (the lake's
Delta log).  Each reads the AWS settings its own way; this module reads them
once, by the AWS SDKs' rule, into an ``S3Location``, and each ``*_for``
function below hands that one reading to one library:

- endpoint: the caller's (``--endpoint-url``), else ``AWS_ENDPOINT_URL_S3``,
  else ``AWS_ENDPOINT_URL``, else the AWS profile's (its ``services``
  section's ``s3`` ``endpoint_url``, else its ``endpoint_url``), else AWS's
  own; ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`` skips the environment and
  the profile;
- region: the caller's, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``,
  else the AWS profile's ``region``, else ``us-east-1``;
- credentials: the caller's keys, else each library's own default chain
  (the environment; boto3's also the AWS config files and instance roles),
  which renews credentials that expire;
- attempts per request: ``AWS_MAX_ATTEMPTS``, else 3; connections time out
  after 5 s and requests after 60 s, so an unreachable store is an error
  within seconds, not a hang.

The profile is ``AWS_PROFILE``'s (else ``default``) in the AWS config files,
read through botocore, which is imported only when the environment leaves a
setting open.  An ``S3Location`` is a small picklable value, not a
connection: Spark ships it to its tasks, which build their own clients.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import pyarrow.fs
    from mypy_boto3_s3 import S3Client

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
DEFAULT_REGION = "us-east-1"
DEFAULT_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 5
REQUEST_TIMEOUT_S = 60
ENDPOINT_OPTION_HELP = ("S3 endpoint (default: $AWS_ENDPOINT_URL_S3, else $AWS_ENDPOINT_URL, "
                        "else the AWS profile's, else AWS's).")


@dataclass(frozen=True)
class S3Location:
    """A bucket and key prefix, and how to reach the store that holds them.

    ``endpoint_url`` None: AWS's own endpoint for ``region``.  ``access_key``
    None: each client finds credentials by its default chain."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str = DEFAULT_REGION
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    attempts: int = DEFAULT_ATTEMPTS


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` as (bucket, prefix without slashes at either end)."""
    parsed = urlsplit(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"{url}: not an s3://bucket/prefix URL")
    return parsed.netloc, parsed.path.strip("/")


def s3_location(url: str, *, endpoint_url: str | None = None, region: str | None = None,
                access_key: str | None = None, secret_key: str | None = None,
                session_token: str | None = None) -> S3Location:
    """The store of ``s3://bucket/prefix``, by the rule above: what the caller
    gives wins, then the environment, then the AWS profile."""
    bucket, prefix = split_s3_url(url)
    return S3Location(bucket, prefix, endpoint_url=endpoint_url or _configured_endpoint(),
                      region=region or _configured_region(), access_key=access_key or None,
                      secret_key=secret_key if access_key else None,
                      session_token=session_token if access_key else None,
                      attempts=_configured_attempts())


def _configured_endpoint() -> str | None:
    """The endpoint the environment or the AWS profile names (None: AWS's own)."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return None
    for name in ENDPOINT_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    profile = _aws_profile()
    service = profile.get("services_s3", {})
    return service.get("endpoint_url") or profile.get("endpoint_url") or None


def _configured_region() -> str:
    for name in REGION_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return str(_aws_profile().get("region") or DEFAULT_REGION)


def _configured_attempts() -> int:
    """``AWS_MAX_ATTEMPTS`` (attempts in all, the first included), else 3."""
    try:
        return max(1, int(os.environ.get("AWS_MAX_ATTEMPTS") or DEFAULT_ATTEMPTS))
    except ValueError:
        return DEFAULT_ATTEMPTS


def _aws_profile() -> Mapping[str, Any]:
    """The settings of the AWS profile in use, its ``services`` section's
    ``s3`` settings as ``services_s3``; empty when there are no config files.
    A profile that does not exist reads as empty here: boto3 names that error
    itself when it builds a client."""
    from botocore.exceptions import BotoCoreError
    from botocore.session import Session

    session = Session()
    try:
        profile = dict(session.get_scoped_config())
        services = session.full_config.get("services", {}).get(profile.get("services", ""), {})
    except BotoCoreError:
        return {}
    return {**profile, "services_s3": services.get("s3", {})}


def boto3_client_for(location: S3Location) -> S3Client:
    """A boto3 S3 client for the location's store."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=REQUEST_TIMEOUT_S,
                    retries={"total_max_attempts": location.attempts})
    return boto3.client("s3", endpoint_url=location.endpoint_url, region_name=location.region,
                        aws_access_key_id=location.access_key,
                        aws_secret_access_key=location.secret_key,
                        aws_session_token=location.session_token, config=config)


def pyarrow_filesystem_for(location: S3Location) -> pyarrow.fs.S3FileSystem:
    """pyarrow's S3 filesystem for the location's store (paths: ``bucket/key``)."""
    import pyarrow.fs as pafs

    options: dict[str, Any] = {  # S3FileSystem's options, of several types
        "region": location.region,
        "connect_timeout": float(CONNECT_TIMEOUT_S),
        "request_timeout": float(REQUEST_TIMEOUT_S),
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=location.attempts),
    }
    if location.access_key:
        options.update(access_key=location.access_key, secret_key=location.secret_key or "",
                       session_token=location.session_token)
    if location.endpoint_url:
        parsed = urlsplit(location.endpoint_url)
        options["endpoint_override"] = parsed.netloc or parsed.path
        options["scheme"] = parsed.scheme or "https"
    return pafs.S3FileSystem(**options)


def delta_storage_options_for(location: S3Location) -> dict[str, str]:
    """delta-rs's ``storage_options`` for the location's store."""
    options = {"AWS_REGION": location.region, "connect_timeout": f"{CONNECT_TIMEOUT_S}s",
               "timeout": f"{REQUEST_TIMEOUT_S}s", "max_retries": str(location.attempts - 1)}
    if location.endpoint_url:
        options["AWS_ENDPOINT_URL"] = location.endpoint_url
        if location.endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if location.access_key:
        options["AWS_ACCESS_KEY_ID"] = location.access_key
        options["AWS_SECRET_ACCESS_KEY"] = location.secret_key or ""
        if location.session_token:
            options["AWS_SESSION_TOKEN"] = location.session_token
    return options
