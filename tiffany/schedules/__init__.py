"""Schedules: cron and interval specs, their rows in the store, and the runner that fires them."""
