"""Importing this module applies the platform's settings for the orchestration libraries
(:func:`tasks.configure_environment`: telemetry off, nothing reaching the network, Prefect's home,
the embedded MLflow defaults) before they load. Every module that imports Prefect, MLflow or
Optuna imports it first (``tests/test_layout.py`` holds that), so the settings precede the
libraries however the platform is entered (the command line, a flow started from Python, a
worker); importing ``tasks`` or ``flows`` alone changes nothing in the process."""

from tasks._env import configure_environment

configure_environment()
