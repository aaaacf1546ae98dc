"""The worker of :mod:`tests.weather_app`: ``arq tests.weather_worker.WorkerSettings``."""

from tests.weather_app import plugin

WorkerSettings = plugin.worker_settings()
