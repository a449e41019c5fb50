"""What the backplane tells its operators about itself: traces (OpenTelemetry), metrics
(Prometheus, summed across processes) and structured logs. Below every other part: the event
log, delivery and recovery call into it; it imports none of them."""
