-- Title: Samples per rollout
-- Visualization: barchart
-- Columns: samples, rollouts
-- X: samples
-- Width: 8
-- Description: How many rollouts became 1, 2, 3, ... training samples (a rollout whose calls do not merge into one token sequence becomes several), summed over the train steps in the time range.
-- samples_per_rollout is a histogram: element k (1-based subscript k) counts rollouts that became k samples.
-- samples is text so the bar chart treats it as a category, not a continuous axis.
WITH bins AS (
    SELECT generate_subscripts(samples_per_rollout, 1) AS k, unnest(samples_per_rollout) AS n
    FROM train_steps
    WHERE $__timeFilter(time)
)
SELECT k::VARCHAR AS samples, sum(n)::BIGINT AS rollouts
FROM bins
GROUP BY k
ORDER BY k
