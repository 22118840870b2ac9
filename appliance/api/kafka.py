"""POST /api/v1/channels/{name}/kafka-runs — send to Kafka now: queue a run of the channel's
Kafka sink for the Kafka worker (appliance.kafka_sinks.queue_sink); what it sends shows in
the channel's recent_kafka_runs. 202 {"queued": true, "task_id"}; 200 {"queued": false,
"reason"} when its subscription holds nothing new; a channel without a Kafka
sink (no kafka_topic): 409 channel-conflict naming the field; the broker unreachable: 503
broker-unavailable, with Retry-After. Admin role, as export now.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.api.base import ApiView
from appliance.api.exports import NOW_RESPONSES, queue_unless_drained
from appliance.api.problems import Problem
from appliance.api.schema import errors
from appliance.kafka_sinks import queue_sink
from appliance.models import KafkaRun


class KafkaRunNowView(ApiView):
    """Queue a run of one channel's Kafka sink now."""

    role = "admin"
    fresh_row = True

    @extend_schema(operation_id="channel_kafka_run_now", request=None,
                   responses={**NOW_RESPONSES, **errors(404, 409, 503)})
    def post(self, request: Request, name: str) -> Response:
        """Send to Kafka now: queued for the Kafka worker (BrokerUnavailable: handler.py)."""
        if not self.row.kafka_topic:
            raise Problem(409, "channel-conflict", f"channel {name!r} has no Kafka sink: set "
                          "its kafka_topic first", field="kafka_topic")
        return queue_unless_drained(self.row, self.row.kafka_subscription, KafkaRun,
                                    queue_sink)
