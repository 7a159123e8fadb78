-- Title: Spans and LLM calls
-- Visualization: timeseries
-- Columns: time, spans, llm_calls
-- Unit: short
-- Width: 12
-- Description: Spans stored and model calls made per time bucket. A span retried by an exporter counts once (spans view); an LLM call is an LLM span that is not a framework wrapper around the SDK call (llm_calls view).
-- Every LLM call is a span, so the span buckets cover all call buckets and a LEFT JOIN loses nothing.
WITH span_counts AS (
    SELECT time_bucket(to_milliseconds($__interval_ms), start_time) AS time, count(*) AS spans
    FROM spans
    WHERE $__timeFilter(start_time)
    GROUP BY 1
), call_counts AS (
    SELECT time_bucket(to_milliseconds($__interval_ms), start_time) AS time, count(*) AS llm_calls
    FROM llm_calls
    WHERE $__timeFilter(start_time)
    GROUP BY 1
)
SELECT time, spans, coalesce(llm_calls, 0) AS llm_calls
FROM span_counts LEFT JOIN call_counts USING (time)
ORDER BY time
