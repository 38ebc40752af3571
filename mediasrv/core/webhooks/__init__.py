"""Signed webhooks (issue 28): endpoints, events recorded with their change, delivery at least once.

``destinations`` decides where a webhook may go, ``signing`` signs as Standard Webhooks says,
``sender`` makes one attempt, ``relay`` claims due deliveries and retries them, ``service`` is
what the HTTP routes call.
"""
