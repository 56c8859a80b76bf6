"""kdbl_core.sources: one source-config schema and one schedule parser for kdbl-control, the operator and
the connectors. Every config shape stored today still parses to the same stored dict; bad input names the
field; the CLI and the operator store the same config and schedule for the same intent."""

from __future__ import annotations

from typing import Any

import pytest
from kdbl_control.cli import build_parser
from kdbl_control.cli_source import source_config, source_schedule
from kdbl_core import sources
from kdbl_core.errors import InvalidArgument
from kdbl_core.sources import FsConfig, HttpConfig, S3Config, ScheduleError, SmbConfig
from kdbl_operator import desired
from kdbl_operator.desired import InvalidSpec
from kdbl_worker.connectors import connector_for

CREDS = {"env": {"username": "U_VAR", "password": "P_VAR"}}
OWNER = {"owner": {"kind": "Source", "name": "docs", "namespace": "team-a"}, "hybrid": "inherit"}

# Every config shape the tests, the CLI, the operator and the benchmarks store today (tests/unit/test_cli.py,
# tests/operator/test_desired.py, tests/integration/test_connectors_*.py, test_queue.py, bench_crawl.py).
STORED: list[tuple[str, dict[str, Any]]] = [
    ("fs", {"root": "/data/docs"}),
    ("fs", {"root": "/srv/corpus", "include": ["**/*.md", "*.pdf"]}),
    ("fs", {"root": "/data/docs", "include": ["**/*.pdf"], "exclude": ["tmp/**"], "max_file_bytes": 1024,
            "honor_file_permissions": True, "ocr": False, "k8s": OWNER}),
    ("s3", {"bucket": "docs", "prefix": "team", "endpoint_url": "http://minio:9000",
            "credentials": {"env": {"access_key_id": "AK_VAR", "secret_access_key": "SK_VAR"}},
            "exclude": ["*.tmp"]}),
    ("s3", {"bucket": "public", "endpoint_url": "http://minio:9000", "credentials": {"anonymous": True}}),
    ("s3", {"bucket": "b", "endpoint_url": "https://minio:9000", "region": "eu", "prefix": "x/",
            "path_style": True}),
    ("s3", {"bucket": "b", "credentials": {"dir": "/run/creds/team-a/s3"},
            "credentials_secret": {"namespace": "team-a", "name": "s3"}, "verify_tls": False,
            "ca_file": "/run/creds/team-a/minio-ca/ca.crt", "k8s": OWNER}),
    ("s3", {"bucket": "kdbl-e2e", "prefix": "docs/", "endpoint_url": "http://127.0.0.1:9000",
            "region": "us-east-1", "credentials": {"env": {"access_key_id": "A", "secret_access_key": "S"}},
            "max_attempts": 2, "base_delay": 0.01, "page_size": 2, "connect_timeout": 1, "read_timeout": 5,
            "spool_max_bytes": 0}),
    ("smb", {"server": "fs01", "share": "public", "path": "reports", "domain": "CORP", "port": 445}),
    ("smb", {"server": "fs1.corp", "share": "docs", "path": "team/handbook", "port": 4450, "domain": "CORP",
             "credentials": {"env": {"username": "SMB_USER", "password": "SMB_PASSWORD"}},
             "exclude": ["*.tmp"]}),
    ("smb", {"server": "127.0.0.1", "port": 1445, "share": "docs", "path": "e2e", "credentials": CREDS,
             "max_attempts": 3, "base_delay": 0, "max_depth": 8, "connect_timeout": 2.5}),
    ("webdav", {"url": "https://dav.example/remote.php/dav/files/svc/"}),
    ("webdav", {"url": "http://127.0.0.1:8080/dav/e2e/", "credentials": CREDS, "max_attempts": 2,
                "base_delay": 0.0, "read_timeout": 5, "spool_max_bytes": 1024}),
    ("http", {"url": "http://docs.internal/manuals/"}),
    ("http", {"url": "http://127.0.0.1:8080/pub/", "verify_tls": False, "legacy_key": "kept as it is"}),
    ("fs", {"root": "/srv/a", "include": "*.md"}),  # one pattern as a string (kdbl_core.sources.globs reads it)
]


