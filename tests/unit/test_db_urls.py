"""Connection URLs as plain strings (kdbl_core.db.urls): the forms the settings accept, runtime-role URLs."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import for_role, libpq, normalise, socket_url
from kdbl_core.errors import ConfigError

SPECIAL = "p@ss:/w%rd?#&= ü"


@pytest.mark.parametrize("url", ["postgres://u:pw@db.example:5433/kdbl?sslmode=require",
                                 "postgresql://u:pw@db.example:5433/kdbl?sslmode=require",
                                 "postgresql+psycopg://u:pw@db.example:5433/kdbl?sslmode=require"])
def test_the_three_accepted_schemes_name_the_same_server(url) -> None:
    assert normalise(url) == "postgresql+psycopg://u:pw@db.example:5433/kdbl?sslmode=require"
    assert libpq(url) == conninfo(url) == "postgresql://u:pw@db.example:5433/kdbl?sslmode=require"
    assert conninfo_to_dict(libpq(url)) == {"user": "u", "password": "pw", "host": "db.example",
                                            "port": "5433", "dbname": "kdbl", "sslmode": "require"}


def test_a_socket_url_keeps_its_directory_and_a_password_with_any_character() -> None:
    url = socket_url("kdbl", "my db", "/run/k lake/sock", SPECIAL)
    assert url.startswith("postgresql+psycopg://kdbl:") and "@/" in url
    assert conninfo_to_dict(libpq(url)) == {"user": "kdbl", "password": SPECIAL, "dbname": "my db",
                                            "host": "/run/k lake/sock"}
    assert conninfo_to_dict(libpq(socket_url("kdbl", "kdbl", "/tmp/s"))) == {"user": "kdbl", "dbname": "kdbl",
                                                                          "host": "/tmp/s"}


def test_a_role_url_changes_only_the_user() -> None:
    for url in (socket_url("kdbl", "kdbl", "/tmp/sock dir", SPECIAL),
                "postgresql://kdbl:" + SPECIAL.replace("%", "%25").replace("/", "%2F").replace("?", "%3F")
                .replace("#", "%23") + "@h1:5432,h2:5433/kdbl?application_name=x",
                "postgresql:///kdbl?host=/tmp/sock", "postgres://[::1]:5432/kdbl"):
        before, after = conninfo_to_dict(libpq(url)), conninfo_to_dict(libpq(for_role(url, "kdbl_api")))
        assert after == {**before, "user": "kdbl_api"}
        assert for_role(url, "kdbl_api").startswith("postgresql+psycopg://kdbl_api")


def test_a_bare_at_sign_in_a_password_is_read_as_part_of_it() -> None:
    assert conninfo_to_dict(libpq("postgresql://u:p@ss@host/db"))["password"] == "p@ss"


@pytest.mark.parametrize(("url", "reason"), [
    ("mysql://u:secret@h/db", "must start with"), ("u:secret@h/db", "must start with"),
    ("postgresql://u:secret@h/db?nonsense=1", 'invalid URI query parameter: "nonsense"'),
    ("postgresql://u:secret@[::1/db", "IPv6"),
])
def test_a_url_libpq_cannot_use_is_a_config_error_that_does_not_show_the_password(url, reason) -> None:
    with pytest.raises(ConfigError, match="the database URL cannot be used") as raised:
        normalise(url)
    assert reason in raised.value.message and "secret" not in raised.value.message
