"""The rank's environment (nodeagent/src/jobs/launch.rs, rank_env) and the
standalone fallback."""

import pytest

from railguard import Delivery, EnvError, JobClient, JobEnv, NotUnderRailguard, NullClient

AGENT = {
    "RAILGUARD_AGENT_SOCKET": "/run/railguard/agent.sock",
    "RAILGUARD_JOB": "train",
    "RAILGUARD_INCARNATION": "3",
    "RAILGUARD_RANK": "1",
    "RAILGUARD_WORLD_SIZE": "2",
    "RAILGUARD_PEERS": "h0=10.10.0.1,10.11.0.1;h1=10.10.0.2,10.11.0.2",
    "RAILGUARD_NICS": "rail0=10.10.0.2,rail1=",
    "RAILGUARD_PORT": "29500",
    "RAILGUARD_CHECKPOINT_DIR": "/data/ckpt",
    "RAILGUARD_CHECKPOINT_EVERY": "50",
    "RAILGUARD_RESUME_STEP": "0",
}


def test_every_variable_the_agent_sets_is_read():
    e = JobEnv.from_environ(AGENT, require=True)
    assert e.under_railguard
    assert (e.job, e.incarnation, e.rank, e.world_size, e.local_rank) == ("train", 3, 1, 2, 0)
    assert e.socket_path == "/run/railguard/agent.sock"
    assert [p.host for p in e.peers] == ["h0", "h1"]
    assert e.peers[1].addrs == ("10.10.0.2", "10.11.0.2")
    assert e.nic_names == ("rail0", "rail1")
    assert e.nics[1].addr == ""
    assert (e.port, e.checkpoint_dir, e.checkpoint_every, e.resume_step) == (29500, "/data/ckpt", 50, 0)
    assert e.master_addr() == "10.10.0.1"


def test_standalone_under_torchrun_or_alone():
    e = JobEnv.from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert not e.under_railguard
    assert (e.rank, e.world_size, e.local_rank, e.resume_step) == (3, 4, 1, None)
    alone = JobEnv.from_environ({})
    assert (alone.rank, alone.world_size, alone.job) == (0, 1, None)
    c = JobClient.from_env({})
    assert isinstance(c, NullClient) and not c.active
    assert c.poll_order() is None
    assert c.checkpointed(3) is Delivery.STANDALONE
    assert c.order_done(1, True) is Delivery.STANDALONE
    c.close()


def test_required_outside_railguard_says_so():
    with pytest.raises(NotUnderRailguard, match="RAILGUARD_AGENT_SOCKET is not set"):
        JobEnv.from_environ({"RANK": "0"}, require=True)
    with pytest.raises(NotUnderRailguard):
        JobClient.from_env({}, require=True)


@pytest.mark.parametrize(
    "change,text",
    [
        ({"RAILGUARD_RANK": "x"}, "RAILGUARD_RANK='x' is not a non-negative integer"),
        ({"RAILGUARD_RANK": "-1"}, "not a non-negative integer"),
        ({"RAILGUARD_RANK": "2"}, "rank 2 is outside a world of 2"),
        ({"RANK": "0"}, "RAILGUARD_RANK=1 but RANK=0"),
        ({"RAILGUARD_JOB": ""}, "RAILGUARD_JOB is not"),
        ({"RAILGUARD_JOB": "my job"}, "whitespace"),
        ({"RAILGUARD_PEERS": "h0=1.1.1.1"}, "names 1 ranks for a world of 2"),
        ({"RAILGUARD_PEERS": "=1.1.1.1;h1=2"}, "is not host=addr"),
        ({"RAILGUARD_PORT": "70000"}, "is not a port"),
        ({"RAILGUARD_WORLD_SIZE": "0"}, "at least 1"),
    ],
)
def test_bad_values_are_clear_errors(change, text):
    env = dict(AGENT)
    env.update(change)
    with pytest.raises(EnvError) as e:
        JobEnv.from_environ(env)
    assert text in str(e.value)


def test_matching_torchrun_variables_are_fine():
    env = dict(AGENT, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    e = JobEnv.from_environ(env)
    assert (e.rank, e.world_size, e.local_rank) == (1, 2, 1)
