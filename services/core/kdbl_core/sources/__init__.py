"""Sources as configured: the one source-config schema (`config`), the one schedule parser
(`schedule`), the key glob rules (`globs`) and the label rule (`labels`), used by kdbl-control, the
operator and the worker; `relabel` applies a label config change to a source's indexed files."""

from kdbl_core.sources.config import (
    CREDENTIAL_NAMES,
    PROTOCOLS,
    FsConfig,
    HttpConfig,
    S3Config,
    SmbConfig,
    SourceConfig,
    build,
    parse,
)
from kdbl_core.sources.schedule import DEFAULT_SCHEDULE, Schedule, ScheduleError, parse_stored
from kdbl_core.sources.schedule import parse as parse_schedule

__all__ = ["CREDENTIAL_NAMES", "DEFAULT_SCHEDULE", "PROTOCOLS", "FsConfig", "HttpConfig", "S3Config",
           "Schedule", "ScheduleError", "SmbConfig", "SourceConfig", "build", "parse", "parse_schedule",
           "parse_stored"]
