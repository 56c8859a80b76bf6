"""S3-compatible object stores (AWS S3, MinIO, Ceph RGW, ...) through boto3.

Config (a source's `config` JSON; the schema, defaults and validation are kdbl_core.sources.config):
  bucket        required
  prefix        optional; treated as a folder ("docs" lists "docs/..." only, never "docs2/...")
  endpoint_url  optional; a custom endpoint (MinIO, RGW); no user:password in it
  region        default "us-east-1"
  path_style    default true when endpoint_url is set (what MinIO and RGW expect), else virtual-host style
  credentials   a reference, never a value: {"env": {"access_key_id": VAR, "secret_access_key": VAR,
                "session_token": VAR}}, {"dir": "/var/run/secrets/kdbl/<source>"} (one file per name), or
                {"anonymous": true} for public buckets; absent: boto3's default chain (env, profile,
                IRSA, IMDS)
  verify_tls    default true; ca_file: a CA bundle for a private endpoint
  max_attempts  default 5 attempts in all per request (botocore's "standard" retry mode, its
                `total_max_attempts`: throttling, 5xx, connection errors); also bounds the re-reads of a
                download that broke mid-stream
  base_delay    optional seconds: scale of the exponential backoff (botocore's own when absent)
  page_size     default 1000 keys per list_objects_v2 request
  connect_timeout / read_timeout  seconds, default 10 / 60
  object_tags   default false; true: each changed object's tags become labels of its file ("name=value",
                or "name" when the value is empty), at the cost of one GetObjectTagging request per changed
                object (one more round trip beside its GET; needs s3:GetObjectTagging, else no tags)

Keys are the object keys relative to the prefix. "Directory marker" objects (keys ending in "/") are skipped.
Failures of the store as a whole (missing or forbidden bucket, unreachable endpoint, throttling that never
stops) raise SourceUnavailable, so a crawl stops without deleting anything; failures of one object raise
OSError, which the crawl records as that file's status.
"""

from __future__ import annotations

import errno
import logging
import random
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC
from typing import Any, BinaryIO

from kdbl_core.sources import S3Config, parse

from kdbl_core.content.records import FileMeta
from kdbl_worker.connectors import (
    ClosingConnector,
    ListingProblems,
    SourceUnavailable,
    read_credentials,
)

log = logging.getLogger(__name__)

READ_CHUNK = 1024 * 1024
MAX_DELAY = 20.0
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled"}
_THROTTLED = {"SlowDown", "503", "RequestLimitExceeded", "ThrottlingException", "Throttling",
              "TooManyRequestsException", "RequestThrottled", "ServiceUnavailable", "429"}


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code") or "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code or (str(status) if status else "")


def _use_base_delay(client: Any, max_attempts: int, base_delay: float) -> None:
    """Swap botocore's standard-mode backoff scale (1 s for throttling) for `base_delay`.

    Same retry conditions and quota as botocore's standard mode; only the delay differs. Built from the public
    classes of botocore.retries.standard; if a botocore release reshapes them, botocore's own backoff stays.
    """
    try:
        from botocore.retries import quota, standard

        class _Backoff(standard.ExponentialBackoff):
            def delay_amount(self, context: Any) -> float:
                return random.random() * min(base_delay * 2 ** (context.attempt_number - 1), MAX_DELAY)

        adapter = standard.RetryEventAdapter()
        detector = standard.ThrottlingErrorDetector(adapter)
        retry_quota = standard.RetryQuotaChecker(quota.RetryQuota(), detector)
        handler = standard.RetryHandler(
            standard.RetryPolicy(retry_checker=standard.StandardRetryConditions(max_attempts=max_attempts),
                                 retry_backoff=_Backoff()),
            adapter,
            retry_quota,
        )
        client.meta.events.unregister("needs-retry.s3", unique_id="retry-config-s3")
        client.meta.events.register("needs-retry.s3", handler.needs_retry, unique_id="retry-config-s3")
        client.meta.events.register("after-call.s3", retry_quota.release_retry_quota)
    except (ImportError, AttributeError, TypeError) as exc:  # pragma: no cover - depends on botocore's shape
        log.warning("cannot tune S3 retry backoff; using botocore's", extra={"error": str(exc)})


