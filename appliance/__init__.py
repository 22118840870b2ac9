"""The Weir appliance: the Django project and app around channel_engine."""
