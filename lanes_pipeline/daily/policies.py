"""Retry policy of every step that calls a lane, in any job (daily_lanes, the UI's asset backfills, a single
materialization): a lane that restarts or times out after the clients' own retries gets the step tried
again later, with exponential backoff and jitter. Answers already cached or memoized are not asked again."""

from dagster import Backoff, Jitter, RetryPolicy

LANE_RETRY = RetryPolicy(max_retries=2, delay=30, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)
