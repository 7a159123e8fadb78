-- Title: Merge rate
-- Visualization: timeseries
-- Columns: time, merge_rate
-- Unit: percentunit
-- Width: 8
-- Description: Share of boundaries between consecutive LLM calls whose next prompt extends the previous prompt and completion token for token, so the chain trains as one sequence (merge_diagnostics).
SELECT time_bucket(to_milliseconds($__interval_ms), time) AS time,
       avg(merged::INTEGER) AS merge_rate
FROM merge_diagnostics
WHERE $__timeFilter(time)
GROUP BY 1
ORDER BY 1
