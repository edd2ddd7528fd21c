"""Process environment for the platform, applied before MLflow, Prefect or Optuna is imported.

:func:`configure_environment` (idempotent) runs in two places: on import of
:mod:`tasks.offline`, which every module that imports one of those libraries imports first
(``tests/test_layout.py`` holds that), and in the command line's ``main`` before anything loads.
Importing the ``tasks`` or ``flows`` package alone changes nothing in the process.

Nothing may reach the network at run time, so telemetry and analytics are forced off. Settings
of ``mlflow.env`` (the embedded tracking defaults) fill what the environment leaves unset;
Prefect's home defaults to ``$NLLAB_HOME/prefect`` (the home made private first), and MLflow's
and Prefect's logs keep to warnings, without the notices a user cannot act on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from dotenv import dotenv_values

#: Telemetry switches: forced, because the platform promises to stay offline.
_OFFLINE = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    "HF_HUB_OFFLINE": "1",
}

#: The settings file shipped at the top of the repository (embedded tracking defaults).
MLFLOW_ENV_FILE = Path(__file__).resolve().parent.parent / "mlflow.env"


def home_folder() -> Path:
    """The platform's home (``$NLLAB_HOME``, else ``~/.nllab``), standard library only."""
    # Mirrors datasets.data_home() without importing the data stack this early.
    home = os.environ.get("NLLAB_HOME")
    return Path(home).expanduser().resolve() if home else Path.home() / ".nllab"


class _NoServerHowTo(logging.Filter):
    """Prefect's notice that it starts a temporary server, without the link to its how-to on
    running a dedicated one: the README says when and how to run one (``nllab serve``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith("Starting temporary server"):
            record.msg = record.msg.split("\n", 1)[0]
        return True


_SERVER_NOTICE = _NoServerHowTo()


class _NoDrainProgress(logging.Filter):
    """Prefect's events worker counting down the events it still sends while the process
    exits ("Still processing items: N items remaining..."): after a command's last line (an
    interrupted run's included) it says nothing a user can act on. Its other warnings stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("Still processing"))


_DRAIN_PROGRESS = _NoDrainProgress()


def configure_environment() -> None:
    """Apply offline switches, ``mlflow.env`` (environment variables win) and Prefect defaults."""
    os.environ.update(_OFFLINE)
    env_file = Path(os.environ.get("NLLAB_MLFLOW_ENV", MLFLOW_ENV_FILE))
    if env_file.is_file():
        # Same as load_dotenv(override=False), but blank values mean "use the embedded default".
        for key, value in dotenv_values(env_file).items():
            if value and key not in os.environ:
                os.environ[key] = value
    os.environ.setdefault("PREFECT_HOME", str(home_folder() / "prefect"))
    # Prefect creates only the last folder level; a fresh NLLAB_HOME needs its parents too,
    # and is made private first (its stores and logs are nobody else's).
    try:
        prefect = Path(os.environ["PREFECT_HOME"]).expanduser()
        if home_folder() in prefect.resolve().parents:
            from datasets import create_home

            create_home()
        prefect.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # Prefect itself then reports the unusable folder
    # The temporary server's start timeout, when not set, grows with the machine's load
    # (flows.runtime.prefect_server.startup_timeout).
    # The ephemeral server's log chatter goes to the same terminal as the progress bars.
    os.environ.setdefault("PREFECT_LOGGING_SERVER_LEVEL", "WARNING")
    # One progress bar per artifact upload would drown the training progress bars.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's INFO lines (creating the store's tables, validating a model's input example)
    # are bookkeeping a user cannot act on; its warnings and errors still show.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # With a tracking server, MLflow prints "🏃 View run … at: URL" for every run that ends
    # (hundreds in a benchmark); the command names the UI once.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # Prefect logs the notice on its root logger, which its logging setup keeps filters on.
    prefect_logger = logging.getLogger("prefect")
    if _SERVER_NOTICE not in prefect_logger.filters:
        prefect_logger.addFilter(_SERVER_NOTICE)
    # Prefect's queue services log under their class names, outside its "prefect" tree.
    events_logger = logging.getLogger("EventsWorker")
    if _DRAIN_PROGRESS not in events_logger.filters:
        events_logger.addFilter(_DRAIN_PROGRESS)
