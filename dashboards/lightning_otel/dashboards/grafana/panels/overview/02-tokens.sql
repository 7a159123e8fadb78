-- Title: Tokens
-- Visualization: timeseries
-- Columns: time, prompt_tokens, completion_tokens
-- Unit: short
-- Width: 12
-- Description: Prompt and completion tokens of the model calls started in each time bucket (llm.token_count.* as reported by the instrumentor).
-- From llm_calls, not llm_spans: a framework wrapper repeats its inner call's counts.
SELECT time_bucket(to_milliseconds($__interval_ms), start_time) AS time,
       coalesce(sum(token_count_prompt), 0) AS prompt_tokens,
       coalesce(sum(token_count_completion), 0) AS completion_tokens
FROM llm_calls
WHERE $__timeFilter(start_time)
GROUP BY 1
ORDER BY 1