@pytest.mark.parametrize(("protocol", "config"), STORED)
def test_every_stored_config_shape_parses_to_the_same_stored_dict(protocol, config):
    parsed = sources.parse(protocol, config)
    assert parsed.stored == config and parsed.protocol == protocol


def test_the_record_applies_the_defaults_the_connectors_used():
    s3 = sources.parse("s3", {"bucket": " b ", "prefix": "/team", "endpoint_url": "http://minio:9000",
                              "ca_file": "/ca.pem"})
    assert isinstance(s3, S3Config)
    assert (s3.bucket, s3.prefix, s3.region, s3.path_style, s3.verify) == (
        "b", "team/", "us-east-1", True, "/ca.pem")
    assert (s3.max_attempts, s3.page_size, s3.connect_timeout, s3.read_timeout) == (5, 1000, 10.0, 60.0)
    assert sources.parse("s3", {"bucket": "b"}).path_style is None  # AWS: virtual-host style
    smb = sources.parse("smb", {"server": "fs1", "share": "\\docs\\", "path": "\\team\\a",
                                "credentials": CREDS})
    assert isinstance(smb, SmbConfig)
    assert (smb.share, smb.path, smb.port, smb.max_depth) == ("docs", ("team", "a"), 445, 64)
    dav = sources.parse("webdav", {"url": "https://dav.example/a%20b", "verify_tls": False})
    assert isinstance(dav, HttpConfig) and (dav.origin, dav.base_path, dav.verify) == (
        "https://dav.example", "/a b/", False)
    fs = sources.parse("fs", {"root": "/data"})
    assert isinstance(fs, FsConfig) and fs.ocr is True and fs.include == () and fs.max_file_bytes is None


def test_each_connector_reads_its_config_through_the_schema(tmp_path):
    assert connector_for("fs", {"root": str(tmp_path)}).root == tmp_path.resolve()
    with pytest.raises(InvalidArgument) as err:
        connector_for("fs", {"root": "relative/dir"})
    assert err.value.field == "root"
    for protocol, config, record in (
            ("s3", {"bucket": "b"}, S3Config),
            ("smb", {"server": "fs1", "share": "d", "credentials": CREDS}, SmbConfig),
            ("webdav", {"url": "http://h/"}, HttpConfig), ("http", {"url": "http://h/"}, HttpConfig)):
        connector = connector_for(protocol, config)
        try:
            assert type(connector.config) is record and connector.config.stored == config
        finally:
            connector.close()


@pytest.mark.parametrize(("protocol", "config", "field"), [
    ("fs", {}, "root"),
    ("fs", {"root": "docs"}, "root"),
    ("s3", {"prefix": "x"}, "bucket"),
    ("s3", {"bucket": "a/b"}, "bucket"),
    ("s3", {"bucket": "b", "endpoint_url": "http://user:pw@minio:9000"}, "endpoint_url"),
    ("s3", {"bucket": "b", "endpoint_url": "minio:9000"}, "endpoint_url"),
    ("s3", {"bucket": "b", "path_style": "yes"}, "path_style"),
    ("s3", {"bucket": "b", "max_attempts": 0}, "max_attempts"),
    ("s3", {"bucket": "b", "read_timeout": True}, "read_timeout"),
    ("s3", {"bucket": "b", "credentials": {"access_key_id": "AKIA1", "secret_access_key": "hunter2"}},
     "credentials"),
    ("smb", {"server": "//fs1/docs", "share": "d"}, "server"),
    ("smb", {"server": "fs1"}, "share"),
    ("smb", {"server": "fs1", "share": "d", "path": "a/../../etc"}, "path"),
    ("smb", {"server": "fs1", "share": "d", "port": "445"}, "port"),
    ("webdav", {"url": "ftp://example.org/"}, "url"),
    ("http", {"url": "https://h/x?q=1"}, "url"),
    ("webdav", {"url": "https://h/", "credentials": {"password": "hunter2"}}, "credentials"),
    ("webdav", {"url": "https://h/", "verify_tls": "no"}, "verify_tls"),
    ("webdav", {"url": "https://h/", "include": ["*.md", 3]}, "include"),
    ("webdav", {"url": "https://h/", "exclude": [""]}, "exclude"),
    ("webdav", {"url": "https://h/", "ocr": "off"}, "ocr"),
    ("webdav", {"url": "https://h/", "max_file_bytes": 0}, "max_file_bytes"),
    ("ftp", {"url": "ftp://h/"}, "protocol"),
    ("s3", ["bucket"], "config"),
])
def test_bad_configs_are_refused_naming_the_field_and_never_a_secret(protocol, config, field):
    with pytest.raises(InvalidArgument) as err:
        sources.parse(protocol, config)
    assert err.value.field == field and err.value.jsonrpc_code == -32602
    assert "hunter2" not in str(err.value)


