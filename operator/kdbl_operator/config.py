"""The operator's typed settings (KDBL_* environment variables, read once per process)."""

from __future__ import annotations

from kdbl_core.errors import ConfigError
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KDBL_", extra="ignore", frozen=True)

    database_url: SecretStr | None = Field(
        default=None, description="Owner-role URL (the operator writes tenants, sources, grants and tokens).")
    operator_namespace: str = Field(
        default="default", description="Where the operator runs: its leader Lease, and the default home "
        "namespace of tenants (bootstrap Secrets).")
    operator_health_port: int = Field(default=8080, ge=1, le=65535)
    operator_health_host: str = "0.0.0.0"
    operator_resync_seconds: float = Field(
        default=300.0, gt=0, description="Every resource is re-converged this often (drift correction).")
    operator_retry_base_seconds: float = Field(default=5.0, gt=0)
    operator_retry_max_seconds: float = Field(default=300.0, gt=0)
    operator_delete_batch: int = Field(default=500, ge=1, description="Files deleted per transaction.")
    operator_delete_batches_per_pass: int = Field(
        default=20, ge=1, description="Batches per handler run; the finalizer then reports progress and resumes.")
    operator_credentials_root: str = Field(
        default="/var/run/secrets/kdbl/sources",
        description="Where the worker mounts Source credential Secrets (<root>/<namespace>/<secret>/<key>).")
    operator_lease_name: str = "kdbl-operator"
    operator_lease_seconds: float = Field(default=15.0, ge=2)
    operator_lease_renew_seconds: float = Field(default=5.0, gt=0)
    operator_db_pool_size: int = Field(default=2, ge=1, le=20)
    log_level: str = "INFO"
    log_format: str = Field(default="json", pattern=r"^(json|text)$")

    def require_database_url(self) -> str:
        if self.database_url is None:
            raise ConfigError("KDBL_DATABASE_URL is not set (the owner-role URL of the K-Lake database)")
        return self.database_url.get_secret_value()

    def backoff(self, retry: int) -> float:
        """Delay before the next attempt of a failing handler: exponential, capped."""
        return min(self.operator_retry_base_seconds * (2 ** min(retry, 16)), self.operator_retry_max_seconds)