class S3Connector(ClosingConnector):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config: S3Config = parse("s3", config)  # type: ignore[assignment]
        self.problems = ListingProblems()
        self._s3: Any = None

    # -- client -------------------------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._s3 is not None:
            return self._s3
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        cfg = self.config
        secrets = read_credentials(cfg.credentials, required=("access_key_id", "secret_access_key"),
                                   optional=("session_token",))
        options: dict[str, Any] = {
            "region_name": cfg.region,
            "retries": {"mode": "standard", "total_max_attempts": cfg.max_attempts},
            "connect_timeout": cfg.connect_timeout,
            "read_timeout": cfg.read_timeout,
            "user_agent_extra": "kdbl-worker",
            # Only read here; "when_required" keeps S3-compatible stores that lack the newer checksum
            # headers (older MinIO, Ceph RGW) working.
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
        if cfg.path_style is not None:
            options["s3"] = {"addressing_style": "path" if cfg.path_style else "virtual"}
        if cfg.anonymous:
            options["signature_version"] = UNSIGNED
        try:
            session = boto3.session.Session(
                aws_access_key_id=secrets["access_key_id"] if secrets else None,
                aws_secret_access_key=secrets["secret_access_key"] if secrets else None,
                aws_session_token=secrets.get("session_token") if secrets else None,
                region_name=cfg.region,
            )
            client = session.client("s3", endpoint_url=cfg.endpoint_url, verify=cfg.verify,
                                    config=Config(**options))
        except BotoCoreError as exc:  # a broken AWS_PROFILE / config file, an unknown region format, ...
            raise self._unavailable(exc, "setting up the S3 client") from exc
        if cfg.base_delay is not None:
            _use_base_delay(client, cfg.max_attempts, cfg.base_delay)
        self._s3 = client
        return client

    def close(self) -> None:
        if getattr(self, "_s3", None) is not None:
            self._s3.close()
            self._s3 = None

    def _unavailable(self, exc: Exception, doing: str) -> SourceUnavailable:
        from botocore.exceptions import (
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        cfg = self.config
        where = f"bucket '{cfg.bucket}' at {cfg.where}"
        if isinstance(exc, ClientError):
            code = _error_code(exc)
            retries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
            if code in ("NoSuchBucket", "404", "NotFound"):
                return SourceUnavailable(f"{where} does not exist")
            if code in _DENIED or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "401"):
                return SourceUnavailable(f"{where}: access denied ({code}) while {doing}; check the "
                                         "credentials and the bucket policy")
            if code in ("301", "PermanentRedirect", "AuthorizationHeaderMalformed"):
                return SourceUnavailable(f"{where}: the bucket lives in another region ({code}); "
                                         "set 'region'")
            if code in _THROTTLED:
                return SourceUnavailable(f"{where}: still throttled ({code}) after {retries + 1} attempts "
                                         f"while {doing}")
            return SourceUnavailable(f"{where}: {code or 'error'} while {doing} "
                                     f"(after {retries + 1} attempts)")
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return SourceUnavailable(f"{where}: no credentials (none configured, and boto3's default "
                                     "chain found none)")
        if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
            return SourceUnavailable(f"{where}: cannot reach the endpoint while {doing}")
        return SourceUnavailable(f"{where}: {type(exc).__name__} while {doing}")

    # -- the Connector interface --------------------------------------------------------------------------

    def check(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        # A one-key listing rather than HeadBucket: credentials scoped to the prefix (an s3:prefix condition
        # on s3:ListBucket) may list under it but not probe the bucket as a whole.
        client = self._client()
        try:
            client.list_objects_v2(Bucket=self.config.bucket, Prefix=self.config.prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as exc:
            raise self._unavailable(exc, "checking the bucket") from exc

    def walk(self) -> Iterator[FileMeta]:
        from botocore.exceptions import BotoCoreError, ClientError

        cfg = self.config  # no check() first: the first page fails the same way
        paginator = self._client().get_paginator("list_objects_v2")
        pages = iter(paginator.paginate(Bucket=cfg.bucket, Prefix=cfg.prefix,
                                        PaginationConfig={"PageSize": cfg.page_size}))
        while True:
            try:
                page = next(pages)
            except StopIteration:
                return
            except (ClientError, BotoCoreError) as exc:
                raise self._unavailable(exc, "listing objects") from exc
            for obj in page.get("Contents", ()):
                full = obj["Key"]
                if full.endswith("/") or not full.startswith(cfg.prefix):
                    continue
                key = full[len(cfg.prefix):]
                etag = obj.get("ETag")
                mtime = obj.get("LastModified")
                if mtime is not None:
                    mtime = mtime.replace(tzinfo=UTC) if mtime.tzinfo is None else mtime.astimezone(UTC)
                yield FileMeta(
                    key=key, size=int(obj.get("Size", 0)), mtime=mtime,
                    etag=etag.strip('"') if etag else None,
                    storage_class=obj.get("StorageClass") or "STANDARD",
                )

    def object_tags(self, key: str) -> list[str]:
        """The object's tags as labels when the config asks for them (`object_tags`); [] otherwise, and
        when they cannot be read (the file is indexed without them, logged)."""
        if not self.config.object_tags:
            return []
        from botocore.exceptions import BotoCoreError, ClientError

        cfg = self.config
        try:
            tag_set = self._client().get_object_tagging(Bucket=cfg.bucket, Key=cfg.prefix + key)["TagSet"]
        except (ClientError, BotoCoreError) as exc:
            log.warning("object tags unreadable", extra={"key": key, "error": _error_code(exc) or repr(exc)[:200]})
            return []
        return [f"{t['Key']}={t['Value']}" if t.get("Value") else t["Key"] for t in tag_set]

    def open(self, key: str) -> BinaryIO:
        spool = tempfile.SpooledTemporaryFile(max_size=self.config.spool_max_bytes)  # noqa: SIM115
        try:
            self._download(key, spool)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool  # type: ignore[return-value]

    # -- download -----------------------------------------------------------------------------------------

    def _get(self, key: str, **extra: Any) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        cfg = self.config
        try:
            return self._client().get_object(Bucket=cfg.bucket, Key=cfg.prefix + key, **extra)
        except ClientError as exc:
            code = _error_code(exc)
            if code in _NOT_FOUND:
                raise FileNotFoundError(errno.ENOENT, "no such object", key) from exc
            if code in _DENIED:
                raise PermissionError(errno.EACCES, f"access denied to the object ({code})", key) from exc
            if code in ("PreconditionFailed", "412"):
                raise OSError(errno.EAGAIN, "the object changed while it was read", key) from exc
            if code == "InvalidObjectState":
                raise OSError(errno.EIO, "the object is archived; restore it before it can be read",
                              key) from exc
            raise self._unavailable(exc, "reading an object") from exc
        except BotoCoreError as exc:
            raise self._unavailable(exc, "reading an object") from exc

    def _download(self, key: str, spool: BinaryIO) -> None:
        """Stream one object into `spool`; a broken stream resumes with a ranged GET of the same ETag."""
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import IncompleteReadError, ReadTimeoutError, ResponseStreamingError

        broken = (ResponseStreamingError, IncompleteReadError, ReadTimeoutError, BotoConnectionError)
        cfg = self.config
        written, total, etag, failures = 0, -1, None, 0
        while True:
            extra = {}
            if written and etag:
                extra = {"Range": f"bytes={written}-", "IfMatch": etag}
            elif written:  # no ETag to pin the version: start over
                spool.seek(0)
                spool.truncate()
                written = 0
            response = self._get(key, **extra)
            if total < 0:
                total, etag = int(response.get("ContentLength") or 0), response.get("ETag")
            body = response["Body"]
            error: Exception | None = None
            try:
                while True:
                    try:
                        chunk = body.read(READ_CHUNK)
                    except broken as exc:
                        error = exc
                        break
                    if not chunk:
                        break
                    spool.write(chunk)
                    written += len(chunk)
            finally:
                body.close()
            if error is None and written >= total:
                return
            failures += 1
            why = type(error).__name__ if error else f"body ended at {written} of {total} bytes"
            if failures >= cfg.max_attempts:
                raise OSError(errno.EIO, f"download broke {failures} times (last: {why})", key) from error
            log.warning("S3 download broke; resuming", extra={
                "bucket": cfg.bucket, "key": key, "offset": written, "error": why})
            time.sleep(random.random() * min((cfg.base_delay or 0.5) * 2 ** (failures - 1), MAX_DELAY))