def test_a_setting_of_another_protocol_and_credentials_for_fs_are_refused_when_building():
    with pytest.raises(InvalidArgument) as err:
        sources.build("s3", bucket="b", url="https://h/")
    assert err.value.field == "url"
    with pytest.raises(InvalidArgument) as err:
        sources.build("fs", root="/d", credentials={"dir": "/run/x"})
    assert err.value.field == "credentials"
    with pytest.raises(InvalidArgument) as err:  # `kdbl-control source add --protocol fs` accepted it
        source_config(build_parser().parse_args(["source", "add", "--tenant", "t", "--path", "/d",
                                                 "--credentials-dir", "/run/x"]))
    assert err.value.field == "credentials"
    stored = {"root": "/d", "credentials": {"dir": "/run/x"}}  # such a stored row still crawls
    assert sources.parse("fs", stored).stored == stored and sources.parse("fs", stored).credentials is None


# ------------------------------------------------------------------------------------------------
# the CLI and the operator store the same config for the same intent
# ------------------------------------------------------------------------------------------------
def _cli(*argv: str) -> tuple[dict[str, Any], str | None]:
    args = build_parser().parse_args(["source", "add", "--tenant", "acme", *argv])
    return source_config(args), source_schedule(args)


def _operator(**spec: Any) -> tuple[dict[str, Any], str]:
    body = {"apiVersion": "kdbl.io/v1alpha1", "kind": "Source",
            "metadata": {"name": "docs", "namespace": "team-a"},
            "spec": {"tenantRef": {"name": "acme"}, **spec}}
    want = desired.source(body, credentials_root="/run/creds")
    # without the operator's bookkeeping keys
    config = {k: v for k, v in want.config.items() if k not in ("k8s", "credentials_secret")}
    return config, want.schedule


@pytest.mark.parametrize(("argv", "spec"), [
    (("--protocol", "fs", "--path", "/data/docs", "--include", "**/*.pdf", "--include", "**/*.pdf",
      "--exclude", "tmp/", "--no-ocr", "--schedule", "0  3 * * MON-FRI"),
     {"protocol": "fs", "connection": {"path": "/data/docs"}, "include": ["**/*.pdf", "**/*.pdf"],
      "exclude": ["tmp/"], "ocr": False, "schedule": "0 3 * * MON-FRI"}),
    (("--protocol", "s3", "--bucket", "b", "--prefix", "x/", "--endpoint", "https://minio:9000",
      "--region", "eu", "--path-style", "--credentials-dir", "/run/creds/team-a/s3", "--no-verify-tls",
      "--ca-file", "/run/creds/team-a/minio-ca/ca.crt", "--schedule", "@EVERY 1h 30m"),
     {"protocol": "s3", "connection": {
         "bucket": "b", "prefix": "x/", "endpoint": "https://minio:9000", "region": "eu", "pathStyle": True,
         "tls": {"insecureSkipVerify": True, "caSecretRef": {"name": "minio-ca"}}},
      "credentialsSecretRef": {"name": "s3"}, "schedule": "@every 1h30m"}),
    (("--protocol", "smb", "--server", "fs01", "--share", "public", "--path", "reports", "--domain", "CORP",
      "--port", "445", "--credentials-dir", "/run/creds/team-a/smb", "--schedule", "@Daily"),
     {"protocol": "smb", "connection": {"server": "fs01", "share": "public", "path": "reports",
                                        "domain": "CORP", "port": 445},
      "credentialsSecretRef": {"name": "smb"}, "schedule": "@daily"}),
    (("--protocol", "webdav", "--url", "https://dav.example/files/", "--schedule", "manual"),
     {"protocol": "webdav", "connection": {"url": "https://dav.example/files/"}, "schedule": "Manual"}),
    (("--protocol", "http", "--url", "http://docs.internal/manuals/", "--schedule", "@every 1d"),
     {"protocol": "http", "connection": {"url": "http://docs.internal/manuals/"}, "schedule": "@every 1d"}),
])
def test_the_cli_and_the_operator_store_the_same_config_and_schedule_for_the_same_intent(argv, spec):
    cli_config, cli_schedule = _cli(*argv)
    op_config, op_schedule = _operator(**spec)
    assert cli_config == op_config
    assert cli_schedule == op_schedule
    assert sources.parse(spec["protocol"], cli_config).stored == cli_config


