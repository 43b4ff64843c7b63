"""What the system says about itself: Prometheus metrics and OpenTelemetry spans."""
