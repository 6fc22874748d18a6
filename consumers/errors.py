"""What a failed upload means: permanent (retrying cannot help until someone
changes something) or transient (the same request may work later).

``classify(exc, sink)`` turns whatever a sink raised into a ``SinkFailure``:
a short code, a one-line detail, whether it is permanent, and what to do.
``comet ship --once`` fails at once on a permanent failure; every other
failure is retried with backoff (see ``Shipper.upload``).

    S3 (boto3)                                              directory sink (OSError)
    permanent: NoSuchBucket, AccessDenied, AllAccessDisabled,   permanent: EACCES, EPERM, ENOTDIR,
      AccountProblem, InvalidAccessKeyId,                         EISDIR, EEXIST (a file where a
      SignatureDoesNotMatch, InvalidToken, ExpiredToken,          directory belongs), EROFS,
      InvalidBucketName, AuthorizationHeaderMalformed,            ENAMETOOLONG, ELOOP, EINVAL
      PermanentRedirect, RequestTimeTooSkewed, any other 4xx;
      NoCredentialsError, PartialCredentialsError,
      ProfileNotFound, ParamValidationError (a bad
      bucket name), NoRegionError, UnknownEndpointError
    transient: SlowDown, Throttling*, RequestTimeout,           transient: ENOSPC, EDQUOT, EIO,
      InternalError, ServiceUnavailable, BadDigest,               ENOENT, EMFILE, ... every other
      OperationAborted, any 5xx, 408, 429; connection             errno, ConnectionError,
      errors and timeouts (EndpointConnectionError,               TimeoutError
      ReadTimeoutError, ...); CredentialRetrievalError

Anything else a sink raises is transient, unless it is a ``SinkError`` that
says otherwise (custom sinks raise that to classify their own failures).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_PERMANENT = 3
"""Exit status of ``comet ship`` after a permanent sink error (``--once``)."""
EXIT_RETRIES = 4
"""Exit status of ``comet ship`` after ``--max-retries`` failures of one upload."""

NOTHING_LOST = "nothing unstored was acknowledged, so a rerun ships it exactly once"


@dataclass(frozen=True)
class SinkFailure:
    permanent: bool
    code: str
    """Short name: an S3 error code, an errno name, or an exception type."""
    detail: str
    """One line from the error itself."""
    hint: str
    """What to do, as an imperative sentence without a final period."""

    @property
    def kind(self) -> str:
        return "permanent" if self.permanent else "transient"


class SinkError(Exception):
    """A sink failure that says itself whether it is permanent."""

    def __init__(self, message: str, *, permanent: bool, code: str = "SinkError",
                 hint: str = "") -> None:
        super().__init__(message)
        self.permanent = permanent
        self.code = code
        self.hint = hint


class ShipError(Exception):
    """The run gives up: a permanent failure with ``once``, or ``max_retries``
    exhausted.  ``str()`` is one line for an operator; ``exit_code`` is what
    ``comet ship`` exits with.  Nothing was acknowledged for the object."""

    def __init__(self, sink: str, failure: SinkFailure, *, attempts: int,
                 max_retries: int | None, key: str = "", action: str = "store objects in") -> None:
        self.sink = sink
        self.failure = failure
        self.attempts = attempts
        self.max_retries = max_retries
        self.key = key
        self.exit_code = EXIT_PERMANENT if max_retries is None else EXIT_RETRIES
        if max_retries is None:
            what = f"{failure.kind} error, not retried with --once"
        else:
            what = (f"{failure.kind} error, still failing after {attempts} attempts "
                    f"(--max-retries {max_retries})")
        super().__init__(f"comet ship: cannot {action} {sink}: {failure.code} "
                         f"({failure.detail}): {what}. {failure.hint[:1].upper()}{failure.hint[1:]}, "
                         f"then run again; "
                         f"{NOTHING_LOST}.")


def one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- S3 -------------------------------------------------------------------------------

S3_PERMANENT = {
    "NoSuchBucket": "create bucket {bucket} (or fix the bucket in the sink URL)",
    "AccessDenied": "allow s3:PutObject on arn:aws:s3:::{bucket}/{prefix}* for these credentials",
    "AllAccessDisabled": "the bucket {bucket} is disabled: use another bucket",
    "AccountProblem": "the account behind the credentials is blocked: check it with the provider",
    "InvalidAccessKeyId": "the store does not know this access key: check AWS_ACCESS_KEY_ID "
                          "(or the profile) and --endpoint-url",
    "SignatureDoesNotMatch": "the secret key does not match the access key: check "
                             "AWS_SECRET_ACCESS_KEY (or the profile)",
    "InvalidToken": "renew the session credentials (AWS_SESSION_TOKEN)",
    "ExpiredToken": "renew the session credentials (AWS_SESSION_TOKEN)",
    "TokenRefreshRequired": "renew the session credentials (AWS_SESSION_TOKEN)",
    "InvalidBucketName": "fix the bucket name in the sink URL",
    "AuthorizationHeaderMalformed": "set AWS_REGION to the bucket's region",
    "PermanentRedirect": "set AWS_REGION to the bucket's region (or fix --endpoint-url)",
    "IllegalLocationConstraintException": "set AWS_REGION to the bucket's region",
    "RequestTimeTooSkewed": "fix this machine's clock (NTP)",
    "EntityTooLarge": "lower --max-object-bytes",
}
S3_TRANSIENT = {
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "ProvisionedThroughputExceededException", "RequestTimeout",
    "RequestTimeoutException", "InternalError", "ServiceUnavailable", "BadDigest",
    "XAmzContentSHA256Mismatch", "OperationAborted", "PriorRequestNotComplete",
    "IDPCommunicationError", "EC2ThrottledException",
}
BOTO_PERMANENT = {
    "NoCredentialsError": "give this process credentials: AWS_ACCESS_KEY_ID and "
                          "AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE) or an instance role",
    "PartialCredentialsError": "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "ProfileNotFound": "fix AWS_PROFILE or the AWS config files",
    "ParamValidationError": "fix the sink URL (the bucket name is not valid)",
    "NoRegionError": "set AWS_REGION",
    "InvalidRegionError": "fix AWS_REGION",
    "UnknownEndpointError": "fix AWS_REGION or --endpoint-url",
    "InvalidConfigError": "fix the AWS config files",
    "InvalidS3AddressingStyleError": "fix the S3 addressing style in the AWS config",
}


def _botocore_failure(exc: BaseException, bucket: str, prefix: str) -> SinkFailure | None:
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return None
    fill = {"bucket": bucket or "?", "prefix": f"{prefix}/" if prefix else ""}
    if isinstance(exc, ClientError):
        response: dict[str, Any] = getattr(exc, "response", {}) or {}
        error = response.get("Error", {}) or {}
        code = str(error.get("Code") or "Unknown")
        status = int((response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode") or 0)
        detail = one_line(f"HTTP {status}: {error.get('Message') or code}" if status
                          else error.get("Message") or code)
        if code in S3_PERMANENT:
            return SinkFailure(True, code, detail, S3_PERMANENT[code].format(**fill))
        if code in S3_TRANSIENT or status >= 500 or status in (408, 429) or code.isdigit():
            return SinkFailure(False, code, detail, _transient_hint(code))
        if 400 <= status < 500:
            return SinkFailure(True, code, detail, "fix the request the store refuses "
                               "(bucket, credentials, permissions, region)")
        return SinkFailure(False, code, detail, _transient_hint(code))
    if isinstance(exc, BotoCoreError):
        name = type(exc).__name__
        for cls in type(exc).__mro__:
            if cls.__name__ in BOTO_PERMANENT:
                return SinkFailure(True, name, one_line(str(exc)), BOTO_PERMANENT[cls.__name__])
        return SinkFailure(False, name, one_line(str(exc)),
                           "check the network and the endpoint (--endpoint-url)")
    return None


def _transient_hint(code: str) -> str:
    if "throttl" in code.lower() or code in ("SlowDown", "RequestLimitExceeded",
                                             "TooManyRequestsException", "BandwidthLimitExceeded"):
        return "the store throttles requests: wait, ship larger objects, or raise --max-retries"
    return "check the store's health and the network"


# ---- directories ------------------------------------------------------------------

DIR_PERMANENT = {errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EEXIST,
                 errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL}


def _blocking_file(path: str) -> str:
    """The first component of ``path`` that exists and is not a directory."""
    p = Path(path)
    for parent in [*reversed(p.parents), p]:
        if parent.exists() and not parent.is_dir():
            return str(parent)
    return path


def _os_failure(exc: OSError, root: str | None) -> SinkFailure:
    code = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    where = exc.filename or root or "?"
    detail = one_line(f"{exc.strerror}: {where}" if exc.strerror else str(exc) or repr(exc))
    uid = os.geteuid() if hasattr(os, "geteuid") else "?"
    if exc.errno in (errno.EACCES, errno.EPERM):
        hint = (f"make {root or where} and the directories under it writable by uid {uid} "
                "(the user comet ship runs as), or ship to another directory")
    elif exc.errno in (errno.ENOTDIR, errno.EEXIST):
        hint = (f"{_blocking_file(str(where))} is a file where a directory belongs: move it "
                "or ship to another directory")
    elif exc.errno == errno.EROFS:
        hint = f"the filesystem of {root or where} is read-only: remount it read-write or ship elsewhere"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = f"free space (or quota) on the filesystem of {root or where}"
    elif exc.errno in DIR_PERMANENT:
        hint = f"fix the sink path {root or where}"
    else:
        hint = "check the sink's filesystem and the network"
    return SinkFailure(exc.errno in DIR_PERMANENT, code, detail, hint)


# ---- the classifier ---------------------------------------------------------------

def classify(exc: BaseException, sink: object = None) -> SinkFailure:
    """Permanent or transient, with what to do (see the module's table)."""
    if isinstance(exc, SinkError):
        return SinkFailure(exc.permanent, exc.code, one_line(str(exc)),
                           exc.hint or ("fix the sink" if exc.permanent else "check the sink"))
    custom = getattr(sink, "classify", None)
    if callable(custom):
        found = custom(exc)
        if isinstance(found, SinkFailure):
            return found
    bucket = str(getattr(sink, "bucket", "") or "")
    prefix = str(getattr(sink, "prefix", "") or "")
    failure = _botocore_failure(exc, bucket, prefix)
    if failure is not None:
        return failure
    if isinstance(exc, OSError):
        root = getattr(sink, "root", None)
        return _os_failure(exc, str(root) if root is not None else None)
    return SinkFailure(False, type(exc).__name__, one_line(str(exc) or repr(exc)),
                       "check the sink")

