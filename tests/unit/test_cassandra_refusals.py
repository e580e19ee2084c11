"""How a failed Cassandra connection is reported, from the driver's per-node errors,
without a server: a refusal names the setting to fix (and never the password), anything
else is an outage; and the CLI's Cassandra flags become the same settings as the
variables."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cassandra import AuthenticationFailed, Unauthorized
from cassandra.cluster import NoHostAvailable

from scheduler.adapters.cassandra.refusals import connect_failure, denial, tls_context
from scheduler.cli.options import settings_from
from scheduler.errors import ConfigError, StoreAccessDenied, StoreUnavailable
from scheduler.settings import CassandraSettings, TlsFiles

NODE = "10.0.0.7:9042"
LOGIN = CassandraSettings(hosts=("10.0.0.7",), username="scheduler", password="s3cret-pw")
TLS = CassandraSettings(hosts=("10.0.0.7",), tls=TlsFiles(Path("/etc/scheduler/ca.pem")))


def failure(settings: CassandraSettings, **errors: BaseException) -> Exception:
    return connect_failure(NoHostAvailable("Unable to connect to any servers", errors), settings)


def test_a_wrong_password_names_the_user_and_the_settings_but_not_the_password() -> None:
    found = failure(LOGIN, **{NODE: AuthenticationFailed(
        'Failed to authenticate to 10.0.0.7:9042: Error from server: code=0100 [Bad credentials] '
        'message="Provided username scheduler and/or password are incorrect"')})
    assert isinstance(found, StoreAccessDenied)
    assert str(found).startswith("Cassandra at 10.0.0.7:9042 refused the login of user 'scheduler'")
    assert "SCHEDULER_CASSANDRA_USERNAME" in str(found) and "s3cret-pw" not in str(found)


def test_a_login_the_node_could_not_check_is_an_outage_not_a_refusal() -> None:
    # What PasswordAuthenticator answers when it cannot read system_auth at its
    # consistency level: the password was never judged.
    found = failure(LOGIN, **{NODE: AuthenticationFailed(
        'Failed to authenticate to 10.0.0.7:9042: Error from server: code=0100 [Bad credentials] '
        'message="Unable to perform authentication: Cannot achieve consistency level LOCAL_ONE"')})
    assert isinstance(found, StoreUnavailable), found


def test_no_login_where_one_is_required_says_which_settings_give_one() -> None:
    found = failure(CassandraSettings(hosts=("10.0.0.7",)),
                    **{NODE: AuthenticationFailed("Remote end requires authentication")})
    assert isinstance(found, StoreAccessDenied) and "requires a login" in str(found)


@pytest.mark.parametrize(("error", "says"), [
    (ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required"),
     "requires a client certificate"),
    (PermissionError(1, "Tried connecting to [('10.0.0.7', 9042)]. Last error: [SSL: CERTIFICATE_VERIFY_FAILED] "
                        "certificate verify failed: unable to get local issuer certificate (_ssl.c:1006)"),
     "does not vouch for"),
    (PermissionError(1, "Tried connecting to [('10.0.0.7', 9042)]. Last error: [SSL: WRONG_VERSION_NUMBER] "
                        "wrong version number (_ssl.c:1006)"),
     "does not speak TLS on this port"),
])
def test_tls_refusals_name_the_tls_settings(error: BaseException, says: str) -> None:
    found = failure(TLS, **{NODE: error})
    assert isinstance(found, StoreAccessDenied) and says in str(found)
    assert "SCHEDULER_CASSANDRA_TLS_" in str(found) or "SCHEDULER_CASSANDRA_PORT" in str(found)


def test_a_node_that_is_down_is_an_outage() -> None:
    found = failure(LOGIN, **{NODE: ConnectionRefusedError(111, "Tried connecting to [('10.0.0.7', 9042)]. "
                                                                "Last error: Connection refused")})
    assert isinstance(found, StoreUnavailable) and not isinstance(found, StoreAccessDenied)
    assert "Is it running?" in str(found)


def test_a_refusal_by_one_node_wins_over_another_being_down() -> None:
    found = failure(LOGIN, **{"10.0.0.8:9042": ConnectionRefusedError(111, "refused"),
                              NODE: AuthenticationFailed('message="Provided username scheduler and/or password '
                                                         'are incorrect"')})
    assert isinstance(found, StoreAccessDenied) and "10.0.0.7:9042" in str(found)


def test_a_statement_the_role_is_not_granted_is_a_denial_others_are_not() -> None:
    refused = Unauthorized('Error from server: code=2100 [Unauthorized] message="User scheduler has no MODIFY '
                           'permission on <table s.tasks_by_bucket> or any of its parents"')
    found = denial(refused, None, "writing tasks")
    assert isinstance(found, StoreAccessDenied)
    assert "MODIFY" in str(found) and "GRANT" in str(found)
    assert denial(ValueError("no"), None, "writing tasks") is None


def test_unusable_tls_files_are_config_errors_naming_the_variable(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="SCHEDULER_CASSANDRA_TLS_CA"):
        tls_context(TlsFiles(ca))


def test_the_cli_flags_make_the_settings_the_variables_would() -> None:
    found = settings_from("10.0.0.7", 9042, "scheduler", "{'class': 'SimpleStrategy', 'replication_factor': 1}",
                          "LOCAL_QUORUM", 64, cassandra_username="scheduler",
                          cassandra_password_file=Path("/run/secrets/cassandra"),
                          cassandra_tls_ca=Path("/etc/ca.pem"), cassandra_tls_cert=Path("/etc/client.pem"),
                          cassandra_tls_key=Path("/etc/client.key"))
    assert found.username == "scheduler" and found.password_file == Path("/run/secrets/cassandra")
    assert found.tls == TlsFiles(Path("/etc/ca.pem"), Path("/etc/client.pem"), Path("/etc/client.key"))
    with pytest.raises(ConfigError, match="--cassandra-tls-ca"):
        settings_from("10.0.0.7", 9042, "scheduler", "{'class': 'SimpleStrategy', 'replication_factor': 1}",
                      "LOCAL_QUORUM", 64, cassandra_tls_cert=Path("/etc/client.pem"))
