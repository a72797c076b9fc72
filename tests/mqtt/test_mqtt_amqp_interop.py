"""MQTT and AMQP 0-9-1 on one broker, through amq.topic as RabbitMQ maps them: an MQTT publish
reaches an AMQP queue bound with the dotted routing key (QoS 1 persistent, the QoS in a header),
and an AMQP publish reaches an MQTT subscription; MQTT subscriptions are queues AMQP sees."""

from __future__ import annotations

import pika
from eb_support import pika_connect, uniq, wait_until


def test_mqtt_publish_reaches_an_amqp_queue(paho, mqtt_broker):
    conn = pika_connect(mqtt_broker.port)
    try:
        ch = conn.channel()
        q = uniq("readings")
        ch.queue_declare(q)
        ch.queue_bind(q, "amq.topic", "plant.*.temp")
        paho("sensor").publish("plant/7/temp", b"21.5", qos=1)
        got = wait_until(lambda: ch.basic_get(q, auto_ack=True), 10)
        method, props, body = got
        assert (method.exchange, method.routing_key, body) == ("amq.topic", "plant.7.temp", b"21.5")
        assert props.delivery_mode == 2 and props.headers["x-mqtt-publish-qos"] == 1
    finally:
        conn.close()


def test_amqp_publish_reaches_an_mqtt_subscription(paho, mqtt_broker):
    dev = paho("device-9")
    dev.subscribe("commands/device-9/#", 1)
    conn = pika_connect(mqtt_broker.port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "commands.device-9.reboot", b"now",
                         pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("amq.topic", "commands.device-9.ping", b"transient")
        got = dev.wait_messages(2)
        assert sorted((m.topic, m.payload, m.qos) for m in got) == [
            ("commands/device-9/ping", b"transient", 0), ("commands/device-9/reboot", b"now", 1)]
        ok = ch.queue_declare("mqtt-subscription-device-9qos1", passive=True)
        assert ok.method.consumer_count == 1
    finally:
        conn.close()
