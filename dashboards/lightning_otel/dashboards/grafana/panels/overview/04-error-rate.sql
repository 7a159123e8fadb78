-- Title: Error rate
-- Visualization: timeseries
-- Columns: time, span_error_rate, failed_rollout_rate
-- Unit: percentunit
-- Width: 8
-- Description: Share of spans that ended with ERROR status, and share of rollouts whose root span did, per time bucket of their start.
-- Rollouts are bucketed by their first span's start, so a rollout counts once even if it spans buckets.
WITH span_rate AS (
    SELECT time_bucket(to_milliseconds($__interval_ms), start_time) AS time,
           avg((status_code = 'ERROR')::INTEGER) AS span_error_rate
    FROM spans
    WHERE $__timeFilter(start_time)
    GROUP BY 1
), rollout_rate AS (
    SELECT time_bucket(to_milliseconds($__interval_ms), start_time) AS time,
           avg(failed::INTEGER) AS failed_rollout_rate
    FROM rollouts
    WHERE $__timeFilter(start_time)
    GROUP BY 1
)
SELECT time, span_error_rate, failed_rollout_rate
FROM span_rate LEFT JOIN rollout_rate USING (time)
ORDER BY time
