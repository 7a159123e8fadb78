-- Title: LLM latency p50 / p95 by model
-- Visualization: timeseries
-- Columns: time, model_name, p50_ms, p95_ms
-- Unit: ms
-- Width: 12
-- Description: Median and 95th percentile duration of model calls per time bucket, one pair of series per model.
-- Long format (one row per bucket and model): the plugin's time-series format turns model_name into a
-- label, so each model gets its own p50 and p95 series without listing the models here.
SELECT time_bucket(to_milliseconds($__interval_ms), start_time) AS time,
       coalesce(model_name, 'unknown') AS model_name,
       quantile_cont(duration_ms, 0.5) AS p50_ms,
       quantile_cont(duration_ms, 0.95) AS p95_ms
FROM llm_calls
WHERE $__timeFilter(start_time)
GROUP BY 1, 2
ORDER BY 1, 2
