"""memwatch.Client against the real daemon: attach, directives, ack, progress; the environment
`memwatch launch` sets, and `MEMWATCH_JOB` set by hand, which names a job and never means "launched";
the HTTP API when there is no socket; a daemon that is down; a refusal, which each integration raises
before its first step."""

import importlib.util
import json
import logging
import os
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
    # Launch's marker: the job and its children (a torchrun rank, a DataLoader worker) are launched;
    # the same process tree with only MEMWATCH_JOB is not.
    assert found["launched"] is True and found["child_launched"] is True, found
    assert found["child_without_marker_launched"] is False, found


def launched_env(monkeypatch, d, job):
    """The environment `memwatch launch` would set, its marker naming an ancestor of this process."""
    monkeypatch.setenv("MEMWATCH_LAUNCHED", str(os.getppid()))
    monkeypatch.setenv("MEMWATCH_JOB", job)
    monkeypatch.setenv("MEMWATCH_SOCKET", str(d.socket))
    monkeypatch.setenv("MEMWATCH_URL", d.url)
    monkeypatch.delenv("MEMWATCH_TOKEN_FILE", raising=False)


def test_MEMWATCH_JOB_names_the_job_and_never_means_launched(daemon_factory, tmp_path, sleeper, monkeypatch):
    d = daemon_factory()
    monkeypatch.delenv("MEMWATCH_LAUNCHED", raising=False)
    monkeypatch.setenv("MEMWATCH_JOB", "by-hand")
    c = memwatch.Client(config_file=config(tmp_path), keys=KEYS, socket_path=str(d.socket), pid=sleeper)
    assert c.name == "by-hand" and not c.launched and not c.attached
    assert c.attach() and c.token
    job = d.job("by-hand")
    assert job is not None and job["pid"] == sleeper and job["config"]["knobs"]["micro_batch"] == 8, job
    assert c.directives(force=True) is not None
    # The marker counts only when it names an ancestor of this process.
    for marker, launched in [
        (str(os.getppid()), True),
        (str(sleeper), False),
        ("", False),
        ("yes", False),
        ("container", True),
    ]:
        monkeypatch.setenv("MEMWATCH_LAUNCHED", marker)
        assert memwatch.Client().launched is launched, marker


def _first_step(integration, client):
    """What `integration` does at its start, before the first step."""
    if integration == "client":
        client.attach()
    elif integration == "pytorch":
        import memwatch.pytorch

        next(iter(memwatch.pytorch.AdaptiveLoader(list(range(8)), client, batch_size=2)))
    elif integration == "hf":
        import memwatch.hf

        memwatch.hf.MemwatchCallback(client).on_train_begin(None, None, None)
    elif integration == "lightning":
        import memwatch.lightning

        memwatch.lightning.MemwatchCallback(client).setup(None, None, "fit")
    elif integration == "accelerate":
        import memwatch.accelerate

        memwatch.accelerate.gradient_accumulation_plugin(client)


INTEGRATIONS = {"client": "memwatch", "pytorch": "torch", "hf": "transformers", "lightning": "lightning",
                "accelerate": "accelerate"}


@pytest.mark.parametrize("integration", list(INTEGRATIONS))
def test_a_launch_marker_with_no_job_attached_fails_at_the_first_step(daemon_factory, monkeypatch, integration):
    if importlib.util.find_spec(INTEGRATIONS[integration]) is None:
        pytest.skip(f"{INTEGRATIONS[integration]} is not installed")
    d = daemon_factory()
    launched_env(monkeypatch, d, "ghost")
    c = memwatch.Client()
    assert c.launched
    with pytest.raises(memwatch.MemwatchError, match="no attached job named 'ghost'.*MEMWATCH_LAUNCHED says"):
        _first_step(integration, c)


def test_a_wrong_token_fails_loudly_and_the_right_one_is_taken(daemon_factory, tmp_path, sleeper, monkeypatch):
    d = daemon_factory()
    attached = d.control({"cmd": "attach", "pid": sleeper, "name": "tok", "config_file": config(tmp_path),
                          "profile": "generic", "keys": KEYS})
    assert attached["ok"], attached
    launched_env(monkeypatch, d, "tok")
    # No socket in reach (a container, say): the HTTP API, where only the token says who is asking.
    monkeypatch.setenv("MEMWATCH_SOCKET", str(tmp_path / "none.sock"))
    token_file = tmp_path / "token"
    token_file.write_text("0" * 32 + "\n")
    monkeypatch.setenv("MEMWATCH_TOKEN_FILE", str(token_file))
    with pytest.raises(memwatch.MemwatchError, match="refused this client for job 'tok'.*403.*MEMWATCH_TOKEN_FILE"):
        memwatch.Client().attach()
    token_file.write_text(attached["token"] + "\n")
    c = memwatch.Client()
    assert c.attach()
    d_ = c.directives()
    assert d_ is not None and d_.knobs["micro_batch"] == 8
    assert c.progress(0, 5)
    assert d.job("tok")["config"]["progress"]["step"] == 5


def test_a_launched_job_attached_without_its_config_file_is_a_mistake_too(daemon_factory, tmp_path, sleeper, monkeypatch):
    d = daemon_factory()
    assert d.control({"cmd": "attach", "pid": sleeper, "name": "bare"})["ok"]
    launched_env(monkeypatch, d, "bare")
    # Watched and paused only, as launched: the client takes it.
    assert memwatch.Client().attach()
    with pytest.raises(memwatch.MemwatchError, match="attached without a config file.*memwatch launch --config-file"):
        memwatch.Client(config_file=config(tmp_path), keys=KEYS).attach()


def test_a_launched_client_whose_daemon_is_down_warns_once_and_trains_on(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MEMWATCH_LAUNCHED", str(os.getppid()))
    monkeypatch.setenv("MEMWATCH_JOB", "down")
    c = memwatch.Client(socket_path=str(tmp_path / "none.sock"), url="http://127.0.0.1:9", retry_seconds=0)
    assert c.launched
    with caplog.at_level(logging.WARNING, logger="memwatch"):
        assert c.attach() is False
        for step in range(20):
            assert c.directives(force=True) is None
            assert c.progress(0, step) is False
    warnings = [r for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
