"""Resource alarms (memory high watermark, disk free limit): raised and cleared by the server's
resource monitor, they block and unblock the publishing connections (RabbitMQ's rabbit_alarm)."""

from __future__ import annotations

import logging

log = logging.getLogger("exchange_broker")


def set_alarm(broker, resource: str, on: bool, detail: str = "") -> None:
    """Raise or clear an alarm. While any is raised, every publishing connection is sent
    connection.blocked and is not read; consumers keep draining."""
    if on == (resource in broker.alarms):
        return
    if broker.events is not None:
        broker.events.alarm(resource, on)
    if on:
        broker.alarms[resource] = detail
        log.warning("%s alarm set (%s): blocking publishers", resource, detail)
        reason = broker.alarm_reason()
        for sess in list(broker.sessions):
            if sess.has_published:
                sess.block(reason)
    else:
        del broker.alarms[resource]
        log.warning("%s alarm cleared", resource)
        if not broker.alarms:
            for sess in list(broker.sessions):
                sess.unblock()
