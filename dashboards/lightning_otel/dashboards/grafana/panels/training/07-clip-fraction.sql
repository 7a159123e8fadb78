-- Title: Clip fraction
-- Visualization: trend
-- Columns: step, clip_fraction
-- X: step
-- Unit: percentunit
-- Width: 8
-- Description: Weighted share of generated tokens whose probability ratio to the behaviour policy was clipped, per optimizer step.
SELECT step, clip_fraction
FROM train_steps
WHERE $__timeFilter(time)
ORDER BY step
