"""The admin HTTP endpoint: health, readiness, metrics, the status API and the dashboard."""
