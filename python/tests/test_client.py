"""memwatch.Client against the real daemon: attach, directives, ack, progress; the environment
`memwatch launch` sets; the HTTP API when there is no socket; a daemon that is down; a refusal."""

import json
import logging
import re
import subprocess

import pytest

import memwatch
from conftest import BIN, REPO, TRAINERS, python


def config(tmp_path, micro=8):
    cfg = tmp_path / "train.json"
    cfg.write_text(json.dumps({"train": {"micro_batch": micro, "accumulation": 2}}))
    return str(cfg)


KEYS = ["batch=train.micro_batch", "accumulation=train.accumulation"]


def test_the_version_is_the_crates():
    cargo = (REPO / "Cargo.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', cargo, re.M).group(1)
    assert memwatch.__version__ == version


def test_a_daemon_that_is_down_is_warned_about_once_and_training_goes_on(tmp_path, caplog):
    c = memwatch.Client(
        "down", config_file=config(tmp_path), keys=KEYS, socket_path=str(tmp_path / "none.sock"),
        url="http://127.0.0.1:9", retry_seconds=0,
    )
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        assert c.attach() is False
        for step in range(50):
            assert c.directives(force=True) is None
            assert c.progress(0, step) is False
            assert c.ack(1, 0) is False
    warnings = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]


@pytest.fixture
def sleeper():
    """A process to attach (the test itself is the daemon's parent, which memwatch refuses)."""
    p = subprocess.Popen(["sleep", "600"])
    yield p.pid
    p.kill()
    p.wait()


def test_a_refused_attach_says_why(daemon_factory, tmp_path, sleeper):
    d = daemon_factory()
    c = memwatch.Client(
        "bad", config_file=str(tmp_path / "missing.json"), keys=KEYS, socket_path=str(d.socket), pid=sleeper
    )
    with pytest.raises(memwatch.MemwatchError, match="missing.json"):
        c.attach()


def test_the_protocol_over_the_socket_and_over_http(daemon_factory, tmp_path, sleeper):
    d = daemon_factory()
    c = memwatch.Client("proto", config_file=config(tmp_path), keys=KEYS, socket_path=str(d.socket), pid=sleeper)
    assert c.attach() and c.token
    got = c.directives(force=True)
    assert got is not None and not got.pending and got.knobs == {"micro_batch": 8, "accumulation": 2}
    assert c.progress(0, 3, loss=1.5, running={"micro_batch": 8, "accumulation": 2, "workers": None})
    job = d.job("proto")
    assert job["config"]["progress"]["step"] == 3
    assert job["config"]["progress"]["running"] == {"micro_batch": 8, "accumulation": 2}
    # No socket (a trainer in a container, say): the HTTP API with the token.
    h = memwatch.Client("proto", socket_path=str(tmp_path / "none.sock"), url=d.url, token=c.token)
    h.attached = True
    got = h.directives(force=True)
    assert got is not None and got.knobs["micro_batch"] == 8
    assert h.progress(1, 7)
    assert d.job("proto")["config"]["progress"]["step"] == 7
    # A wrong token is refused, logged, and does not raise.
    w = memwatch.Client("proto", socket_path=str(tmp_path / "none.sock"), url=d.url, token="0" * 32)
    w.attached = True
    assert w.directives(force=True) is None


def test_a_launched_job_finds_everything_in_its_environment(daemon_factory, tmp_path):
    d = daemon_factory()
    cfg = config(tmp_path)
    out = subprocess.run(
        [str(BIN), "launch", "--name", "launched", "--config-file", cfg, "--profile", "generic",
         *[a for k in KEYS for a in ("--key", k)], "--socket", str(d.socket), "--",
         python(), str(TRAINERS / "launched.py")],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["name"] == "launched" and found["token"] and found["directives"] and found["progress"], found
    assert found["knobs"] == {"micro_batch": 8, "accumulation": 2}
    assert found["socket"] == str(d.socket) and found["resumed"] is False
