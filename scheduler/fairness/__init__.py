"""Fairness between tenants: plan weights, concurrency caps and rate limits at release time."""
