"""What the scheduler shows of itself: counts of tasks by tenant, type and state, lateness
histograms, metrics for Prometheus, and the status they make up."""
