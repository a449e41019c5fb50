"""The Kafka harness (tests/support/kafka.py) against real brokers: one KRaft node that keeps an
acknowledged message through a SIGKILL, three that keep taking ``acks=all`` writes with one node
down, and nothing of either left behind afterwards. Kafka's own command-line tools do the
producing and consuming, from the broker's classpath."""

from __future__ import annotations

import secrets

import pytest

from tests.support.kafka import (
    TOPIC_COMMAND,
    KafkaCluster,
    kafka_one_node,  # noqa: F401 - the module's single node (a fixture)
    kafka_three_nodes,  # noqa: F401 - the module's three nodes (a fixture)
    running_kafka,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow]


def topic_name() -> str:
    return f"harness-{secrets.token_hex(4)}"


def test_a_node_takes_a_topic_and_gives_back_what_was_produced(
        kafka_one_node: KafkaCluster) -> None:  # noqa: F811 - the imported fixture
    topic = topic_name()
    kafka_one_node.create_topic(topic)
    kafka_one_node.produce(topic, ["first", "second"])

    assert kafka_one_node.consume(topic, 2) == ["first", "second"]


def test_an_acknowledged_message_survives_a_sigkill_and_a_restart(
        kafka_one_node: KafkaCluster) -> None:  # noqa: F811
    topic = topic_name()
    kafka_one_node.create_topic(topic)
    kafka_one_node.produce(topic, ["before the crash"])
    node = kafka_one_node.nodes[0]

    node.kill()
    assert not node.is_running()
    node.start()

    assert kafka_one_node.consume(topic, 1) == ["before the crash"]


def test_three_nodes_take_acks_all_writes_with_their_partition_leader_down(
        kafka_three_nodes: KafkaCluster) -> None:  # noqa: F811
    cluster = kafka_three_nodes
    topic = topic_name()
    cluster.create_topic(topic)
    described = cluster.tool(TOPIC_COMMAND, "--bootstrap-server", cluster.bootstrap, "--describe", "--topic", topic)
    assert "min.insync.replicas=2" in described.stdout, described.stdout
    [partition] = cluster.describe_topic(topic)
    assert sorted(partition.replicas) == sorted(partition.isr) == [1, 2, 3]
    assert partition.leader is not None
    cluster.produce(topic, ["all three up"])

    # The leader, the hardest node to lose: the controller must fence it and elect another
    # leader from the two in-sync replicas before the write can be acknowledged.
    lost = cluster.node(partition.leader)
    lost.kill()
    cluster.produce(topic, ["one node down"])
    [partition] = cluster.describe_topic(topic)
    assert partition.leader not in (None, lost.node_id)
    assert sorted(partition.isr) == sorted(set(partition.replicas) - {lost.node_id})

    lost.start()
    # Back in the ISR only once it has caught up with the leader, both writes included.
    wait_until(lambda: len(cluster.describe_topic(topic)[0].isr) == 3, timeout=60, interval=0.5,
               what=f"node {lost.node_id} rejoins the ISR of {topic}", details=cluster.logs)
    assert cluster.consume(topic, 2) == ["all three up", "one node down"]


def test_nothing_is_left_behind_when_a_test_fails() -> None:
    with pytest.raises(RuntimeError, match="the test failed"):
        with running_kafka(1) as cluster:
            assert cluster.nodes[0].is_running()
            assert cluster.leftovers(), "a running node names its folder"
            raise RuntimeError("the test failed")

    assert cluster.leftovers() == []
