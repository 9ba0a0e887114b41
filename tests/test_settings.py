"""Settings refuse what cannot work, naming the field: a Cluster broker, a Cluster or Sentinel store
with no broker of its own, a scheme nobody speaks."""

import pytest
from pydantic import ValidationError

from fenced_core.settings import Settings, describe


@pytest.mark.parametrize("url", ["redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
                                 "redis+sentinel://127.0.0.1:26379/fenced/0"])
def test_a_cluster_or_sentinel_store_is_accepted_with_a_broker_of_its_own(url):
    settings = Settings(redis_url=url, broker_url="redis://127.0.0.1:6379/0")
    assert settings.redis_url == url
    assert settings.effective_broker_url == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize("url", ["redis+cluster://127.0.0.1:7000", "redis+sentinel://127.0.0.1:26379/fenced/0"])
def test_a_cluster_or_sentinel_store_needs_a_broker_url(url):
    with pytest.raises(ValidationError, match="broker_url: FENCED_REDIS_URL names a Redis Cluster or Sentinel"):
        Settings(redis_url=url, broker_url="")


def test_the_broker_cannot_be_a_cluster():
    with pytest.raises(ValidationError, match=r"broker_url\n.*kombu's Redis transport has no Cluster support"):
        Settings(broker_url="redis+cluster://127.0.0.1:7000")


def test_unknown_schemes_are_refused_naming_the_field():
    with pytest.raises(ValidationError, match=r"redis_url\n.*accepted: redis://"):
        Settings(redis_url="http://127.0.0.1:6379")
    with pytest.raises(ValidationError, match=r"broker_url\n.*accepted: redis://"):
        Settings(broker_url="amqp://127.0.0.1")


def test_a_check_across_settings_reads_as_one_line_without_the_input_dump():
    with pytest.raises(ValidationError) as caught:
        Settings(redis_url="redis+cluster://127.0.0.1:7000", broker_url="")
    line = describe(caught.value)
    assert line.startswith("broker_url: FENCED_REDIS_URL names a Redis Cluster"), line
    assert "{" not in line and "FENCED_=" not in line, line


def test_the_log_level_is_read_in_any_case_and_a_wrong_one_is_refused_naming_the_field():
    assert Settings(log_level=" WARNING ").log_level == "warning"
    assert Settings().log_level == "info"
    with pytest.raises(ValidationError, match=r"log_level\n.*'debug', 'info', 'warning' or 'error'"):
        Settings(log_level="loud")
    with pytest.raises(ValidationError) as caught:  # quoted as written, not as lowered
        Settings(log_level=" LOUD")
    assert describe(caught.value) == "FENCED_LOG_LEVEL=' LOUD': Input should be 'debug', 'info', 'warning' or 'error'"


_LOG_BOTH = ("import structlog, tasks.celery_app; log = structlog.get_logger('t'); "
             "log.info('an_info_line'); log.warning('a_warning_line')")


@pytest.mark.parametrize("level, info_shown", [("info", True), ("warning", False), ("", True)])
def test_fenced_log_level_decides_which_of_a_process_s_lines_are_written(level, info_shown):
    """What a worker process does at import (tasks.celery_app): FENCED_LOG_LEVEL=warning silences the
    step's info lines (three a step) and keeps warnings; unset, info as before."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "FENCED_LOG_LEVEL"}
    if level:
        env["FENCED_LOG_LEVEL"] = level
    out = subprocess.run([sys.executable, "-c", _LOG_BOTH], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout + out.stderr
    assert "event='a_warning_line'" in lines
    assert ("event='an_info_line'" in lines) is info_shown, lines
