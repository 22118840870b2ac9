"""The Kafka sink: forward a channel's subscription into a Kafka topic, exactly once, with
Kafka's transactions (job.py is the entry point and names the other modules).

Importing this package imports aiokafka's clients but no Django, Celery or Spark.
"""
