"""`UiServer`: the viewer's app on uvicorn, configured the way ``spanrl ui`` is (env defaults, run
discovery, the credit and tokenizer of the runs)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Sequence

from spanrl import env
from spanrl.algorithms import CREDIT_ALGORITHMS
from spanrl.algorithms.credit import CreditConfig
from spanrl.errors import ConfigError
from spanrl.http_server import ThreadedServer, bind, url_host
from spanrl.trust import env_token
from spanrl.ui.app import UiApp
from spanrl.ui.runs import Run, discover_runs
from spanrl.ui.source import open_source
from spanrl.ui.tokens import TokenText

__all__ = ["UiServer", "credit_of_runs"]

_logger = logging.getLogger(__name__)
_DEFAULT_URL = f"http://{env.DEFAULT_HOST}:{env.DEFAULT_HTTP_PORT}"
_START_TIMEOUT_S = 10.0


def credit_of_runs(runs: Sequence[Run]) -> CreditConfig:
    """The credit assignment a run trained with (the first GRPO/PPO run's ``config.json``), else the
    LightningRL defaults. PPO's GAE and the learned critic need values, so the viewer shows the credit without them."""
    configs = [run.config() for run in runs]
    configs.sort(key=lambda c: str((c.get("algorithm") or {}).get("name")).lower() not in CREDIT_ALGORITHMS)
    names = {f.name for f in dataclasses.fields(CreditConfig)}
    for config in configs:
        credit = config.get("credit")
        if isinstance(credit, dict):
            cfg = CreditConfig(**{k: v for k, v in credit.items() if k in names})
            if cfg.mode == "gae":  # discounted reads no per-step rewards: its step signals are shown unweighted
                cfg = dataclasses.replace(cfg, mode="discounted", step_signals=None)
            if cfg.critic is not None:  # the learned head's values live with the policy: the episode term only
                cfg = dataclasses.replace(cfg, critic=None)
            try:
                cfg.validate()
            except ConfigError as exc:
                _logger.warning("ignoring the credit of a run's config.json: %s", exc)
                continue
            return cfg
    return CreditConfig()


class UiServer:
    """The app, bound to a socket; `run` serves in the foreground, `start` / `stop` in a thread."""

    def __init__(self, app: UiApp, host: str, port: int, token: str | None) -> None:
        self.app = app
        self.token = token
        try:
            sock = bind(host, port)
        except OSError as exc:
            raise ConfigError(f"cannot serve on {host}:{port}: {exc}") from None
        self.host = host
        self._server = ThreadedServer(app, sock, name="spanrl-ui")
        self.port = self._server.port

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}/"

    @classmethod
    def from_args(cls, *, db: str | None = None, url: str | None = None, token: str | None = None,
                  runs: Sequence[str] = (), tokenizer: str | None = None, host: str = env.DEFAULT_HOST,
                  port: int = 0) -> "UiServer":
        """As ``spanrl ui`` builds it: unset options fall back to SPANRL_DB, SPANRL_SQL_URL and
        SPANRL_COLLECTOR_READ_TOKEN (else SPANRL_COLLECTOR_TOKEN)."""
        named_db = db or env.get_str(env.SPANRL_DB)  # None: whatever file the collector serves
        url = url or env.get_str(env.SPANRL_SQL_URL, _DEFAULT_URL)
        token = token or env_token(env.SPANRL_COLLECTOR_READ_TOKEN) or env_token(env.SPANRL_COLLECTOR_TOKEN)
        source = open_source(db=named_db, url=url, token=token, default_db=env.DEFAULT_DB_PATH)
        db = source.db_path
        found = discover_runs(runs, db)
        folders: list[Any] = [tokenizer] if tokenizer else []
        folders += [run.config().get("model") for run in found if run.config().get("model")]
        app = UiApp(source, token=token, runs=found, credit=credit_of_runs(found), tokens=TokenText(folders),
                    bound_host=host)
        return cls(app, host, port, token)

    def _warm(self) -> None:
        """Aggregate the rollouts table in the background, so the first page view does not wait for it."""
        def refresh() -> None:
            try:
                self.app.index.refresh()
            except Exception as exc:  # noqa: BLE001 - the page will show the same error when it asks
                _logger.warning("could not read the rollouts yet: %s", exc)

        threading.Thread(target=refresh, name="spanrl-ui-warm", daemon=True).start()

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C)."""
        self._warm()
        try:
            self._server.run()
        finally:
            self.app.source.close()

    def start(self) -> "UiServer":
        """Serve in a background thread; returns once it accepts connections."""
        self._warm()
        if not self._server.start(_START_TIMEOUT_S):
            raise ConfigError(f"the viewer did not start on {self.url}")
        return self

    def shutdown(self) -> None:
        """Stop serving and close the store it reads. Safe twice."""
        self._server.shutdown(_START_TIMEOUT_S)
        self.app.source.close()
