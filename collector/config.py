"""`CollectorConfig`: every setting of the collector, with its default and validation."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from spanrl import env
from spanrl import semconv as sc
from spanrl.collector.batcher import BatcherConfig
from spanrl.errors import ConfigError
from spanrl.trust import Tokens, check_token, env_token, open_scopes_line

__all__ = ["CollectorConfig", "default_config"]

_MAX_REQUEST_BYTES = 64 * 1024 * 1024  # the OTLP spec's recommended receive limit
_GRPC_MAX_CONCURRENT_RPCS = 64
_MAX_INFLIGHT_BYTES = 256 * 1024 * 1024
_SQL_TIMEOUT_S = 30.0
_SQL_MAX_ROWS = 1_000_000
_SQL_MAX_BYTES = 256 * 1024 * 1024
_SQL_WORKERS = 2
_SQL_MAX_WAITING = 16
_HTTP_MAX_CONCURRENCY = 64
_GRPC_RECEIVE_TIMEOUT_S = 10.0
_SHUTDOWN_TIMEOUT_S = 30.0
_MAX_PORT = 65535
_DUCKDB_MEMORY_LIMIT = "1GB"
_DUCKDB_CHECKPOINT_THRESHOLD = "512MB"  # x1.05-1.10 over 256MB: docs/measurements.md, "Kept: ..."
_MATERIALIZE_INTERVAL_S = 2.0
_MEMORY_LIMIT_PATTERN = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")


@dataclass
class CollectorConfig:
    """Settings of one collector process (or one embedded `Collector`)."""

    db_path: str = env.DEFAULT_DB_PATH
    """DuckDB file to write (``":memory:"`` for tests)."""
    host: str = env.DEFAULT_HOST
    """Address both receivers bind; 127.0.0.1 unless told otherwise."""
    grpc_port: int = env.DEFAULT_GRPC_PORT
    """OTLP/gRPC port; 0 picks a free one (see `Collector.grpc_endpoint`). -1 disables gRPC."""
    http_port: int = env.DEFAULT_HTTP_PORT
    """OTLP/HTTP + SQL port; 0 picks a free one. -1 disables HTTP."""
    token: str | None = field(default=None, repr=False)  # a repr (logs, tracebacks) never shows it
    """Bearer token granting every scope (``authorization: Bearer TOKEN``): OTLP, SQL, prune, materialize."""
    ingest_token: str | None = field(default=None, repr=False)
    """Token granting OTLP export only: the one agents are given."""
    policy_token: str | None = field(default=None, repr=False)
    """Token of the policy server: OTLP export whose token ids, log-probs and server response ids are kept
    (spanrl.collector.sender); other senders' are stored NULL once any token grants this scope."""
    read_token: str | None = field(default=None, repr=False)
    """Token granting ``POST /v1/sql`` (the viewer, ``spanrl sql``, trainers reading the store)."""
    admin_token: str | None = field(default=None, repr=False)
    """Token granting ``POST /v1/prune`` and ``/v1/materialize``. Once any token is set, a scope no token grants
    is closed; with none at all every scope is open, which only a loopback ``host`` allows (`open_scopes`)."""
    claim_rollouts: bool = True
    """The first service whose spans name a rollout id owns it; other services' spans naming it are rejected
    (spanrl.collector.sender). False: any span may join any rollout, as before."""
    max_request_bytes: int = _MAX_REQUEST_BYTES
    """Largest accepted request body, bytes (after gzip decompression for HTTP)."""
    grpc_max_concurrent_rpcs: int = _GRPC_MAX_CONCURRENT_RPCS
    """Export RPCs handled at once; more get UNAVAILABLE with RetryInfo before their body is read."""
    grpc_receive_timeout_s: float = _GRPC_RECEIVE_TIMEOUT_S
    """Seconds an OTLP/gRPC Export may hold one of the 4 slots that receive request bodies before its whole
    request has arrived; past it the call is cancelled (idle client-streaming calls held every slot with no
    limit, and every other export waited 30 s for UNAVAILABLE). The OTel SDKs' export timeout is 10 s."""
    http_max_concurrency: int = _HTTP_MAX_CONCURRENCY
    """HTTP requests handled at once (``/health`` aside); more get 503 + Retry-After before their body is read."""
    max_inflight_bytes: int = _MAX_INFLIGHT_BYTES
    """Received request data not yet in the write queue (bodies + their decoded form, estimated); past
    it requests get a retryable refusal. Peak memory ~ this + batcher.max_queue_bytes + duckdb_memory_limit
    + ~500 MiB of runtime."""
    sql_timeout_s: float = _SQL_TIMEOUT_S
    """Seconds a ``POST /v1/sql`` query may run before it is interrupted and answered 400."""
    sql_max_rows: int = _SQL_MAX_ROWS
    """Rows a ``POST /v1/sql`` result may have; past it the query stops and is answered 400 naming the cap
    (unbounded, ``SELECT * FROM range(5000000)`` took the collector from 0.27 to 2.04 GB)."""
    sql_max_bytes: int = _SQL_MAX_BYTES
    """Bytes a ``POST /v1/sql`` result may take (Arrow while read, then the response body); past it: 400."""
    sql_workers: int = _SQL_WORKERS
    """Threads running SQL-endpoint queries (their own pool: slow SQL never delays OTLP)."""
    sql_max_waiting: int = _SQL_MAX_WAITING
    """SQL queries running or waiting at once; more get 503 + Retry-After."""
    shutdown_timeout_s: float = _SHUTDOWN_TIMEOUT_S
    """How long shutdown waits for in-flight requests and the last commit."""
    duckdb_memory_limit: str = _DUCKDB_MEMORY_LIMIT
    """DuckDB buffer memory cap (e.g. "1GB"): with the write queue's cap, bounds the collector's memory."""
    duckdb_checkpoint_threshold: str = _DUCKDB_CHECKPOINT_THRESHOLD
    """WAL size that triggers a DuckDB checkpoint; larger amortizes checkpoints, a restart replays more WAL."""
    duckdb_threads: int | None = None
    """DuckDB worker threads; None: one per core. 1 cut insert CPU ~25% in bench runs but slows the
    big analytic queries (decomposer, SQL endpoint) that share this DuckDB."""
    materialize_interval_s: float | None = _MATERIALIZE_INTERVAL_S
    """Shortest wait between background runs that keep the decomposition of finished rollouts in the store
    (store/kept_rollouts.py: a read then decomposes only the rest); each run waits >= 19x the last one's time
    too. None: off (`spanrl store materialize` does it on demand)."""
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    """Group-commit queue settings."""
    retention_s: float | None = None
    """Delete spans ingested more than this many seconds ago, in the background (whole rollouts, by the
    collector's clock: `spanrl.collector.retention`); None: keep everything."""
    reward_range: tuple[float, float] = (-sc.REWARD_ABS_MAX, sc.REWARD_ABS_MAX)
    """A span whose reward (attribute or reward event) is not a finite number in ``[low, high]`` is rejected
    at ingest (partial success, with the reason; `spanrl.collector.rewards`). At most +-1e6
    (``semconv.REWARD_ABS_MAX``, the readers' bound): a narrower range may be set, never a wider one."""

    def validate(self) -> None:
        """Raise `ConfigError` naming the first bad field and its value."""
        if not self.db_path:
            raise ConfigError("db_path must be a file path or ':memory:', got an empty string")
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            if self.host != "localhost":
                raise ConfigError(f"host must be an IP address or 'localhost', got {self.host!r}") from None
        for name in ("grpc_port", "http_port"):
            port = getattr(self, name)
            if not isinstance(port, int) or port < -1 or port > _MAX_PORT:
                raise ConfigError(f"{name} must be -1 (off), 0 (any free port) or 1..{_MAX_PORT}, got {port!r}")
        if self.grpc_port == -1 and self.http_port == -1:
            raise ConfigError("grpc_port and http_port are both -1: at least one receiver must be on")
        for name in ("token", "ingest_token", "policy_token", "read_token", "admin_token"):
            check_token(getattr(self, name), field=name)
        self.open_scopes()  # beyond loopback with no token: ConfigError naming the open scopes
        for name in ("max_request_bytes", "grpc_max_concurrent_rpcs", "http_max_concurrency", "max_inflight_bytes",
                     "sql_workers", "sql_max_waiting", "sql_max_rows", "sql_max_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("shutdown_timeout_s", "sql_timeout_s", "grpc_receive_timeout_s"):
            if not getattr(self, name) > 0:  # also refuses NaN
                raise ConfigError(f"{name} must be positive (seconds), got {getattr(self, name)}")
        for name in ("duckdb_memory_limit", "duckdb_checkpoint_threshold"):
            if not _MEMORY_LIMIT_PATTERN.match(getattr(self, name)):
                raise ConfigError(f"{name} must be a size such as '1GB' or '512MiB', got {getattr(self, name)!r}")
        if self.materialize_interval_s is not None and not self.materialize_interval_s > 0:
            raise ConfigError(
                f"materialize_interval_s must be positive (seconds) or None, got {self.materialize_interval_s}"
            )
        if self.duckdb_threads is not None and self.duckdb_threads < 1:
            raise ConfigError(f"duckdb_threads must be None or at least 1, got {self.duckdb_threads}")
        self.batcher.validate()
        _validate_reward_range(self.reward_range)
        if self.retention_s is not None and (isinstance(self.retention_s, bool) or not self.retention_s > 0
                                             or self.retention_s == float("inf")):
            raise ConfigError(f"retention_s must be a positive number of seconds or None, got {self.retention_s!r}")

    def tokens(self) -> Tokens:
        """The tokens and the scopes each grants (spanrl.trust)."""
        return Tokens.of(all_scopes=self.token, ingest=self.ingest_token, policy=self.policy_token,
                         read=self.read_token, admin=self.admin_token)

    def open_scopes(self) -> str | None:
        """The one start-up line naming the scopes open to anyone (no token at all, bound to loopback), or None;
        `ConfigError` when ``host`` is beyond loopback and a scope it serves is open (spanrl.trust)."""
        served = ("ingest", "policy") + (("read", "admin") if self.http_port != -1 else ())
        return open_scopes_line(self.tokens(), served, server="collector", host=self.host)

    @classmethod
    def from_env(cls, **overrides: object) -> "CollectorConfig":
        """Defaults, then ``SPANRL_*`` variables (a token also from ``SPANRL_*_TOKEN_FILE``), then ``overrides`` whose
    value is not None."""
        config = cls(
            db_path=env.get_str(env.SPANRL_DB, env.DEFAULT_DB_PATH) or env.DEFAULT_DB_PATH,
            host=env.get_str(env.SPANRL_COLLECTOR_HOST, env.DEFAULT_HOST) or env.DEFAULT_HOST,
            grpc_port=env.get_int(env.SPANRL_COLLECTOR_GRPC_PORT, env.DEFAULT_GRPC_PORT),
            http_port=env.get_int(env.SPANRL_COLLECTOR_HTTP_PORT, env.DEFAULT_HTTP_PORT),
            token=env_token(env.SPANRL_COLLECTOR_TOKEN),
            ingest_token=env_token(env.SPANRL_COLLECTOR_INGEST_TOKEN),
            policy_token=env_token(env.SPANRL_COLLECTOR_POLICY_TOKEN),
            read_token=env_token(env.SPANRL_COLLECTOR_READ_TOKEN),
            admin_token=env_token(env.SPANRL_COLLECTOR_ADMIN_TOKEN),
            duckdb_memory_limit=(
                env.get_str(env.SPANRL_DUCKDB_MEMORY_LIMIT, _DUCKDB_MEMORY_LIMIT) or _DUCKDB_MEMORY_LIMIT
            ),
            duckdb_checkpoint_threshold=(
                env.get_str(env.SPANRL_DUCKDB_CHECKPOINT_THRESHOLD, _DUCKDB_CHECKPOINT_THRESHOLD)
                or _DUCKDB_CHECKPOINT_THRESHOLD
            ),
            max_inflight_bytes=env.get_int(env.SPANRL_COLLECTOR_MAX_INFLIGHT_BYTES, _MAX_INFLIGHT_BYTES),
            sql_timeout_s=env.get_float(env.SPANRL_COLLECTOR_SQL_TIMEOUT_S, _SQL_TIMEOUT_S),
            sql_max_rows=env.get_int(env.SPANRL_COLLECTOR_SQL_MAX_ROWS, _SQL_MAX_ROWS),
            sql_max_bytes=env.get_int(env.SPANRL_COLLECTOR_SQL_MAX_BYTES, _SQL_MAX_BYTES),
            materialize_interval_s=env.get_float(env.SPANRL_COLLECTOR_MATERIALIZE_INTERVAL_S, _MATERIALIZE_INTERVAL_S)
            or None,  # 0: off
        )
        for name, value in overrides.items():
            if not hasattr(config, name):
                raise ConfigError(f"CollectorConfig has no field {name!r}")
            if value is not None:
                setattr(config, name, value)
        return config


def _validate_reward_range(value: object) -> None:
    bound = sc.REWARD_ABS_MAX
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or not -bound <= value[0] <= value[1] <= bound:  # type: ignore[index,operator]  # NaN fails too
        raise ConfigError(
            f"reward_range must be (low, high) with -{bound:g} <= low <= high <= {bound:g}, got {value!r}"
        )



def default_config() -> CollectorConfig:
    """A new config with every default (no environment read)."""
    return CollectorConfig()
