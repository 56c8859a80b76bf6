"""kdbl-control argument handling: source configs hold references, never secrets; bad input names the field."""

from __future__ import annotations

import pytest

from kdbl_control.cli import build_parser
from kdbl_control.cli_source import source_config
from kdbl_control.cli_values import parse_expiry
from kdbl_core.errors import InvalidArgument


def _cfg(*argv: str) -> dict:
    return source_config(build_parser().parse_args(["source", "add", "--tenant", "t", *argv]))


def test_s3_source_config_keeps_only_a_credentials_reference():
    cfg = _cfg("--protocol", "s3", "--bucket", "docs", "--prefix", "team", "--endpoint", "http://minio:9000",
               "--credentials-env", "access_key_id=AK_VAR,secret_access_key=SK_VAR", "--exclude", "*.tmp")
    assert cfg == {"bucket": "docs", "prefix": "team", "endpoint_url": "http://minio:9000",
                   "credentials": {"env": {"access_key_id": "AK_VAR", "secret_access_key": "SK_VAR"}},
                   "exclude": ["*.tmp"]}


def test_s3_anonymous_is_a_credentials_form_the_connector_accepts():
    from kdbl_core.sources import parse

    cfg = _cfg("--protocol", "s3", "--bucket", "public", "--endpoint", "http://minio:9000", "--anonymous")
    assert cfg["credentials"] == {"anonymous": True}
    assert parse("s3", cfg).anonymous is True


@pytest.mark.parametrize("argv, field", [
    (("--protocol", "s3", "--bucket", "b", "--anonymous", "--credentials-dir", "/run/s"), "anonymous"),
    (("--protocol", "s3"), "bucket"),
    (("--protocol", "webdav", "--url", "ftp://host/x"), "url"),
    (("--protocol", "http", "--url", "https://user:pw@host/x"), "url"),
    (("--protocol", "fs"), "path"),
    (("--protocol", "s3", "--bucket", "b", "--credentials-env", "oops"), "credentials-env"),
])
def test_bad_source_options_name_the_field(argv, field):
    with pytest.raises(InvalidArgument) as err:
        _cfg(*argv)
    assert err.value.field == field


def test_global_options_are_accepted_after_the_subcommand():
    args = build_parser().parse_args(["up", "docs", "--data-dir", "/tmp/x", "--port", "9"])
    assert str(args.data_dir) == "/tmp/x" and args.port == 9


def test_expiry_accepts_durations_and_timestamps():
    assert parse_expiry("2030-01-01T00:00:00").year == 2030
    assert round((parse_expiry("30d") - parse_expiry("29d")).total_seconds()) == 86400


@pytest.mark.parametrize(("url", "reason"), [("mysql://admin:secret@127.0.0.1/kdbl", "must start with"),
                                             ("postgresql://admin:secret@127.0.0.1/kdbl?bogus=1", "bogus")])
def test_a_database_url_that_cannot_be_used_ends_the_cli_as_one_config_line(monkeypatch, capsys, url, reason):
    from kdbl_control.cli import main
    from kdbl_core.errors import ConfigError

    monkeypatch.setenv("KDBL_DATABASE_URL", url)
    with pytest.raises(SystemExit) as done:
        main(["tenant", "list"])
    err = capsys.readouterr().err
    assert done.value.code == ConfigError.exit_code and err.count("\n") == 1
    assert err.startswith("kdbl-control: the database URL cannot be used") and reason in err
    assert "secret" not in err and "Traceback" not in err


def test_smb_permission_checks_are_stored_and_refused_elsewhere(tmp_path):
    cfg = _cfg("--protocol", "smb", "--server", "fs1", "--share", "docs", "--credentials-env",
               "username=U,password=P", "--permission-checks", "changed")
    assert cfg["permission_checks"] == "changed"
    with pytest.raises(InvalidArgument) as err:
        _cfg("--protocol", "fs", "--path", str(tmp_path), "--permission-checks", "changed")
    assert err.value.field == "permission_checks" and "smb only" in str(err.value)
