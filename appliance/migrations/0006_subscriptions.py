"""Subscriptions (issue 16): the export drains a subscription of its own, and tokens may be
scoped to subscriptions.

A channel that exists already keeps exporting what it exported before, the `default`
subscription (the one queue it had); a channel created from now on exports through
`export`, so that HTTP consumers (who take from `default` unless they name another) and
the export each see every event.
"""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("appliance", "0005_channel_owned_dirs_and_key_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="channel",
            name="export_subscription",
            field=models.CharField(default="default", max_length=64),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="channel",
            name="export_subscription",
            field=models.CharField(
                default="export", max_length=64,
                help_text="The subscription the export drains (made at earliest when "
                "missing): its own, so that HTTP consumers and the export each see every "
                "event; 'default' shares the HTTP consumers' queue."),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="subscriptions",
            field=models.JSONField(
                blank=True, default=list,
                help_text="The subscriptions its takes may name (empty: any); admin tokens "
                "any."),
        ),
    ]