def test_the_operator_names_the_spec_path_of_a_refused_field():
    with pytest.raises(InvalidSpec) as err:
        _operator(protocol="s3", connection={"bucket": "b", "endpoint": "http://u:p@minio"})
    assert err.value.reason == "InvalidSpec" and err.value.message.startswith("spec.connection.endpoint:")
    with pytest.raises(InvalidSpec) as err:
        _operator(protocol="fs", connection={"path": "/d"}, credentialsSecretRef={"name": "x"})
    assert err.value.message.startswith("spec.credentialsSecretRef:")
    with pytest.raises(InvalidSpec) as err:
        _operator(protocol="fs", connection={"path": "/d"}, ocr="no")
    assert err.value.message.startswith("spec.ocr:")
    with pytest.raises(InvalidSpec) as err:
        _operator(protocol="fs", connection={"path": "/d"}, schedule="@every 30s")
    assert err.value.reason == "InvalidSchedule" and err.value.message.startswith("spec.schedule:")


# ------------------------------------------------------------------------------------------------
# one schedule parser
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "stored"), [
    ("manual", "manual"), ("OFF", "off"), ("@never", "@never"),  # only the CLI/worker accepted these
    ("@every 1d", "@every 1d"), ("@every 2d12h", "@every 2d12h"),  # days: only the CLI/worker
    ("@every 1h 30m", "@every 1h30m"), ("@EVERY  90s", "@every 90s"),  # spaces: only the operator
    ("@Hourly", "@hourly"), ("*/15  7-19 * * MON-FRI", "*/15 7-19 * * MON-FRI"), ("0 0 * * 7", "0 0 * * 7"),
])
def test_the_cli_and_the_operator_accept_the_union_of_schedule_forms_and_store_one_text(text, stored):
    args = build_parser().parse_args(["source", "add", "--tenant", "t", "--schedule", text])
    assert source_schedule(args) == stored
    assert desired.parse_schedule(text) == stored
    assert sources.parse_stored(stored).text == stored


@pytest.mark.parametrize("text", [
    "@every 30s",  # the CRD's minimum is 1 minute (the CLI accepted 10 s)
    "@every15m",  # the CLI accepted it; the operator took it for an unknown macro
    "@every 30m1h",  # units in order, each once
    "",  # the CLI stored an empty string; None (no --schedule) is the default
    "every day", "* * * * * *", "60 * * * *",
])
def test_both_refuse_what_either_refused(text):
    with pytest.raises(ScheduleError) as err:
        source_schedule(build_parser().parse_args(["source", "add", "--tenant", "t", "--schedule", text]))
    assert err.value.field == "schedule"
    with pytest.raises(InvalidSpec) as spec_err:
        desired.parse_schedule(text)
    assert spec_err.value.reason == "InvalidSchedule"


def test_stored_schedules_written_before_the_merge_keep_running():
    # kdbl-control accepted intervals down to 10 s and stored "" for --schedule "": both still run.
    assert sources.parse_stored("@every 10s").every.total_seconds() == 10
    assert sources.parse_stored("").text == sources.parse_stored(None).text == sources.DEFAULT_SCHEDULE
    with pytest.raises(ScheduleError):
        sources.parse_stored("@every 5s")


def test_the_operator_has_no_schedule_parser_of_its_own():
    import inspect

    source = inspect.getsource(desired)
    assert "_cron_field" not in source and "_DURATION" not in source and "MIN_EVERY" not in source
