"""The auth callout: people log in to NATS with a ticket from ``corral authd`` (``app.py``)."""
