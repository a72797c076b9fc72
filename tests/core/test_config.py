"""Config: one list of settings; the `serve`/`db` options, their environment variables and
validation come from it."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import fields

import pytest

from exchange_broker.cli import build_parser
from exchange_broker.config import Config, add_arguments, env_of, flag_of
from exchange_broker.server.clock import LoopClock


def _serve_options() -> dict:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    return serve._option_string_actions  # noqa: SLF001


def test_every_field_is_a_serve_option_whose_help_names_its_environment_variable():
    options = _serve_options()
    for f in fields(Config):
        action = options[flag_of(f.name)]
        assert action.dest == f.name
        assert env_of(f.name) in action.help


def test_without_environment_the_options_default_to_the_dataclass():
    p = argparse.ArgumentParser()
    add_arguments(p, environ={})
    assert Config.from_namespace(p.parse_args([])) == Config()


def test_environment_sets_the_default_and_the_command_line_wins():
    p = argparse.ArgumentParser()
    add_arguments(p, environ={"EXCHANGE_BROKER_PORT": "5999", "EXCHANGE_BROKER_IN_MEMORY": "yes",
                              "EXCHANGE_BROKER_HANDSHAKE_TIMEOUT": "2.5"})
    args = p.parse_args([])
    assert (args.port, args.in_memory, args.handshake_timeout) == (5999, True, 2.5)
    assert p.parse_args(["--port", "6000"]).port == 6000
    bad = argparse.ArgumentParser()
    add_arguments(bad, environ={"EXCHANGE_BROKER_PORT": "abc"})
    with pytest.raises(SystemExit):
        bad.parse_args([])


@pytest.mark.parametrize("kwargs, flag", [
    ({"port": 70000}, "--port"), ({"admin_port": -1}, "--admin-port"), ({"frame_max": 100}, "--frame-max"),
    ({"tls_cert": "c.pem"}, "--tls-key"), ({"tls_cert": "c", "tls_key": "k", "tls_verify_peer": True}, "--tls-ca"),
    ({"sqlite_synchronous": "SOMETIMES"}, "--sqlite-synchronous"),
    ({"memory_high_watermark": "lots"}, "--memory-high-watermark"),
])
def test_invalid_settings_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        Config(**kwargs)


def test_derived_settings(tmp_path):
    config = Config(data_dir=str(tmp_path), channel_max=100, max_channels_per_connection=16)
    assert config.limits == {"heartbeat": 60, "frame_max": 131072, "channel_max": 16,
                             "max_message_size": 128 * 1024 * 1024}
    assert config.store_url == f"sqlite:///{tmp_path / 'broker.db'}"
    assert config.disk_watch_dir == str(tmp_path)
    assert Config(database_url="postgresql+psycopg://h/db").store_url == "postgresql+psycopg://h/db"
    assert Config(in_memory=True).disk_watch_dir is None
    assert Config().tls is None
    tls = Config(tls_cert="c", tls_key="k", tls_port=0).tls
    assert (tls.certfile, tls.keyfile, tls.port) == ("c", "k", 0)
    assert Config(host="10.0.0.1").admin_listen_host == "10.0.0.1"


def test_loop_clock_runs_on_its_loop():
    loop = asyncio.new_event_loop()
    try:
        clock = LoopClock(loop)
        ran = []
        clock.call_soon(ran.append, 1)
        clock.call_later(0.01, ran.append, 2)
        handle = clock.call_later(0.01, ran.append, 3)
        handle.cancel()
        loop.run_until_complete(asyncio.sleep(0.05))
        assert ran == [1, 2]
        assert clock.time() == pytest.approx(loop.time(), abs=1)
    finally:
        loop.close()
